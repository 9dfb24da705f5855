"""The JobStore contract for schedules, run over every engine: the record, its
compare-and-set changes, a tick as one commit, and what survives a reopen."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from sqlq.common.errors import OverlapError, StaleScheduleError
from sqlq.common.models import Job
from sqlq.common.schedule import (
    DropSchedule,
    PutSchedule,
    trigger_key,
)
from sqlq.common.store import JobQuery, JobStore
from tests.helpers import NOW, StoreFactory
from tests.schedule_records import CREATED, MINUTE, advance, create, record, tick_job


async def test_a_schedule_round_trips_and_lists_in_name_order(store: JobStore) -> None:
    b = await create(store, record("b", cron="30 2 * * *", tz="Europe/Berlin", every_s=None))
    a = await create(store, record("a"))
    assert await store.get_schedule("b") == b
    assert await store.get_schedule("nope") is None
    assert await store.list_schedules() == [a, b]


async def test_a_put_is_fenced_on_the_version(store: JobStore) -> None:
    s = await create(store, record())
    with pytest.raises(StaleScheduleError):
        await store.commit([PutSchedule(schedule=record(), expect_version=0)])  # exists
    replaced = record(version=2, paused=True)
    with pytest.raises(StaleScheduleError):
        await store.commit([PutSchedule(schedule=replaced, expect_version=2)])
    assert await store.get_schedule("nightly") == s
    await store.commit([PutSchedule(schedule=replaced, expect_version=1)])
    assert await store.get_schedule("nightly") == replaced


async def test_a_tick_is_one_commit_of_the_cursor_and_its_job(store: JobStore) -> None:
    s = await create(store, record())
    tick = CREATED + MINUTE
    job = tick_job(s.name, tick)
    await store.commit([advance(s, tick, job), job])
    got = await store.get_schedule(s.name)
    assert got is not None
    assert (got.cursor, got.last_job) == (tick, job.id)
    assert await store.get(job.id) == job


async def test_a_stale_advance_inserts_nothing(store: JobStore) -> None:
    """The loser of two nodes evaluating one tick: its cursor is stale, so its job (a
    different id, the same key) is not inserted either, and the cursor is the winner's."""
    s = await create(store, record())
    tick = CREATED + MINUTE
    first, second = tick_job(s.name, tick), tick_job(s.name, tick)
    await store.commit([advance(s, tick, first), first])
    with pytest.raises(StaleScheduleError):
        await store.commit([advance(s, tick, second), second])
    assert await store.get(second.id) is None
    got = await store.get_schedule(s.name)
    assert got is not None
    assert (got.cursor, got.last_job) == (tick, first.id)


async def test_of_two_ticks_from_one_cursor_in_one_batch_exactly_one_applies(
    store: JobStore,
) -> None:
    s = await create(store, record())
    tick = CREATED + MINUTE
    jobs = [tick_job(s.name, tick) for _ in range(2)]
    outcomes = await asyncio.gather(
        *(store.commit([advance(s, tick, j), j]) for j in jobs), return_exceptions=True
    )
    assert sorted(type(o).__name__ for o in outcomes) == ["NoneType", "StaleScheduleError"]
    winner = jobs[outcomes.index(None)]
    loser = jobs[1 - outcomes.index(None)]
    assert await store.get(winner.id) == winner
    assert await store.get(loser.id) is None


async def test_an_advance_with_a_version_since_replaced_is_stale(store: JobStore) -> None:
    """A pause (a put) between an evaluator's read and its commit fences the tick off."""
    s = await create(store, record())
    await store.commit([PutSchedule(schedule=record(version=2, paused=True), expect_version=1)])
    job = tick_job(s.name, CREATED + MINUTE)
    with pytest.raises(StaleScheduleError):
        await store.commit([advance(s, CREATED + MINUTE, job), job])
    assert await store.get(job.id) is None


async def test_a_passed_over_tick_moves_the_cursor_and_keeps_the_last_job(
    store: JobStore,
) -> None:
    s = await create(store, record())
    job = tick_job(s.name, CREATED + MINUTE)
    await store.commit([advance(s, CREATED + MINUTE, job), job])
    now = await store.get_schedule(s.name)
    assert now is not None
    await store.commit([advance(now, CREATED + 5 * MINUTE, None)])
    got = await store.get_schedule(s.name)
    assert got is not None
    assert (got.cursor, got.last_job) == (CREATED + 5 * MINUTE, job.id)


async def test_overlap_skip_is_checked_in_the_commit(store: JobStore) -> None:
    s = await create(store, record(overlap="skip"))
    first = tick_job(s.name, CREATED + MINUTE)
    await store.commit([advance(s, CREATED + MINUTE, first), first])
    s1 = await store.get_schedule(s.name)
    assert s1 is not None
    second = tick_job(s.name, CREATED + 2 * MINUTE)
    with pytest.raises(OverlapError):  # the first is still scheduled
        await store.commit([advance(s1, CREATED + 2 * MINUTE, second, idle=first.id), second])
    assert await store.get(second.id) is None
    start = first.start(NOW + 100)
    await store.commit([start])
    await store.commit([first.apply(start).complete(None, NOW + 101)])
    await store.commit([advance(s1, CREATED + 2 * MINUTE, second, idle=first.id), second])
    assert await store.get(second.id) == second


async def test_an_idle_job_that_is_gone_does_not_block(store: JobStore) -> None:
    """A previous job pruned past retention (or never there) is not live."""
    s = await create(store, record(overlap="skip"))
    job = tick_job(s.name, CREATED + MINUTE)
    await store.commit([advance(s, CREATED + MINUTE, job, idle="0" * 32), job])
    assert await store.get(job.id) == job


async def test_a_drop_removes_the_schedule_not_its_jobs(store: JobStore) -> None:
    s = await create(store, record())
    job = tick_job(s.name, CREATED + MINUTE)
    await store.commit([advance(s, CREATED + MINUTE, job), job])
    await store.commit([DropSchedule(name=s.name)])
    await store.commit([DropSchedule(name=s.name)])  # never refused
    assert await store.get_schedule(s.name) is None
    assert await store.list_schedules() == []
    assert await store.get(job.id) == job
    with pytest.raises(StaleScheduleError):
        await store.commit([advance(s, CREATED + 2 * MINUTE, None)])
    await create(store, record())  # the name is free again


async def test_a_refused_schedule_change_fails_only_its_caller(store: JobStore) -> None:
    s = await create(store, record())
    bystander = tick_job("other", CREATED)
    stale = advance(s, CREATED + MINUTE, None)
    outcomes = await asyncio.gather(
        store.commit([PutSchedule(schedule=record(), expect_version=0)]),
        store.commit([bystander]),
        store.commit([stale]),
        return_exceptions=True,
    )
    assert isinstance(outcomes[0], StaleScheduleError)
    assert outcomes[1] is None
    assert outcomes[2] is None
    assert await store.get(bystander.id) == bystander


async def test_a_schedules_jobs_are_listed_by_its_name(store: JobStore) -> None:
    """By the keys a schedule's jobs carry: its ticks' and its triggered ones, and not
    those of a schedule whose name begins with the same letters."""
    a, ab = await create(store, record("a")), await create(store, record("ab"))
    a_tick, ab_tick = tick_job("a", CREATED + MINUTE), tick_job("ab", CREATED + MINUTE)
    await store.commit([advance(a, CREATED + MINUTE, a_tick), a_tick])
    await store.commit([advance(ab, CREATED + MINUTE, ab_tick), ab_tick])
    triggered = Job.new(kind="noop", args={}, now=NOW)
    triggered = Job.new(
        kind="noop", args={}, now=NOW, idempotency_key=trigger_key("a", triggered.id)
    )
    await store.commit([triggered, Job.new(kind="noop", args={}, now=NOW)])
    listed = await store.list_jobs(JobQuery(schedule="a"))
    assert [j.id for j in listed] == sorted([a_tick.id, triggered.id])
    assert [j.id for j in await store.list_jobs(JobQuery(schedule="ab"))] == [ab_tick.id]
    assert (
        await store.list_jobs(JobQuery(schedule="a", after=max(listed, key=lambda j: j.id).id))
        == []
    )


async def test_schedules_and_cursors_survive_a_reopen(reopen_factory: StoreFactory) -> None:
    first = reopen_factory()
    await first.open()
    s = await create(first, record())
    job = tick_job(s.name, CREATED + MINUTE)
    await first.commit([advance(s, CREATED + MINUTE, job), job])
    await create(first, record("gone"))
    await first.commit([DropSchedule(name="gone")])
    expect = await first.get_schedule(s.name)
    await first.close()
    again = reopen_factory()
    await again.open()
    try:
        assert await again.list_schedules() == [expect]
        assert await again.get(job.id) == job
    finally:
        await again.close()


async def test_compaction_keeps_every_schedule(reopen_factory: StoreFactory) -> None:
    first = reopen_factory()
    await first.open()
    s = await create(first, record())
    for i in range(1, 4):
        now = await first.get_schedule(s.name)
        assert now is not None
        job = tick_job(s.name, CREATED + i * MINUTE)
        await first.commit([advance(now, CREATED + i * MINUTE, job), job])
    await first.compact()
    expect = await first.list_schedules()
    await first.close()
    again = reopen_factory()
    await again.open()
    try:
        assert await again.list_schedules() == expect
    finally:
        await again.close()


async def test_a_put_never_moves_the_cursor_back(store: JobStore) -> None:
    """A put read before a tick and committed after it (an advance leaves the version as
    it is) keeps the tick's cursor and job; a put with a later cursor (a resume) moves it."""
    s = await create(store, record())
    job = tick_job(s.name, CREATED + MINUTE)
    await store.commit([advance(s, CREATED + MINUTE, job), job])
    paused = msgspec.structs.replace(record(version=2, paused=True), cursor=CREATED)
    await store.commit([PutSchedule(schedule=paused, expect_version=1)])
    got = await store.get_schedule(s.name)
    assert got is not None
    assert (got.version, got.spec.paused) == (2, True)
    assert (got.cursor, got.last_job) == (CREATED + MINUTE, job.id)
    resumed = msgspec.structs.replace(record(version=3), cursor=CREATED + 10 * MINUTE)
    await store.commit([PutSchedule(schedule=resumed, expect_version=2)])
    got = await store.get_schedule(s.name)
    assert got is not None
    assert got.cursor == CREATED + 10 * MINUTE
