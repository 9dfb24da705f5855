"""The running columns on every SQLite path a job takes: the batch statement and the slow
path's savepoints write them, and every read (get, a key, each listing shape, a schedule's
listing, recovery) gives them back whole. The contract suite covers ``get`` and a reopen."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path

import msgspec

from sqlq.common.backoff import RetryPolicy, after_failure, after_snooze
from sqlq.common.errors import StaleEpochError
from sqlq.common.models import Job, State, Transition
from sqlq.common.running import check_progress
from sqlq.common.schedule import tick_key
from sqlq.common.store import JobQuery
from sqlq.engines.sqlite.store import SQLiteStore
from tests.helpers import NOW


async def _carrying_all(store: SQLiteStore, key: str) -> Job:
    """A running job with every running field set: an error, a snooze, progress, a
    checkpoint and a cancel asked for, each committed as its own batch."""
    job = Job.new(kind="noop", args={"n": 1}, now=NOW, idempotency_key=key)
    await store.commit([job])
    steps: list[Callable[[Job], Transition]] = [
        lambda j: j.start(NOW + 1),
        lambda j: after_failure(j, "ValueError: boom", NOW + 2, RetryPolicy(), random.Random(1)),
        lambda j: j.start(NOW + 3),
        lambda j: after_snooze(j, 5.0, NOW + 4, max_snoozes=100),
        lambda j: j.start(NOW + 5),
        lambda j: j.touch(
            NOW + 6, progress=check_progress(75, "most", NOW + 6), checkpoint={"page": 3}
        ),
        lambda j: j.request_cancel(NOW + 7),
    ]
    for step in steps:
        t = step(job)
        await store.commit([t])
        job = job.apply(t)
    assert job.state is State.RUNNING
    assert job.cancel_requested_at == NOW + 7
    assert job.progress is not None
    assert job.checkpoint == {"page": 3}
    assert job.snoozes == 1
    assert len(job.errors) == 1
    return job


async def test_every_read_gives_the_running_fields_back(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path)
    await store.open()
    try:
        job = await _carrying_all(store, "plain")
        ticked = await _carrying_all(store, tick_key("nightly", int(NOW)))
        assert await store.get(job.id) == job
        assert await store.find_key("plain") == job
        for query in (
            JobQuery(),
            JobQuery(state=State.RUNNING),
            JobQuery(kind="noop"),
            JobQuery(queue="default"),
            JobQuery(state=State.RUNNING, kind="noop", queue="default"),
        ):
            assert await store.list_jobs(query) == sorted([job, ticked], key=lambda j: j.id)
        for query in (
            JobQuery(schedule="nightly"),
            JobQuery(schedule="nightly", state=State.RUNNING),
        ):
            assert await store.list_jobs(query) == [ticked]
    finally:
        await store.close()
    again = SQLiteStore(tmp_path)
    recovery = await again.open()
    try:
        assert sorted(recovery.jobs, key=lambda j: j.id) == sorted(
            [job, ticked], key=lambda j: j.id
        )
    finally:
        await again.close()


async def test_the_slow_path_writes_the_running_fields_whole(tmp_path: Path) -> None:
    """A batch a guard refuses is redone caller by caller: the caller whose move carries
    progress and a checkpoint still commits them, the stale one gets its error."""
    store = SQLiteStore(tmp_path)
    await store.open()
    try:
        job = await _carrying_all(store, "k")
        other = Job.new(kind="noop", args={}, now=NOW)
        await store.commit([other])
        stale = msgspec.structs.replace(other.start(NOW + 1), expect_epoch=other.epoch + 1)
        touch = job.touch(NOW + 8, progress=check_progress(90, None, NOW + 8),
                          checkpoint={"page": 9})  # fmt: skip
        results = await asyncio.gather(
            store.commit([stale]), store.commit([touch]), return_exceptions=True
        )
        assert isinstance(results[0], StaleEpochError)
        assert results[1] is None
        assert store.slow_batches == 1
        got = await store.get(job.id)
        assert got == job.apply(touch)
        assert got is not None
        assert got.checkpoint == {"page": 9}
        assert got.cancel_requested_at == job.cancel_requested_at  # carried by the move
    finally:
        await store.close()


async def test_a_progress_write_rewrites_a_page_not_the_checkpoint(tmp_path: Path) -> None:
    """A running job holding a 64 KiB checkpoint reports progress: SQLite overwrites the
    row in place (its progress padded to its slot keeps the record's size), so the WAL grows
    by a page or two a write (after the first), not by the checkpoint's overflow pages; the
    job reads back
    whole (the padding is JSON's whitespace), after a reopen too."""
    from sqlq.common.running import MAX_CHECKPOINT_BYTES, check_checkpoint

    store = SQLiteStore(tmp_path, sync="os")
    await store.open()
    job = Job.new(kind="noop", args={}, now=NOW)
    await store.commit([job])
    big = check_checkpoint({"blob": "x" * (MAX_CHECKPOINT_BYTES - 11)})
    for t in (job.start(NOW + 1),):
        await store.commit([t])
        job = job.apply(t)
    t = job.touch(NOW + 2, checkpoint=big)
    await store.commit([t])
    job = job.apply(t)
    wal = Path(store.path + "-wal")
    grew = []
    for i in range(1, 30):  # "report 1" ... "report 29": lengths change, slots mostly not
        t = job.touch(NOW + 2 + i, progress=check_progress(i, f"report {i}", NOW + 2 + i))
        before = wal.stat().st_size
        await store.commit([t])
        grew.append(wal.stat().st_size - before)
        job = job.apply(t)
        assert await store.get(job.id) == job
    await store.close()
    # The first progress is a new value (NULL before): the record grows, and is written
    # whole once. Every later one is a page or two (and their frame headers).
    assert grew[0] > MAX_CHECKPOINT_BYTES
    assert max(grew[1:]) <= 2 * (4096 + 24)
    reopened = SQLiteStore(tmp_path, sync="os")
    recovery = await reopened.open()
    try:
        assert recovery.jobs == [job]
    finally:
        await reopened.close()
