"""Helpers for the walq-only tests: build logs, fold them, and break file I/O."""

from __future__ import annotations

from pathlib import Path

from sqlq.common.clock import FakeClock
from sqlq.common.models import Job
from sqlq.walq.files import OsFileOps
from sqlq.walq.store import LOG_NAME, WalStore
from tests.helpers import NOW as NOW


class NoSyncFiles(OsFileOps):
    """Real files without the syncs: for tests of what recovery folds and cuts, which open
    hundreds of logs (each open, cut and commit syncs; 2-3 ms each on this machine, so a
    byte-by-byte truncation test spent ~7 s in fdatasync). Durability has its own tests."""

    def fdatasync(self, fd: int) -> None:
        pass

    def fsync_dir(self, path: str) -> None:
        pass


class Boom(OSError):
    """The injected I/O error."""


class FaultyFiles(OsFileOps):
    """Real files, but the ``nth`` call of ``op`` on a path ending in ``where`` fails."""

    def __init__(
        self, op: str, where: str = "", nth: int = 1, err: int = 5, persistent: bool = False
    ) -> None:
        self.op, self.where, self.nth, self.err, self.persistent = op, where, nth, err, persistent
        self.calls = 0
        self.fired = False
        self.fd_paths: dict[int, str] = {}

    def _maybe(self, op: str, path: str) -> None:
        if op != self.op or not path.endswith(self.where):
            return
        if self.fired and not self.persistent:
            return
        self.calls += 1
        if self.calls >= self.nth:
            self.fired = True
            raise Boom(self.err, f"injected failure in {op}({path})")

    def open_new(self, path: str) -> int:
        self._maybe("open_new", path)
        fd = super().open_new(path)
        self.fd_paths[fd] = path
        return fd

    def open_append(self, path: str) -> int:
        fd = super().open_append(path)
        self.fd_paths[fd] = path
        return fd

    def write(self, fd: int, data: bytes) -> None:
        self._maybe("write", self.fd_paths.get(fd, ""))
        super().write(fd, data)

    def fdatasync(self, fd: int) -> None:
        self._maybe("fdatasync", self.fd_paths.get(fd, ""))
        super().fdatasync(fd)

    def replace(self, src: str, dst: str) -> None:
        self._maybe("replace", src)
        super().replace(src, dst)
        for fd, p in self.fd_paths.items():
            if p == src:
                self.fd_paths[fd] = dst

    def fsync_dir(self, path: str) -> None:
        self._maybe("fsync_dir", path)
        super().fsync_dir(path)


def log_path(d: Path) -> Path:
    return d / LOG_NAME


async def write_history(d: Path, n: int = 20, **options: object) -> dict[str, Job]:
    """A log whose last record completes a job; returns the final state."""
    options.setdefault("fs", NoSyncFiles())
    store = WalStore(d, clock=FakeClock(NOW), **options)  # type: ignore[arg-type]
    await store.open()
    state: dict[str, Job] = {}
    jobs = [Job.new(kind="sleep", args={"n": i}, now=NOW, job_id=f"job-{i:03}") for i in range(n)]
    for job in jobs:
        await store.commit([job])
        state[job.id] = job
    for job in jobs[: n // 2]:
        t = job.start(NOW + 1)
        await store.commit([t])
        state[job.id] = job.apply(t)
    last = state[jobs[0].id]
    t = last.complete({"answer": 42}, NOW + 2)
    await store.commit([t])
    state[last.id] = last.apply(t)
    await store.close()
    return state


async def read_state(d: Path, ids: list[str]) -> dict[str, Job | None]:
    store = WalStore(d, clock=FakeClock(NOW), fs=NoSyncFiles())
    await store.open()
    try:
        return {i: await store.get(i) for i in ids}
    finally:
        await store.close()
