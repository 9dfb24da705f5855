"""walq's schedules: a tick is one record (a torn tail keeps both halves or neither), the
recovery rule (a cursor is never behind its schedule's jobs, and never moved back), and
schedules through compaction."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.errors import UnencodableError
from sqlq.common.models import Job
from sqlq.common.schedule import (
    AdvanceSchedule,
    DropSchedule,
    PutSchedule,
    Schedule,
    ScheduleSpec,
    tick_key,
    trigger_key,
)
from sqlq.walq import log
from sqlq.walq.schedules import cursor_fixes
from sqlq.walq.store import WalStore
from tests.schedule_records import CREATED, MINUTE, record, tick_job
from tests.walq_helpers import NOW, NoSyncFiles, log_path


def store_at(d: Path, **options: object) -> WalStore:
    return WalStore(d, clock=FakeClock(NOW), fs=NoSyncFiles(), **options)  # type: ignore[arg-type]


async def tick(store: WalStore, name: str, to: int, job_id: str | None = None) -> Job:
    """One tick as the evaluator commits it: the advance and its job in one call."""
    now = await store.get_schedule(name)
    assert now is not None
    job = tick_job(name, to, job_id)
    advance = AdvanceSchedule(
        name=name, expect_version=now.version, expect_cursor=now.cursor, cursor=to, job=job.id
    )
    await store.commit([advance, job])
    return job


async def state(d: Path, job_ids: list[str]) -> tuple[list[Schedule], dict[str, Job | None]]:
    store = store_at(d)
    await store.open()
    try:
        return await store.list_schedules(), {i: await store.get(i) for i in job_ids}
    finally:
        await store.close()


def last_record_offset(data: bytes) -> int:
    return data.rstrip(b"\n").rfind(b"\n") + 1


async def test_a_torn_tick_keeps_its_cursor_and_its_job_together(tmp_path: Path) -> None:
    """The last record is a tick (advance + job): cut at every byte of it, recovery has
    either both (the whole line) or neither (any shorter cut), never a cursor without its
    job or a job without its cursor."""
    src = tmp_path / "src"
    store = store_at(src)
    await store.open()
    await store.commit([PutSchedule(schedule=record(), expect_version=0)])
    first = await tick(store, "nightly", CREATED + MINUTE, "tick-1")
    second = await tick(store, "nightly", CREATED + 2 * MINUTE, "tick-2")
    await store.close()
    data = log_path(src).read_bytes()
    start = last_record_offset(data)
    ops = log.unframe(data[start:-1])["ops"]
    assert [sorted(op) for op in ops] == [["sadv"], ["put"]]  # one record, both halves

    whole = await state(src, [first.id, second.id])
    (after,), jobs = whole
    assert (after.cursor, after.last_job, jobs[second.id]) == (
        CREATED + 2 * MINUTE,
        second.id,
        second,
    )
    ref = tmp_path / "ref"
    ref.mkdir()
    log_path(ref).write_bytes(data[:start])
    before = await state(ref, [first.id, second.id])
    (was,), jobs = before
    assert (was.cursor, was.last_job, jobs[second.id]) == (CREATED + MINUTE, first.id, None)

    retick = {start + 1, (start + len(data)) // 2, len(data) - 1}  # all: 3.5 s more
    for cut in range(start + 1, len(data)):
        d = tmp_path / f"cut-{cut}"
        d.mkdir()
        log_path(d).write_bytes(data[:cut])
        store = store_at(d)
        recovery = await store.open()
        assert recovery.torn_bytes == cut - start
        assert (await store.list_schedules(), await store.get(second.id)) == (before[0], None)
        if cut in retick:  # the evaluator takes the tick again from the cursor it finds
            again = await tick(store, "nightly", CREATED + 2 * MINUTE)
        await store.close()
        if cut in retick:
            schedules, jobs = await state(d, [first.id, again.id])
            assert schedules[0].cursor == CREATED + 2 * MINUTE
            assert jobs[again.id] == again
        shutil.rmtree(d)


def test_the_rule_moves_a_cursor_up_to_its_newest_job_and_never_back() -> None:
    behind = record("behind", cursor=CREATED)
    ahead = record("ahead", cursor=CREATED + 10 * MINUTE)  # ticks passed over since its job
    keys = {
        tick_key("behind", CREATED + MINUTE): "j1",
        tick_key("behind", CREATED + 3 * MINUTE): "j3",  # the newest of its jobs
        tick_key("behind", CREATED + 2 * MINUTE): "j2",
        trigger_key("behind", "t" * 32): "t1",  # a triggered job has no tick
        tick_key("behindx", CREATED + 9 * MINUTE): "x",  # another schedule's (and gone)
        tick_key("ahead", CREATED + 5 * MINUTE): "a5",
        "client-key": "c1",
    }
    fixes = cursor_fixes({"behind": behind, "ahead": ahead}, keys)
    assert fixes == [
        AdvanceSchedule(
            name="behind",
            expect_version=1,
            expect_cursor=CREATED,
            cursor=CREATED + 3 * MINUTE,
            job="j3",
        )
    ]
    at = record("at", cursor=CREATED + MINUTE)  # exactly at its newest tick: nothing to do
    assert cursor_fixes({"at": at}, {tick_key("at", CREATED + MINUTE): "j"}) == []
    assert cursor_fixes({}, keys) == []


async def test_recovery_moves_a_cursor_behind_its_jobs_and_says_so(tmp_path: Path) -> None:
    """A tick's job without its cursor's advance (a put can no longer move a cursor back,
    but a job committed with a tick's key alone still can be ahead of it): the next open
    moves the cursor to that job's tick (so the tick is not enqueued twice), and writes
    that down, so an advance fenced on the moved cursor replays on every open."""
    store = store_at(tmp_path)
    await store.open()
    await store.commit([PutSchedule(schedule=record(), expect_version=0)])
    job = tick_job("nightly", CREATED + 2 * MINUTE, "tick-2")
    await store.commit([job])  # ahead of the cursor, which stays at the creation
    got = await store.get_schedule("nightly")
    assert got is not None
    assert got.cursor == CREATED
    await store.close()

    store = store_at(tmp_path)
    recovery = await store.open()
    got = await store.get_schedule("nightly")
    assert got is not None
    assert (got.version, got.cursor, got.last_job) == (1, CREATED + 2 * MINUTE, job.id)
    assert any("nightly" in n and str(CREATED + 2 * MINUTE) in n for n in recovery.notes)
    later = await tick(store, "nightly", CREATED + 3 * MINUTE, "tick-3")
    records = store.records
    await store.close()

    store = store_at(tmp_path)
    recovery = await store.open()
    try:
        got = await store.get_schedule("nightly")
        assert got is not None
        assert (got.cursor, got.last_job) == (CREATED + 3 * MINUTE, later.id)
        assert recovery.notes == []  # the fix was folded from the log: nothing to move now
        # the first open's two (the put and the job), the fix and the tick after it
        assert (records, recovery.records) == (2, 4)
    finally:
        await store.close()


async def test_a_cursor_ahead_of_its_jobs_stays(tmp_path: Path) -> None:
    """Ticks passed over (catch-up, overlap) move the cursor past the newest job: the rule
    never moves it back."""
    store = store_at(tmp_path)
    await store.open()
    await store.commit([PutSchedule(schedule=record(), expect_version=0)])
    job = await tick(store, "nightly", CREATED + MINUTE, "tick-1")
    now = await store.get_schedule("nightly")
    assert now is not None
    passed = AdvanceSchedule(
        name="nightly", expect_version=1, expect_cursor=now.cursor, cursor=CREATED + 9 * MINUTE
    )
    await store.commit([passed])
    expect = await store.list_schedules()
    await store.close()
    (got,), jobs = await state(tmp_path, [job.id])
    assert [got] == expect
    assert (got.cursor, got.last_job) == (CREATED + 9 * MINUTE, job.id)
    assert jobs[job.id] == job


async def test_schedules_survive_compaction_then_reopen(tmp_path: Path) -> None:
    store = store_at(tmp_path, retention=10.0)
    await store.open()
    await store.commit([PutSchedule(schedule=record("a"), expect_version=0)])
    await store.commit([PutSchedule(schedule=record("b", cursor=CREATED + 5), expect_version=0)])
    await store.commit([PutSchedule(schedule=record("gone"), expect_version=0)])
    first = await tick(store, "a", CREATED + MINUTE)
    started = first.start(NOW + 1)
    await store.commit([started])
    await store.commit([first.apply(started).complete(None, NOW + 2)])
    await store.commit([DropSchedule(name="gone")])
    store.clock.advance(60.0)  # type: ignore[attr-defined]  # the job is past retention
    report = await store.compact()
    assert report.jobs_pruned == 1  # its job is gone; the cursor it moved is not
    data = log_path(tmp_path).read_bytes()
    snaps = [log.unframe(line) for _, line, _ in list(log.lines(data))[1:]]
    assert sorted(s["sched"]["name"] for s in snaps if "sched" in s) == ["a", "b"]
    later = await tick(store, "b", CREATED + 2 * MINUTE)  # after the snapshot
    expect = await store.list_schedules()
    await store.close()

    schedules, jobs = await state(tmp_path, [first.id, later.id])
    assert schedules == expect
    assert [(s.name, s.cursor) for s in schedules] == [
        ("a", CREATED + MINUTE),
        ("b", CREATED + 2 * MINUTE),
    ]
    assert jobs == {first.id: None, later.id: later}


async def test_a_put_recovery_would_refuse_fails_its_caller_not_the_next_open(
    tmp_path: Path,
) -> None:
    """A spec built in code is not checked against its bounds; a typed decode is. The put
    is decoded back before it is written, so it fails now, and the log stays openable."""
    store = store_at(tmp_path)
    await store.open()
    bad = ScheduleSpec(kind="noop", every_s=0)  # below every_s's bound of 1
    wrong = Schedule(name="bad", spec=bad, version=1, cursor=1, created_at=NOW, updated_at=NOW)
    with pytest.raises(UnencodableError):
        await store.commit([PutSchedule(schedule=wrong, expect_version=0)])
    await store.commit([PutSchedule(schedule=record(), expect_version=0)])
    await store.close()
    schedules, _ = await state(tmp_path, [])
    assert [s.name for s in schedules] == ["nightly"]
