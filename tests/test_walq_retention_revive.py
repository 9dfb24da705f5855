"""A finished job past retention is gone for a write, though walq may keep it until it is
pruned: a snapshot in flight has left it out, and a revival carried past that snapshot
would name a job the new log does not hold (the next open refused it: JobNotFoundError).
Found by a review (helper-26) for plain jobs and workflow members alike."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.errors import JobNotFoundError
from sqlq.common.models import Job, State, new_job_id
from sqlq.common.workflow import Flow
from sqlq.walq.files import OS_FILES
from sqlq.walq.store import WalStore
from tests.helpers import NOW


class GatedFiles:
    """The real files, but a snapshot's writes wait at ``gate`` (``entered`` once one does)."""

    def __init__(self) -> None:
        self.gate, self.entered = threading.Event(), threading.Event()
        self.gate.set()
        self._tmp: set[int] = set()

    def __getattr__(self, name: str) -> object:
        return getattr(OS_FILES, name)

    def open_new(self, path: str) -> int:
        fd = OS_FILES.open_new(path)
        if path.endswith(".tmp"):
            self._tmp.add(fd)
        return fd

    def close(self, fd: int) -> None:
        self._tmp.discard(fd)
        OS_FILES.close(fd)

    def write(self, fd: int, data: bytes) -> None:
        if fd in self._tmp:
            self.entered.set()
            self.gate.wait()
        OS_FILES.write(fd, data)


@pytest.mark.parametrize("member", [False, True])
async def test_a_job_past_retention_is_not_revived_past_a_snapshot_that_left_it_out(
    tmp_path: Path, member: bool
) -> None:
    clock, files = FakeClock(NOW), GatedFiles()
    store = WalStore(tmp_path, clock=clock, retention=10.0, fs=files)  # type: ignore[arg-type]
    await store.open()
    flow = Flow(workflow_id=new_job_id(NOW), ref="p") if member else None
    job = Job.new(kind="k", args={}, now=NOW, max_attempts=1, flow=flow)
    await store.commit([job])
    running = job.apply(job.start(NOW + 1))
    await store.commit([job.start(NOW + 1)])
    await store.commit([running.bury("boom", NOW + 2)])
    clock.advance(100.0)  # past retention
    files.gate.clear()
    compaction = asyncio.create_task(store.compact())
    await asyncio.to_thread(files.entered.wait, 10)  # the snapshot is being written
    dead = await store.get(job.id)
    assert dead is not None
    assert dead.state is State.DEAD  # still kept: nothing pruned it yet
    with pytest.raises(JobNotFoundError):
        await store.commit([dead.revive(clock.time())])
    files.gate.set()
    await compaction
    await store.close()
    again = WalStore(tmp_path, clock=clock, retention=10.0)
    await again.open()  # (refused before: the carried revival named a job the log lost)
    assert await again.get(job.id) is None
    await again.close()
