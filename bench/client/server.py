"""A fresh ``sqlq serve`` subprocess per benchmark run, on a free port."""

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """``with ServerProcess(...) as srv:`` starts it, waits for /readyz, stops it."""

    def __init__(
        self,
        *,
        store: str,
        data_dir: str | None = None,
        sync: str = "full",
        workers: int = 16,
        flags: tuple[str, ...] = (),
        ready_within: float = 120.0,
    ) -> None:
        self.store = store
        self._tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="sqlq-bench-")
        self.data_dir = data_dir or (self._tmp.name if self._tmp else "")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [
            sys.executable, "-m", "sqlq", "serve",
            "--store", store, "--data", self.data_dir, "--sync", sync,
            "--workers", str(workers), "--port", str(self.port), "--log-level", "warning",
            "--grace", "0",  # a benchmark never waits for hung jobs at shutdown
            "--fault-injection",  # the experiments inject failures and hangs
            *flags,
        ]  # fmt: skip
        self.ready_within = ready_within
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.ready_s = 0.0

    def start(self) -> ServerProcess:
        self.log = open(Path(self.data_dir) / "server.log", "ab")
        self.started_at = time.perf_counter()
        self.proc = subprocess.Popen(
            self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ}
        )
        self.wait_ready()
        return self

    def wait_ready(self) -> float:
        assert self.proc is not None
        deadline = time.perf_counter() + self.ready_within
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sqlq serve exited with {self.proc.returncode}: {self.cmd}")
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=1) as r:
                    if r.status == 200:
                        self.ready_s = time.perf_counter() - self.started_at
                        return self.ready_s
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.01)
        raise RuntimeError(f"sqlq serve not ready within {self.ready_within}s")

    def kill(self) -> None:
        """SIGKILL: the crash experiments."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if hasattr(self, "log"):
            self.log.close()

    def cleanup(self) -> None:
        self.stop()
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
