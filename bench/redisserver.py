"""Experiment Q's broker: Debian's ``redis-server``, started by the bench, stopped by its PID.

Never the system service: each run gets its own process on 127.0.0.1, a free port and a
temporary directory, with ``appendonly yes`` and the ``appendfsync`` the row states
(``always``: every write command is on disk before its reply, as sqlq ``--sync full``
acknowledges; ``everysec``: up to a second lost on a crash, as ``--sync os`` leaves it to
the OS). ``kill`` is SIGKILL; ``start`` again reuses the directory and the port, so a
restarted broker replays its append-only file and the workers reconnect to the same URL.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO

from sqlq.bench.client.server import end_process, free_port

FSYNCS = ("always", "everysec")
READY_S = 10.0  # a redis-server that does not answer PING this long after spawn: an error


class RedisError(RuntimeError):
    """redis-server is missing, exited, or did not answer in time; the message has its log."""


def redis_version() -> str:
    """``7.0.15`` of ``Redis server v=7.0.15 sha=...``; empty when it is not installed."""
    exe = shutil.which("redis-server")
    if exe is None:
        return ""
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    return next((w[2:] for w in out.split() if w.startswith("v=")), "")


def _ping(port: int) -> bool:
    """One inline PING over a plain socket: no client library in the bench's own process."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """``with RedisServer("always") as r:`` a fresh redis-server at ``r.url``; removed after."""

    def __init__(self, appendfsync: str) -> None:
        if appendfsync not in FSYNCS:
            raise ValueError(f"appendfsync: one of {FSYNCS}, not {appendfsync!r}")
        exe = shutil.which("redis-server")
        if exe is None:
            raise RedisError("redis-server is not installed (apt-get install redis-server)")
        self.exe = exe
        self.appendfsync = appendfsync
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._tmp = tempfile.TemporaryDirectory(prefix="sqlq-q-redis-")
        self.dir = Path(self._tmp.name)
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "start() first"
        return self.proc.pid

    def start(self) -> RedisServer:
        """Spawn (or respawn on the same directory and port) and wait for PING."""
        self._log = open(self.dir / "redis.log", "ab")
        args = [
            self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
            "--appendonly", "yes", "--appendfsync", self.appendfsync,
            "--save", "",  # no RDB snapshots: the append-only file is the durability
            "--daemonize", "no", "--protected-mode", "yes", "--loglevel", "warning",
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RedisError(f"redis-server exited with {self.proc.returncode}:\n{self.log}")
            if _ping(self.port):
                return self
            time.sleep(0.01)
        self.kill()  # (not left running: ``with`` never reaches its exit)
        raise RedisError(f"redis-server did not answer PING within {READY_S}s:\n{self.log}")

    def kill(self) -> None:
        """SIGKILL, by its PID: a broker crash."""
        if self.proc is not None:
            end_process(self.proc, 9, 10.0)
        if self._log is not None:
            self._log.close()

    @property
    def log(self) -> str:
        path = self.dir / "redis.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.proc is not None:
            end_process(self.proc, 15, 10.0)  # SIGTERM: a clean stop, by its PID
        if self._log is not None:
            self._log.close()
        self._tmp.cleanup()
