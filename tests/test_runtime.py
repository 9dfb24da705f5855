"""The runtime over every engine: lifecycle, retries, dead letters, hangs, restarts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from common.backoff import RetryPolicy
from common.models import State
from common.runtime.config import RuntimeConfig
from common.runtime.kinds import SLEEP, JobContext, Kind, Registry
from common.runtime.service import Service
from common.specs import JobSpec
from tests.conftest import StoreFactory, wait_for
from tests.runtime_helpers import final, submit

RuntimeFactory = Callable[..., Service]


@pytest.fixture
async def make_runtime(factory: StoreFactory) -> AsyncIterator[RuntimeFactory]:
    made: list[Service] = []

    def make(kinds: Registry | None = None, **config: Any) -> Service:
        config.setdefault("workers", 4)
        config.setdefault("seed", 1)
        config.setdefault("fault_injection", True)
        # The system clock: the dispatcher really sleeps until ready_at.
        rt = Service(factory(clock=_system()), RuntimeConfig(**config), kinds=kinds)
        made.append(rt)
        return rt

    yield make
    for rt in made:
        await rt.stop(0)


def _system() -> Any:
    from common.clock import SYSTEM_CLOCK

    return SYSTEM_CLOCK


async def test_all_jobs_complete(make_runtime: RuntimeFactory) -> None:
    rt = make_runtime(workers=8)
    await rt.start()
    jobs = await rt.submit([JobSpec(kind="sleep", args={"work_ms": 5}) for _ in range(200)])
    for job in jobs:
        done = await final(rt, job.id)
        assert done.state is State.COMPLETED
        assert done.result == {"slept_ms": 5}
        assert done.attempts == 1
    assert rt.stats()["jobs"]["completed"] == 200


async def test_always_failing_job_is_dead_lettered_after_max_attempts(
    make_runtime: RuntimeFactory,
) -> None:
    rt = make_runtime(max_attempts=3, retry=RetryPolicy(base_s=0.001))
    await rt.start()
    job = await submit(rt, args={"fail_prob": 1.0})
    done = await final(rt, job.id)
    assert done.state is State.DEAD
    assert done.attempts == 3
    assert done.last_error is not None
    assert "injected failure" in done.last_error
    assert rt.stats()["retried"] == 2


async def test_per_job_max_attempts_overrides_the_default(make_runtime: RuntimeFactory) -> None:
    rt = make_runtime(max_attempts=5, retry=RetryPolicy(base_s=0.001))
    await rt.start()
    job = await submit(rt, args={"fail_prob": 1.0}, max_attempts=2)
    assert (await final(rt, job.id)).attempts == 2


async def test_no_retries_dead_letters_at_first_failure(make_runtime: RuntimeFactory) -> None:
    rt = make_runtime(retry=RetryPolicy(retries=False))
    await rt.start()
    job = await submit(rt, args={"fail_prob": 1.0})
    done = await final(rt, job.id)
    assert (done.state, done.attempts) == (State.DEAD, 1)
    assert rt.stats()["retried"] == 0


async def test_hung_worker_is_replaced_and_its_job_requeued_with_a_new_epoch(
    make_runtime: RuntimeFactory,
) -> None:
    rt = make_runtime(workers=2, hb_timeout_s=0.05, max_attempts=2, retry=RetryPolicy(base_s=0.001))
    await rt.start()
    hanging = await submit(rt, args={"hang_prob": 1.0})
    others = await rt.submit([JobSpec(kind="sleep", args={"work_ms": 2}) for _ in range(20)])
    done = await final(rt, hanging.id)
    # It hung on both attempts: requeued once with a new epoch, then dead-lettered.
    assert (done.state, done.attempts) == (State.DEAD, 2)
    assert done.epoch == 2
    assert done.last_error is not None
    assert "hung" in done.last_error
    for job in others:
        assert (await final(rt, job.id)).state is State.COMPLETED
    workers = rt.stats()["workers"]
    assert workers["hung_declared"] == 2
    assert workers["replaced"] == 2
    assert workers["live"] == 2
    assert workers["max_live_seen"] <= 2
    assert rt.stats()["requeued_hung"] == 2


async def test_stale_worker_cannot_complete_a_requeued_job(make_runtime: RuntimeFactory) -> None:
    """A hung handler is cancelled; one that swallows the cancel and returns late is fenced."""
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
    rt = make_runtime(kinds=registry, workers=2, hb_timeout_s=0.05, retry=RetryPolicy(base_s=0.001))
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
    make_runtime: RuntimeFactory,
) -> None:
    rt = make_runtime(workers=4, hb_timeout_s=0.05)  # 4 workers, 2 cores: jobs queue for a CPU
    await rt.start()
    jobs = await rt.submit([JobSpec(kind="cpu", args={"rounds": 200_000}) for _ in range(4)])
    for job in jobs:
        done = await final(rt, job.id, within=60)
        assert done.state is State.COMPLETED
        assert done.attempts == 1
    assert rt.stats()["workers"]["hung_declared"] == 0


async def test_delayed_job_waits_and_an_earlier_one_wakes_the_dispatcher(
    make_runtime: RuntimeFactory,
) -> None:
    started: dict[str, float] = {}

    async def stamp(args: Any, ctx: JobContext) -> Any:
        started[ctx.job.id] = time.time()
        return None

    registry = Registry()
    registry.register(Kind("stamp", lambda a: a, stamp))
    rt = make_runtime(kinds=registry)
    await rt.start()
    late = await submit(rt, kind="stamp", delay_ms=30_000)
    soon = await submit(rt, kind="stamp", delay_ms=150)
    done = await final(rt, soon.id, within=10)
    assert started[soon.id] >= soon.ready_at
    assert done.state is State.COMPLETED
    current = await rt.get(late.id)
    assert current is not None
    assert current.state is State.SCHEDULED
    assert late.id not in started


async def test_immediate_jobs_skip_100k_delayed_ones(make_runtime: RuntimeFactory) -> None:
    rt = make_runtime(workers=8)
    await rt.start()
    for _ in range(10):
        await rt.submit(
            [JobSpec(kind="sleep", delay_ms=3_600_000) for _ in range(10_000)], batch=True
        )
    assert rt.claims.scheduler.sizes()["delayed"] == 100_000
    now_jobs = await rt.submit([JobSpec(kind="sleep") for _ in range(200)])
    for job in now_jobs:
        assert (await final(rt, job.id)).state is State.COMPLETED
    # Only the immediate jobs went through the dispatcher; the heap was never scanned.
    assert rt.claims.scheduler.dispatched == 200
    assert rt.claims.scheduler.sizes()["delayed"] == 100_000


async def test_cancel_a_scheduled_job(make_runtime: RuntimeFactory) -> None:
    rt = make_runtime()
    await rt.start()
    job = await submit(rt, delay_ms=60_000)
    cancelled = await rt.cancel(job.id)
    assert cancelled.state is State.CANCELLED
    got = await rt.get(job.id)
    assert got is not None
    assert got.state is State.CANCELLED


async def test_restart_requeues_only_unfinished_jobs(
    durable_engine: str, durable_factory: StoreFactory, tmp_path: Path
) -> None:
    engine, factory = durable_engine, durable_factory
    from common.clock import SYSTEM_CLOCK

    first = Service(factory(clock=SYSTEM_CLOCK), RuntimeConfig(workers=3, seed=1))
    await first.start()
    quick = await first.submit([JobSpec(kind="sleep", args={"work_ms": 1}) for _ in range(5)])
    for job in quick:
        await final(first, job.id)
    slow = await first.submit([JobSpec(kind="sleep", args={"work_ms": 60_000}) for _ in range(5)])
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


async def test_periodic_compaction_prunes_past_retention(engine: str, tmp_path: Path) -> None:
    from common.clock import FakeClock
    from sqlq.engines import make_store

    clock = FakeClock(time.time())
    store = make_store(engine, tmp_path, retention=60.0, clock=clock)
    rt = Service(store, RuntimeConfig(workers=2, compact_every_s=0.05), clock=clock)
    await rt.start()
    try:
        job = await submit(rt)
        await final(rt, job.id)
        clock.advance(3600)  # long past retention
        await wait_for(lambda: rt.live.totals["compactions"] >= 1, 10, "a periodic compaction")

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
