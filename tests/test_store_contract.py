"""The JobStore contract, run over every engine. Speaks only the protocol."""

from __future__ import annotations

import asyncio

import pytest

from sqlq.common.errors import (
    DuplicateJobError,
    IllegalTransitionError,
    JobNotFoundError,
    StaleEpochError,
    StoreClosedError,
    UnencodableError,
)
from sqlq.common.models import State, Transition
from sqlq.common.store import JobStore
from tests.helpers import NOW, StoreFactory
from tests.store_contract_helpers import assert_reopened_holds, new_job


async def test_round_trip(store: JobStore) -> None:
    job = new_job(1, priority=3, max_attempts=2)
    await store.commit([job])
    assert await store.get(job.id) == job


async def test_unknown_id_is_none(store: JobStore) -> None:
    assert await store.get("nope") is None


async def test_empty_commit_is_a_noop_on_an_open_store_only(factory: StoreFactory) -> None:
    s = factory()
    await s.open()
    job = new_job()
    await s.commit([job])
    await s.commit([])  # nothing happens: the job is as it was, the store still takes work
    assert await s.get(job.id) == job
    await s.close()
    with pytest.raises(StoreClosedError):
        await s.commit([])  # closed comes before empty, on every engine


async def test_duplicate_submission_refused(store: JobStore) -> None:
    job = new_job()
    await store.commit([job])
    with pytest.raises(DuplicateJobError):
        await store.commit([job])


async def test_batch_is_all_or_nothing(store: JobStore) -> None:
    good = new_job(1)
    ghost = new_job(2).start(NOW)  # a transition for a job that does not exist
    with pytest.raises(JobNotFoundError):
        await store.commit([good, ghost])
    assert await store.get(good.id) is None


async def test_large_batch_is_all_or_nothing(store: JobStore) -> None:
    """Big enough that SQLite needs several statements; the last row is the bad one."""
    jobs = [new_job(i) for i in range(2500)]
    await store.commit(jobs[:1])
    with pytest.raises(DuplicateJobError):
        await store.commit(jobs[1:] + jobs[:1])
    assert [await store.get(j.id) for j in jobs[1:4]] == [None, None, None]
    assert await store.get(jobs[-1].id) is None
    await store.commit(jobs[1:])
    starts = [j.start(NOW + 1) for j in jobs]
    await store.commit(starts)
    got = await asyncio.gather(*(store.get(j.id) for j in jobs))  # reads overlap: no 2,500 trips
    assert [j.state if j else None for j in got] == [State.RUNNING] * len(jobs)


async def test_transitions_fold(store: JobStore) -> None:
    job = new_job()
    await store.commit([job])
    start = job.start(NOW + 1)
    await store.commit([start])
    running = await store.get(job.id)
    assert running is not None
    assert (running.state, running.attempts, running.epoch) == (State.RUNNING, 1, 0)
    assert running.started_at == NOW + 1
    await store.commit([running.complete({"ok": True}, NOW + 2)])
    done = await store.get(job.id)
    assert done is not None
    assert (done.state, done.result, done.updated_at) == (State.COMPLETED, {"ok": True}, NOW + 2)
    assert done.started_at == NOW + 1  # completion keeps when the attempt started


async def test_epoch_fences_a_stale_worker(store: JobStore) -> None:
    job = new_job()
    await store.commit([job])
    await store.commit([job.start(NOW)])
    running = await store.get(job.id)
    assert running is not None
    # The health loop requeues it (new epoch), and a worker picks it up again.
    await store.commit([running.retry("worker hung", NOW + 1, NOW + 1)])
    requeued = await store.get(job.id)
    assert requeued is not None
    assert requeued.epoch == 1
    await store.commit([requeued.start(NOW + 2)])
    # The first worker wakes up and tries to complete with the epoch it had.
    with pytest.raises(StaleEpochError):
        await store.commit([running.complete("late", NOW + 3)])
    current = await store.get(job.id)
    assert current is not None
    assert (current.state, current.epoch, current.result) == (State.RUNNING, 1, None)


async def test_illegal_transition_refused(store: JobStore) -> None:
    job = new_job()
    await store.commit([job])
    with pytest.raises(IllegalTransitionError):
        await store.commit([job.complete("skipped running", NOW)])
    assert await store.get(job.id) == job


async def test_terminal_states_are_final(store: JobStore) -> None:
    job = new_job()
    await store.commit([job])
    await store.commit([job.cancel(NOW)])
    cancelled = await store.get(job.id)
    assert cancelled is not None
    assert cancelled.state is State.CANCELLED
    with pytest.raises(IllegalTransitionError):
        await store.commit([cancelled.start(NOW)])


async def test_one_bad_caller_does_not_sink_its_batch(store: JobStore) -> None:
    jobs = [new_job(i) for i in range(50)]
    await store.commit(jobs)
    stale = Transition(
        job_id=jobs[7].id,
        expect_epoch=41,
        state=State.RUNNING,
        epoch=41,
        attempts=1,
        ready_at=NOW,
        updated_at=NOW,
        last_error=None,
        result=None,
    )
    calls = [store.commit([j.start(NOW)]) for j in jobs if j is not jobs[7]]
    calls.insert(7, store.commit([stale]))
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(outcomes[7], StaleEpochError)
    assert all(o is None for i, o in enumerate(outcomes) if i != 7)
    for i, job in enumerate(jobs):
        got = await store.get(job.id)
        assert got is not None
        assert got.state is (State.SCHEDULED if i == 7 else State.RUNNING)


@pytest.mark.parametrize("bad", [object(), "lone \udcff surrogate", {"k": {1: object()}}])
async def test_an_unencodable_value_fails_only_its_caller(store: JobStore, bad: object) -> None:
    """A handler's bad result must not fail the store: only that commit is refused."""
    jobs = [new_job(i) for i in range(20)]
    await store.commit(jobs)
    running = [j.apply(j.start(NOW)) for j in jobs]
    await store.commit([j.start(NOW) for j in jobs])
    results: list[object] = [{"i": i} for i in range(len(running))]
    results[5] = bad
    calls = [store.commit([r.complete(x, NOW + 1)]) for r, x in zip(running, results, strict=True)]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(outcomes[5], UnencodableError), outcomes[5]
    assert all(o is None for i, o in enumerate(outcomes) if i != 5), outcomes
    assert (await store.get(jobs[5].id)) == running[5]  # unchanged, still running
    later = new_job(99)
    await store.commit([later])  # the store is healthy
    assert await store.get(later.id) == later
    assert store.stats().failed is None


async def test_an_unencodable_value_leaves_a_durable_store_reopenable(
    reopen_factory: StoreFactory,
) -> None:
    s = reopen_factory()
    await s.open()
    job = new_job()
    await s.commit([job])
    await s.commit([job.start(NOW)])
    running = job.apply(job.start(NOW))
    with pytest.raises(UnencodableError):
        await s.commit([running.complete(object(), NOW + 1)])
    await s.commit([running.complete({"ok": 1}, NOW + 2)])
    await s.close()
    await assert_reopened_holds(
        reopen_factory(), {job.id: running.apply(running.complete({"ok": 1}, NOW + 2))}
    )


async def test_concurrent_commits_share_batches(store: JobStore) -> None:
    jobs = [new_job(i) for i in range(300)]
    await asyncio.gather(*(store.commit([j]) for j in jobs))
    for job in jobs:
        assert await store.get(job.id) == job
    stats = store.stats()
    if store.durable:
        assert stats.batches < len(jobs), stats  # group commit merged callers


async def test_closed_store_refuses(factory: StoreFactory) -> None:
    s = factory()
    await s.open()
    await s.close()
    with pytest.raises(StoreClosedError):
        await s.commit([new_job()])
    await s.close()  # idempotent
