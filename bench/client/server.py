"""A real ``sqlq serve`` subprocess on a free port: for the benchmark and the tests alike.

``ServerProcess(*serve_args)`` spawns ``python -m sqlq serve --port <free>
<serve_args>``; its stdout and stderr go to one log (``output``). ``start``
spawns and waits for ``/readyz``; ``stop`` kills it (SIGKILL unless told
otherwise) and returns its exit status. ``ServerProcess.engine(...)`` is the
benchmark's preset: an engine on a fresh data directory, quiet, no grace
period, fault injection on.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerError(RuntimeError):
    """The server exited, or did not get ready in time; the message ends with its output."""


def end_process(proc: subprocess.Popen[bytes], sig: int | None, within: float) -> int:
    """Send ``sig`` to ``proc`` if it still runs (None: send nothing, it is stopping
    already), wait ``within`` seconds for it, kill it if it is still there; its exit status.
    (The bench's servers and the tests' worker processes stop alike.)"""
    if proc.poll() is None:
        if sig is not None:
            proc.send_signal(sig)
        try:
            proc.wait(timeout=within)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


# The experiments' backoff, 10 ms doubling to 5 s, given explicitly: the server's default
# (15 s, to hours) is sized for real work, and their definitions predate it.
FAST_RETRY_FLAGS = ("--retry-base-ms", "10", "--retry-cap-ms", "5000")


class ServerProcess:
    """``with ServerProcess(...) as srv:`` starts it, waits for /readyz, stops it."""

    def __init__(
        self,
        *serve_args: str,
        env: dict[str, str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        ready_within: float = 120.0,
        tmp: tempfile.TemporaryDirectory[str] | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [sys.executable, "-m", "sqlq", "serve", "--port", str(self.port), *serve_args]
        self.env = {**os.environ, **(env or {})}
        self.ready_within = ready_within
        self._log_path = Path(log_path) if log_path is not None else None
        self._tmp = tmp  # a data directory this object made, and removes at cleanup
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.ready_s = 0.0
        self.returncode: int | None = None
        self.store = ""  # set by engine()
        self.data_dir = ""

    @classmethod
    def engine(
        cls,
        *,
        store: str,
        data_dir: str | None = None,
        sync: str = "full",
        workers: int = 16,
        flags: tuple[str, ...] = (),
        ready_within: float = 120.0,
        env: dict[str, str] | None = None,
    ) -> ServerProcess:
        """The benchmark's server: a fresh data directory unless given one; ``env`` adds to
        the environment (the crash trials' handlers read theirs)."""
        tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="sqlq-bench-")
        data = data_dir or (tmp.name if tmp else "")
        args = (
            "--store", store, "--data", data, "--sync", sync, "--workers", str(workers),
            "--log-level", "warning",
            "--grace", "0",  # a benchmark never waits for hung jobs at shutdown
            "--fault-injection",  # the experiments inject failures and hangs
            *FAST_RETRY_FLAGS,  # (before ``flags``: a run may set its own)
            *flags,
        )  # fmt: skip
        srv = cls(
            *args, env=env, log_path=Path(data) / "server.log", ready_within=ready_within, tmp=tmp
        )
        srv.store, srv.data_dir = store, data
        return srv

    def spawn(self) -> ServerProcess:
        """Start the process; do not wait for it."""
        self.log: IO[bytes] = (
            open(self._log_path, "ab+") if self._log_path is not None else tempfile.TemporaryFile()
        )
        self.started_at = time.perf_counter()
        self.proc = subprocess.Popen(
            self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env=self.env
        )
        return self

    def start(self) -> ServerProcess:
        """Start the process and wait until it answers /readyz with 200."""
        self.spawn()
        self.wait_ready()
        return self

    def wait_ready(self, within: float | None = None) -> float:
        assert self.proc is not None, "spawn() first"
        deadline = time.perf_counter() + (within or self.ready_within)
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(
                    f"sqlq serve exited with {self.proc.returncode}: {self.cmd}\n{self.output}"
                )
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=1) as r:
                    if r.status == 200:
                        self.ready_s = time.perf_counter() - self.started_at
                        return self.ready_s
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.01)
        raise ServerError(f"sqlq serve not ready within {within or self.ready_within}s")

    @property
    def output(self) -> str:
        """Everything it printed so far (stdout and stderr)."""
        if not hasattr(self, "log") or self.log.closed:
            return getattr(self, "_final_output", "")
        self.log.flush()
        with open(self.log.fileno(), "rb", closefd=False) as f:
            f.seek(0)
            return f.read().decode(errors="replace")

    def kill(self) -> None:
        """SIGKILL: the crash experiments."""
        self.stop(signal.SIGKILL)

    def stop(self, sig: int = signal.SIGKILL, within: float = 30.0) -> int:
        """Send ``sig`` (SIGKILL by default), wait, keep the output; the exit status. Idempotent."""
        if self.proc is None:
            return 0
        if self.returncode is not None:
            return self.returncode
        self.returncode = end_process(self.proc, sig, within)
        self._final_output = self.output
        self.log.close()
        return self.returncode

    def cleanup(self) -> None:
        """Stop gracefully (SIGTERM), and remove a data directory this object made."""
        self.stop(signal.SIGTERM)
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()
