"""The runtime: lifecycle, retries, dead letters, hangs, restarts.

On the memory engine (the contract suite covers every engine); restarts on the
durable ones.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from sqlq.common.backoff import RetryPolicy
from sqlq.common.clock import FakeClock
from sqlq.common.engine.memory import MemoryStore
from sqlq.common.models import Job, State
from sqlq.common.specs import JobSpec
from sqlq.common.store import Change
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.events import Event
from sqlq.runtime.kinds import SLEEP, JobContext, Kind, Registry, task
from sqlq.runtime.local import LocalClaims
from sqlq.runtime.service import Service
from tests.helpers import NOW, ServiceFactory, StoreFactory, final, submit, wait_for


async def test_all_jobs_complete(services: ServiceFactory) -> None:
    rt = services(workers=8)
    await rt.start()
    jobs = (await rt.submit([JobSpec(kind="sleep", args={"work_ms": 5}) for _ in range(200)]))[0]
    for job in jobs:
        done = await final(rt, job.id)
        assert done.state is State.COMPLETED
        assert done.result == {"slept_ms": 5}
        assert done.attempts == 1
    assert rt.stats()["jobs"]["completed"] == 200


async def test_always_failing_job_is_dead_lettered_after_max_attempts(
    services: ServiceFactory,
) -> None:
    rt = services(max_attempts=3, retry=RetryPolicy(base_s=0.001))
    await rt.start()
    job = await submit(rt, args={"fail_prob": 1.0})
    done = await final(rt, job.id)
    assert done.state is State.DEAD
    assert done.attempts == 3
    assert done.last_error is not None
    assert "injected failure" in done.last_error
    assert rt.stats()["retried"] == 2


async def test_per_job_max_attempts_overrides_the_default(services: ServiceFactory) -> None:
    rt = services(max_attempts=5, retry=RetryPolicy(base_s=0.001))
    await rt.start()
    job = await submit(rt, args={"fail_prob": 1.0}, max_attempts=2)
    assert (await final(rt, job.id)).attempts == 2


async def test_no_retries_dead_letters_at_first_failure(services: ServiceFactory) -> None:
    rt = services(retry=RetryPolicy(retries=False))
    await rt.start()
    job = await submit(rt, args={"fail_prob": 1.0})
    done = await final(rt, job.id)
    assert (done.state, done.attempts) == (State.DEAD, 1)
    assert rt.stats()["retried"] == 0


async def test_hung_worker_is_replaced_and_its_job_requeued_with_a_new_epoch(
    services: ServiceFactory,
) -> None:
    """On an injected clock: the health check is driven by hand, to the millisecond."""
    clock = FakeClock(NOW)
    retry = RetryPolicy(base_s=0.001, cap_s=0.001, jitter=0.0)
    rt = services(
        clock=clock, workers=2, healthcheck=False, hb_timeout_s=0.2, max_attempts=2, retry=retry
    )
    await rt.start()
    hanging = await submit(rt, args={"hang_prob": 1.0})
    await wait_for(lambda: rt.pool.busy() == 1, 5, "the job to start, and hang")
    clock.advance(0.2)  # silent for exactly the timeout: not yet hung
    assert rt.pool.check(clock.monotonic()) == []
    clock.advance(0.001)
    assert len(rt.pool.check(clock.monotonic())) == 1
    # Requeued with a new epoch, due 1 ms later on the injected clock.
    await wait_for(lambda: rt.stats()["retried"] == 1, 5, "the retry to be durable")
    assert rt.pool.busy() == 0
    clock.advance(0.001)
    await wait_for(lambda: rt.pool.busy() == 1, 5, "the second attempt to start")
    clock.advance(0.201)
    assert len(rt.pool.check(clock.monotonic())) == 1
    done = await final(rt, hanging.id)
    # It hung on both attempts: requeued once with a new epoch, then dead-lettered.
    assert (done.state, done.attempts, done.epoch) == (State.DEAD, 2, 2)
    assert done.last_error == "worker hung: no heartbeat for 201 ms"
    workers = rt.stats()["workers"]
    assert (workers["hung_declared"], workers["replaced"], workers["live"]) == (2, 2, 2)
    assert workers["max_live_seen"] <= 2
    assert rt.stats()["requeued_hung"] == 1  # (the second hang buried it: dead, not requeued)
    await wait_for(lambda: not rt.pool.abandoned, 5, "the hung tasks to be cancelled")


async def test_a_timeout_is_judged_on_the_injected_clock(services: ServiceFactory) -> None:
    registry = Registry()

    @task(registry=registry, timeout=5.0)
    async def busy(args: Any, ctx: JobContext) -> Any:
        while True:  # beats, so only the timeout can stop it
            ctx.beat()
            await asyncio.sleep(0.001)

    clock = FakeClock(NOW)
    rt = services(clock=clock, kinds=registry, healthcheck=False, max_attempts=1)
    await rt.start()
    job = await submit(rt, "busy")
    await wait_for(lambda: rt.pool.busy() == 1, 5, "the job to start")
    clock.advance(5.0)
    assert rt.pool.check(clock.monotonic()) == []
    clock.advance(0.5)
    assert len(rt.pool.check(clock.monotonic())) == 1
    done = await final(rt, job.id)
    assert done.state is State.DEAD
    assert done.last_error == "timed out: still running 0.500 s past its timeout"
    assert rt.stats()["workers"]["timed_out"] == 1


async def test_stale_worker_cannot_complete_a_requeued_job(
    services: ServiceFactory, fake_clock: FakeClock
) -> None:
    """A hung handler is cancelled; one that swallows the cancel and returns late is fenced.
    (On the fake clock: the heartbeat timeout and the retry's backoff take no real time.)"""
    release = asyncio.Event()
    calls: list[int] = []

    async def slow_then_fast(args: Any, ctx: JobContext) -> Any:
        calls.append(ctx.job.epoch)
        if len(calls) == 1:  # the first attempt goes silent and ignores its cancellation
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await release.wait()
            return "stale"
        return "fresh"

    registry = Registry()
    registry.register(Kind("flaky", lambda a: a, slow_then_fast))
    rt = services(
        kinds=registry, workers=2, hb_timeout_s=0.05, retry=RetryPolicy(base_s=0.001),
        clock=fake_clock,
    )  # fmt: skip
    await rt.start()
    job = await submit(rt, kind="flaky")
    done = await final(rt, job.id)
    assert (done.state, done.result, done.epoch) == (State.COMPLETED, "fresh", 1)
    assert rt.stats()["workers"]["abandoned_still_running"] == 1
    release.set()  # now the abandoned worker finishes with its old epoch
    await wait_for(lambda: rt.stats()["fenced"] == 1, 10, "the stale completion to be fenced")
    again = await rt.get(job.id)
    assert again is not None
    assert again.result == "fresh"
    assert calls == [0, 1]
    assert rt.stats()["workers"]["abandoned_still_running"] == 0


async def test_cpu_jobs_longer_than_the_heartbeat_timeout_are_not_hung(
    services: ServiceFactory,
) -> None:
    # 4 workers, 2 cores: jobs queue for a CPU. Each job (~1.5 s alone) outlasts the
    # timeout, and the second pair waits longer than it for a CPU; the timeout leaves room
    # for a loaded machine's pauses of the event loop (at 50 ms, and at 300 ms, a load
    # average of 10-13 declared a beating job hung now and then: a pause, not a hang).
    rt = services(workers=4, hb_timeout_s=1.0)
    await rt.start()
    jobs = (await rt.submit([JobSpec(kind="cpu", args={"rounds": 1_500_000}) for _ in range(4)]))[0]
    for job in jobs:
        done = await final(rt, job.id, within=60)
        assert done.state is State.COMPLETED
        assert done.attempts == 1
    assert rt.stats()["workers"]["hung_declared"] == 0


async def test_restart_requeues_only_unfinished_jobs(
    durable_engine: str, durable_factory: StoreFactory, tmp_path: Path
) -> None:
    engine, factory = durable_engine, durable_factory
    from sqlq.common.clock import SYSTEM_CLOCK

    first = Service(factory(clock=SYSTEM_CLOCK), RuntimeConfig(workers=3, seed=1))
    await first.start()
    quick = (await first.submit([JobSpec(kind="sleep", args={"work_ms": 1}) for _ in range(5)]))[0]
    for job in quick:
        await final(first, job.id)
    slow = (
        await first.submit([JobSpec(kind="sleep", args={"work_ms": 60_000}) for _ in range(5)])
    )[0]
    await wait_for(lambda: first.stats()["jobs"]["running"] == 3, 10, "3 running")
    await first.stop(grace_s=0)  # the 3 running jobs are left "running" in the store
    if engine == "walq":  # and the crash tore the last line
        with open(tmp_path / "walq" / "walq.log", "ab") as f:
            f.write(b'{"crc":"0000')

    second = Service(factory(clock=SYSTEM_CLOCK), RuntimeConfig(workers=3, seed=1))
    try:
        recovery = await second.start()
        assert len(recovery.running) == 3
        assert {j.id for j in recovery.jobs} == {j.id for j in slow}
        if engine == "walq":
            assert recovery.torn_bytes == len(b'{"crc":"0000')
        assert second.stats()["requeued_at_recovery"] == 3
        for job in quick:
            got = await second.get(job.id)
            assert got is not None
            assert (got.state, got.attempts) == (State.COMPLETED, 1)
        for job_id in recovery.running:
            got = await second.get(job_id)
            assert got is not None
            assert got.epoch == 1  # requeued with a new epoch
    finally:
        await second.stop(0)


async def test_periodic_compaction_prunes_past_retention(factory: StoreFactory) -> None:
    from sqlq.common.clock import FakeClock

    clock = FakeClock(time.time())
    store = factory(retention=60.0, clock=clock)
    rt = Service(store, RuntimeConfig(workers=2, compact_every_s=600), clock=clock)
    await rt.start()
    try:
        job = await submit(rt)
        await final(rt, job.id)
        assert rt.events.totals[Event.COMPACTED] == 0
        clock.advance(3600)  # long past retention, and past the compaction interval
        await wait_for(lambda: rt.events.totals[Event.COMPACTED] >= 1, 10, "a periodic compaction")

        async def gone() -> bool:
            return await rt.get(job.id) is None

        await wait_for(gone, 10, "the finished job to be pruned")
    finally:
        await rt.stop(0)


def test_registry_refuses_a_duplicate_kind() -> None:
    registry = Registry()
    registry.register(SLEEP)
    with pytest.raises(ValueError, match="already registered"):
        registry.register(SLEEP)


class Stalling(MemoryStore):
    """A memory store whose writes, but for submissions, wait while ``stalled``."""

    def __init__(self) -> None:
        super().__init__()
        self.flowing = asyncio.Event()
        self.flowing.set()

    async def commit(self, changes: Sequence[Change]) -> None:
        if not all(isinstance(c, Job) for c in changes):
            await self.flowing.wait()
        await super().commit(changes)


@pytest.mark.parametrize("bound", [16, 10_000])
async def test_a_store_slower_than_the_handlers_holds_the_workers_back(
    services: ServiceFactory, bound: int
) -> None:
    """Outcomes decided but not yet written are bounded (``ClaimsBase.max_outcomes``): past
    the bound no worker takes a claim, so a stalled store stalls the pool rather than
    growing a backlog of outcome tasks in memory; every job still ends once it is back.
    (The second case is the bound out of the way: the backlog is every job.)"""
    store = Stalling()
    rt = services(store, workers=8)
    claims = rt.claims
    assert isinstance(claims, LocalClaims)
    claims.max_outcomes = bound
    await rt.start()
    store.flowing.clear()
    jobs = (await rt.submit([JobSpec(kind="sleep") for _ in range(200)]))[0]
    peak = 0

    def stalled() -> bool:
        nonlocal peak
        pending = claims.outcomes_in_flight()
        peak = max(peak, pending)
        return pending >= min(bound, 200) and rt.pool.busy() == 0

    await wait_for(stalled, 10, "the workers to stop taking claims")
    assert peak <= min(bound + 8, 200)  # the bound, and what workers past a claim decided
    if bound > 200:
        assert peak == 200  # unbounded, every job's outcome waits in memory
    store.flowing.set()
    for job in jobs:
        assert (await final(rt, job.id)).state is State.COMPLETED
