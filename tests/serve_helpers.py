"""Run a real ``sqlq serve`` subprocess on a free port, for end-to-end tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "sqlq", "serve", "--port", str(self.port), *args]
        self.log = tempfile.TemporaryFile()  # stdout: uvicorn's access log goes there
        self.proc = subprocess.Popen(
            cmd,
            stdout=self.log,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        )

    def wait_ready(self, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise AssertionError(f"server exited with {self.proc.returncode}: {err}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.02)
        raise AssertionError(f"server not ready within {within}s")

    def stop(self, sig: int | None = None, within: float = 30.0) -> int:
        """Stop it (SIGKILL unless ``sig``) and keep its output. Idempotent."""
        if self.log.closed:
            return self.proc.wait()
        if self.proc.poll() is None:
            if sig is None:
                self.proc.kill()
            else:
                self.proc.send_signal(sig)
        code = self.proc.wait(timeout=within)
        if self.proc.stderr is not None:
            self.stderr = self.proc.stderr.read().decode()
            self.proc.stderr.close()
        self.log.seek(0)
        self.stdout = self.log.read().decode(errors="replace")
        self.log.close()
        return code
