"""walq compaction: atomic at every step, and appends carry on while it runs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.errors import StoreError, StoreFailedError
from sqlq.common.models import Job
from sqlq.walq import log
from sqlq.walq.store import WalStore
from tests.walq_helpers import NOW, FaultyFiles, log_path, read_state, write_history


def header_of(d: Path) -> dict[str, Any]:
    first = log_path(d).read_bytes().split(b"\n", 1)[0]
    return log.unframe(first)


async def test_compaction_carries_over_concurrent_appends(tmp_path: Path) -> None:
    store = WalStore(tmp_path, clock=FakeClock(NOW))
    await store.open()
    first = [Job.new(kind="sleep", args={"i": i}, now=NOW) for i in range(3000)]
    await asyncio.gather(*(store.commit([j]) for j in first))
    during = [Job.new(kind="sleep", args={"d": i}, now=NOW) for i in range(2000)]
    compaction = asyncio.create_task(store.compact())
    await asyncio.gather(*(store.commit([j]) for j in during))
    report = await compaction
    after = Job.new(kind="sleep", args={"after": True}, now=NOW)
    await store.commit([after])
    stats = store.stats().detail
    await store.close()
    assert report.jobs_kept >= len(first)
    assert stats["compactions"] == 1
    assert stats["last_compaction_carried_bytes"] > 0  # appends really overlapped it
    assert int(header_of(tmp_path)["start_seq"]) > 1  # the log is the compacted one
    everyone = [*first, *during, after]
    got = await read_state(tmp_path, [j.id for j in everyone])
    assert got == {j.id: j for j in everyone}


async def test_compaction_starts_by_itself_past_floor_and_ratio(tmp_path: Path) -> None:
    store = WalStore(tmp_path, clock=FakeClock(NOW), compact_floor_bytes=20_000, compact_ratio=2)
    await store.open()
    job = Job.new(kind="sleep", args={}, now=NOW)
    await store.commit([job])
    current = job
    # One live job, rewritten over and over: the log grows, the live state does not.
    for i in range(400):
        t = current.start(NOW + i) if i % 2 == 0 else current.retry("again", NOW, NOW + i)
        await store.commit([t])
        current = current.apply(t)
    stats = store.stats().detail
    await store.close()
    assert stats["compactions"] >= 1
    assert stats["log_bytes"] < 20_000 * 2
    assert await read_state(tmp_path, [job.id]) == {job.id: current}


@pytest.mark.parametrize(
    ("op", "where", "fatal"),
    [
        ("open_new", "walq.log.tmp", False),  # could not even start the snapshot
        ("write", "walq.log.tmp", False),  # snapshot half written
        ("fdatasync", "walq.log.tmp", False),  # snapshot written, never synced
        ("replace", "walq.log.tmp", True),  # tmp complete, not renamed
        ("fsync_dir", "", True),  # renamed, directory not synced
    ],
)
async def test_compaction_interrupted_at_each_step_leaves_a_valid_log(
    tmp_path: Path, op: str, where: str, fatal: bool
) -> None:
    final = await write_history(tmp_path)
    # Count only calls made after open: open itself writes nothing to the tmp file.
    fs = FaultyFiles(op, where=where, nth=1)
    store = WalStore(tmp_path, clock=FakeClock(NOW), fs=fs)
    await store.open()
    extra = Job.new(kind="sleep", args={"extra": 1}, now=NOW)
    await store.commit([extra])
    with pytest.raises(StoreFailedError if fatal else StoreError):
        await store.compact()
    assert fs.fired
    if not fatal:  # the old log is untouched: the engine goes on
        more = Job.new(kind="sleep", args={"more": 1}, now=NOW)
        await store.commit([more])
        final[more.id] = more
    else:
        with pytest.raises(StoreFailedError):
            await store.commit([Job.new(kind="sleep", args={}, now=NOW)])
    await store.close()
    final[extra.id] = extra
    # A stale tmp may be left behind; open removes it, and everything acked is there.
    again = WalStore(tmp_path, clock=FakeClock(NOW))
    await again.open()
    try:
        assert {i: await again.get(i) for i in final} == final
    finally:
        await again.close()
    assert not (tmp_path / "walq.log.tmp").exists()


async def test_stale_tmp_is_removed_at_open(tmp_path: Path) -> None:
    final = await write_history(tmp_path)
    (tmp_path / "walq.log.tmp").write_bytes(b"half a snapshot, never renamed")
    store = WalStore(tmp_path, clock=FakeClock(NOW))
    recovery = await store.open()
    await store.close()
    assert any("stale compaction file" in n for n in recovery.notes)
    assert not (tmp_path / "walq.log.tmp").exists()
    assert await read_state(tmp_path, sorted(final)) == final


async def test_finished_jobs_past_retention_do_not_hold_compaction_back(tmp_path: Path) -> None:
    """With retention, finished jobs must not count as live, or the log never compacts."""
    clock = FakeClock(NOW)
    store = WalStore(
        tmp_path, clock=clock, retention=1.0, compact_floor_bytes=30_000, compact_ratio=4
    )
    await store.open()
    for i in range(400):
        job = Job.new(kind="sleep", args={"i": i}, now=clock.time())
        start = job.start(clock.time())
        await store.commit([job])
        await store.commit([start])
        await store.commit([job.apply(start).complete(None, clock.time())])
        clock.advance(0.1)  # jobs age past the 1 s retention as the run goes on
    stats = store.stats().detail
    await store.close()
    assert stats["compactions"] >= 1
    assert stats["log_bytes"] < 30_000 * 2
