"""The JobStore contract for what a running job carries: a cancel asked for, progress, a
checkpoint, snoozes, the errors of its attempts. Every engine stores these fields as a
transition gives them, fenced by the epoch, and gives them back after a reopen."""

from __future__ import annotations

import random

import pytest

from sqlq.common.backoff import RetryPolicy, after_failure, after_snooze
from sqlq.common.errors import IllegalTransitionError, StaleEpochError
from sqlq.common.models import Job, State, Transition
from sqlq.common.running import MAX_CHECKPOINT_BYTES, MAX_ERRORS, check_progress
from sqlq.common.store import JobStore
from tests.helpers import NOW, StoreFactory
from tests.store_contract_helpers import assert_reopened_holds, new_job

BIG_CHECKPOINT = {"blob": "x" * (MAX_CHECKPOINT_BYTES - 20), "i": 7}


async def _running(store: JobStore, job: Job | None = None) -> Job:
    job = job or new_job()
    await store.commit([job])
    t = job.start(NOW + 1)
    await store.commit([t])
    return job.apply(t)


async def _move(store: JobStore, job: Job, t: Transition) -> Job:
    await store.commit([t])
    got = await store.get(job.id)
    assert got is not None
    return got


async def test_running_fields_round_trip_and_survive_a_reopen(reopen_factory: StoreFactory) -> None:
    s = reopen_factory()
    await s.open()
    running = await _running(s)
    progress = check_progress(42.5, "half way \u00e9", NOW + 2)
    touched = running.apply(running.touch(NOW + 2, progress=progress, checkpoint=BIG_CHECKPOINT))
    got = await _move(s, running, running.touch(NOW + 2, progress=progress,
                                                checkpoint=BIG_CHECKPOINT))  # fmt: skip
    assert got == touched
    assert got.progress == progress
    assert got.checkpoint == BIG_CHECKPOINT
    asked = touched.apply(touched.request_cancel(NOW + 3))
    assert await _move(s, touched, touched.request_cancel(NOW + 3)) == asked
    assert asked.state is State.RUNNING
    assert asked.cancel_requested_at == NOW + 3
    await s.close()
    await assert_reopened_holds(reopen_factory(), {asked.id: asked})


async def test_a_failure_after_a_cancel_request_ends_cancelled(store: JobStore) -> None:
    running = await _running(store)
    asked = running.apply(running.request_cancel(NOW + 2))
    await store.commit([running.request_cancel(NOW + 2)])
    t = after_failure(asked, "CancelledError", NOW + 3, RetryPolicy(), random.Random(1))
    assert t.state is State.CANCELLED
    assert t.epoch == asked.epoch + 1
    await store.commit([t])
    got = await store.get(running.id)
    assert got == asked.apply(t)
    assert got is not None
    assert got.state is State.CANCELLED
    assert got.all_attempts == 1
    with pytest.raises(StaleEpochError):  # the attempt's late outcome is fenced
        await store.commit([asked.complete("late", NOW + 4)])


async def test_a_success_after_a_cancel_request_ends_completed(store: JobStore) -> None:
    running = await _running(store)
    asked = running.apply(running.request_cancel(NOW + 2))
    await store.commit([running.request_cancel(NOW + 2)])
    await store.commit([asked.complete({"ok": 1}, NOW + 3)])
    got = await store.get(running.id)
    assert got is not None
    assert got.state is State.COMPLETED
    assert got.result == {"ok": 1}


async def test_a_cancel_request_racing_an_outcome_one_wins(store: JobStore) -> None:
    """The outcome lands first: the request, built at the same epoch, is refused."""
    running = await _running(store)
    await store.commit([running.retry("boom", NOW + 9, NOW + 2)])
    with pytest.raises(StaleEpochError):
        await store.commit([running.request_cancel(NOW + 2)])
    done = await _running(store, new_job(2))
    await store.commit([done.complete(None, NOW + 2)])
    with pytest.raises(IllegalTransitionError):
        await store.commit([done.request_cancel(NOW + 3)])


async def test_a_stale_attempt_writes_no_progress_or_checkpoint(store: JobStore) -> None:
    running = await _running(store)
    await store.commit([running.retry("hung", NOW + 9, NOW + 2)])
    with pytest.raises(StaleEpochError):
        await store.commit([running.touch(NOW + 3, checkpoint={"stale": True})])
    got = await store.get(running.id)
    assert got is not None
    assert got.checkpoint is None
    assert got.progress is None


async def test_a_snooze_gives_the_attempt_back_and_keeps_the_checkpoint(
    reopen_factory: StoreFactory,
) -> None:
    s = reopen_factory()
    await s.open()
    job = await _running(s)
    for n in range(1, 4):
        saved = job.apply(job.touch(NOW + n, checkpoint={"n": n}))
        await s.commit([job.touch(NOW + n, checkpoint={"n": n})])
        t = after_snooze(saved, 30.0, NOW + n, max_snoozes=100)
        await s.commit([t])
        job = saved.apply(t)
        assert (job.state, job.attempts, job.snoozes) == (State.SCHEDULED, 0, n)
        t = job.start(NOW + n + 0.5)
        await s.commit([t])
        job = job.apply(t)
    t = job.complete({"done": True}, NOW + 9)
    await s.commit([t])
    done = job.apply(t)
    assert (done.state, done.attempts, done.snoozes, done.checkpoint) == (
        State.COMPLETED, 1, 3, None,
    )  # fmt: skip
    await s.close()
    await assert_reopened_holds(reopen_factory(), {done.id: done})


async def test_errors_keep_the_last_ten_and_attempts_total_counts_every_attempt(
    reopen_factory: StoreFactory,
) -> None:
    s = reopen_factory()
    await s.open()
    job = new_job(max_attempts=2)
    await s.commit([job])
    policy, rng = RetryPolicy(base_s=0), random.Random(3)
    for round_ in range(7):  # 7 budgets of 2 attempts: 14 failures, the last 10 kept
        for _ in range(2):
            t = job.start(NOW + round_)
            await s.commit([t])
            job = job.apply(t)
            t = after_failure(job, f"boom {round_} " + "\u00e9" * 2000, NOW + round_, policy, rng)
            await s.commit([t])
            job = job.apply(t)
        assert job.state is State.DEAD
        if round_ == 0:
            got = await s.get(job.id)
            assert got is not None
            assert got.all_attempts == 2
            assert len(got.errors) == 2
        if round_ < 6:
            t = job.revive(NOW + round_)
            await s.commit([t])
            job = job.apply(t)
    assert len(job.errors) == MAX_ERRORS
    assert job.all_attempts == 14
    assert [e.attempt for e in job.errors] == list(range(5, 15))
    assert all(len(e.error.encode()) <= 1024 for e in job.errors)
    assert await s.get(job.id) == job
    await s.close()
    await assert_reopened_holds(reopen_factory(), {job.id: job})


async def test_a_revived_job_forgets_the_cancel_request(store: JobStore) -> None:
    running = await _running(store)
    asked = running.apply(running.request_cancel(NOW + 2))
    await store.commit([running.request_cancel(NOW + 2)])
    t = asked.withdraw("cancelled", NOW + 3)
    await store.commit([t])
    gone = asked.apply(t)
    await store.commit([gone.revive(NOW + 4)])
    got = await store.get(running.id)
    assert got is not None
    assert got.cancel_requested_at is None
    assert got.state is State.SCHEDULED
    assert got.all_attempts == 1
    assert len(got.errors) == 1


async def test_a_second_start_at_the_same_epoch_is_refused(store: JobStore) -> None:
    """running -> running is legal only as the same attempt: a claim built again from the
    scheduled job (the same epoch) must not count a second attempt or wipe what the first
    carries."""
    job = new_job()
    await store.commit([job])
    await store.commit([job.start(NOW + 1)])
    running = job.apply(job.start(NOW + 1))
    await store.commit([running.touch(NOW + 2, checkpoint={"kept": True})])
    with pytest.raises(IllegalTransitionError):
        await store.commit([job.start(NOW + 3)])
    got = await store.get(job.id)
    assert got is not None
    assert (got.attempts, got.started_at, got.checkpoint) == (1, NOW + 1, {"kept": True})
