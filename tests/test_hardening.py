"""No single request or handler can fail the service (issue: safe to run for real).

Service-level: bad results, long and broken error text, handler limits, abandoned
work, the queue limit, fault injection, and the cancel/claim race.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from common.backoff import RetryPolicy
from common.engine.memory import MemoryStore
from common.errors import (
    IllegalTransitionError,
    JobRunningError,
    QueueFullError,
    StoreFailedError,
    ValidationError,
)
from common.models import MAX_ERROR_BYTES, Job, State, Transition
from common.runtime.config import RuntimeConfig
from common.runtime.kinds import JobContext, Registry, task
from common.runtime.service import Service
from common.specs import JobSpec
from common.store import Change, JobStore
from tests.helpers import ServiceFactory, final, submit, wait_for

FAST_RETRY = RetryPolicy(base_s=0.001, cap_s=0.002)


def handlers() -> Registry:
    """User handlers, registered the way a user module does with @task."""
    reg = Registry()

    @task(registry=reg)
    async def bad_result(args: Any) -> Any:
        return {"x": object()}

    @task(registry=reg)
    def surrogate_result(args: Any) -> Any:
        return "name-\udcff"

    @task(registry=reg)
    def broken_error(args: Any) -> Any:
        raise RuntimeError("file \udcff.txt: " + "é" * 10_000)

    @task(registry=reg)
    def half_second(args: Any) -> Any:  # a plain handler that never beats
        threading.Event().wait(0.5)
        return "done"

    @task(registry=reg)
    def together(args: Any) -> Any:  # passes only if 16 of these run at the same time
        BARRIER.wait()
        return "together"

    @task(registry=reg, timeout=0.1)
    def stuck_thread(args: Any, ctx: JobContext) -> Any:
        RELEASE.wait(30)
        return "late"

    @task(registry=reg, timeout=0.1)
    async def stuck_async(args: Any) -> Any:
        await asyncio.Event().wait()

    @task(registry=reg, hb_timeout=0.1, timeout=None)
    def beats_then_stops(args: Any, ctx: JobContext) -> Any:
        for _ in range(30):  # 0.3 s of beating: alive
            ctx.beat()
            threading.Event().wait(0.01)
        RELEASE.wait(30)  # then silent

    return reg


RELEASE = threading.Event()
BARRIER = threading.Barrier(16, timeout=20)


async def dead_after(rt: Service, kind: str, **spec: Any) -> Job:
    """Start ``rt``, submit one job, and return it once dead-lettered, with an error."""
    await rt.start()
    done = await final(rt, (await submit(rt, kind, **spec)).id)
    assert done.state is State.DEAD, done
    assert done.last_error is not None
    return done


@pytest.fixture
async def runtimes(services: ServiceFactory) -> AsyncIterator[ServiceFactory]:
    """Services with the handlers above; any thread still stuck is released at the end."""

    def make(store: JobStore | None = None, **config: Any) -> Service:
        config.setdefault("retry", FAST_RETRY)
        return services(store, kinds=handlers(), **config)

    RELEASE.clear()
    yield make
    RELEASE.set()


async def test_an_unencodable_result_fails_the_attempt_not_the_store(
    runtimes: ServiceFactory,
) -> None:
    rt = runtimes()
    await rt.start()
    bad = await submit(rt, "bad_result", max_attempts=3)
    sur = await submit(rt, "surrogate_result", max_attempts=2)
    done = await final(rt, bad.id)
    assert (done.state, done.attempts) == (State.DEAD, 3)
    assert done.last_error == "result is not JSON-serialisable: object"
    done = await final(rt, sur.id)
    assert done.state is State.DEAD
    assert done.last_error is not None
    assert done.last_error.startswith("result is not JSON-serialisable")
    assert rt.readiness() == (True, "ready")
    assert rt.liveness()[0]
    after = await submit(rt, "sleep")  # the store still takes work
    assert (await final(rt, after.id)).state is State.COMPLETED
    assert rt.stats()["unencodable_results"] == 5


async def test_error_text_is_cut_to_4k_and_lone_surrogates_are_stored_escaped(
    runtimes: ServiceFactory,
) -> None:
    rt = runtimes()
    done = await dead_after(rt, "broken_error", max_attempts=2)
    assert done.last_error is not None
    assert done.last_error.startswith("RuntimeError: file \\udcff.txt: éé")
    assert done.last_error.endswith("(truncated)")
    assert len(done.last_error.encode()) <= MAX_ERROR_BYTES
    assert rt.readiness()[0]


async def test_a_plain_half_second_handler_completes_first_time_with_default_flags(
    runtimes: ServiceFactory,
) -> None:
    rt = runtimes(retry=RetryPolicy())  # every other setting at its default too
    assert rt.config.hb_timeout_s == 0.2  # shorter than the handler: it must not matter
    await rt.start()
    jobs = await rt.submit([JobSpec(kind="half_second") for _ in range(8)])
    for job in jobs:
        done = await final(rt, job.id)
        assert (done.state, done.attempts, done.result) == (State.COMPLETED, 1, "done")
    assert rt.stats()["workers"]["hung_declared"] == 0


async def test_sync_handlers_get_a_thread_per_worker() -> None:
    """asyncio's default pool has cores + 4 threads; 16 workers must not queue behind 6."""
    BARRIER.reset()
    rt = Service(MemoryStore(), RuntimeConfig(workers=16, max_attempts=1), kinds=handlers())
    await rt.start()
    try:
        jobs = await rt.submit([JobSpec(kind="together") for _ in range(16)])
        for job in jobs:
            done = await final(rt, job.id, within=30)
            assert (done.state, done.result) == (State.COMPLETED, "together"), done.last_error
    finally:
        await rt.stop(0)


async def test_a_timed_out_thread_is_abandoned_and_counted(
    runtimes: ServiceFactory,
) -> None:
    rt = runtimes(max_abandoned=1)
    done = await dead_after(rt, "stuck_thread", max_attempts=2)
    assert done.attempts == 2
    assert done.last_error is not None
    assert done.last_error.startswith("timed out")
    stats = rt.stats()["workers"]
    assert stats["abandoned_threads_running"] == 2
    assert stats["timed_out"] == 2
    assert stats["live"] == 4  # replaced
    ok, reason = rt.readiness()
    assert not ok
    assert "abandoned" in reason
    RELEASE.set()  # the threads return; their results are dropped
    await wait_for(lambda: rt.executor.threads.abandoned == 0, 10, "abandoned threads to return")
    assert rt.readiness() == (True, "ready")
    got = await rt.get(done.id)
    assert got is not None
    assert got.result is None  # "late" was never stored


async def test_hung_async_handlers_are_cancelled_so_abandoned_tasks_do_not_pile_up(
    runtimes: ServiceFactory,
) -> None:
    rt = runtimes(workers=4, hb_timeout_s=0.05, fault_injection=True)
    await rt.start()
    hanging = await rt.submit(
        [JobSpec(kind="sleep", args={"hang_prob": 1.0}, max_attempts=4) for _ in range(10)]
    )
    timing_out = await submit(rt, "stuck_async", max_attempts=2)
    for job in [*hanging, timing_out]:
        assert (await final(rt, job.id)).state is State.DEAD
    await wait_for(lambda: not rt.pool.abandoned, 5, "cancelled workers to end")
    stats = rt.stats()["workers"]
    assert stats["hung_declared"] == 42
    assert stats["abandoned_still_running"] == 0
    assert stats["live"] == 4
    assert rt.readiness()[0]


async def test_a_handler_with_hb_timeout_is_judged_by_its_heartbeat(
    runtimes: ServiceFactory,
) -> None:
    done = await dead_after(runtimes(), "beats_then_stops", max_attempts=1)
    assert done.last_error is not None
    assert done.last_error.startswith("worker hung: no heartbeat")
    assert done.updated_at - done.created_at >= 0.3  # alive while it beat


def test_task_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="timeout"):
        task(registry=Registry(), timeout=0)
    with pytest.raises(ValueError, match="1 to 128"):
        task(name="k" * 129, registry=Registry())(lambda a: a)


async def test_fault_injection_is_refused_unless_the_server_allows_it(
    runtimes: ServiceFactory,
) -> None:
    rt = runtimes(fault_injection=False)
    await rt.start()
    for name in ("fail_prob", "hang_prob"):
        with pytest.raises(ValidationError) as err:
            await submit(rt, args={name: 0.5})
        assert err.value.field == f"args.{name}"
        assert "--fault-injection" in err.value.message
    await submit(rt, args={"work_ms": 1, "fail_prob": 0.0})  # zero is no injection
    assert rt.stats()["submitted"] == 1


async def test_the_queue_limit_refuses_whole_submissions(
    runtimes: ServiceFactory,
) -> None:
    rt = runtimes(max_queued=5)
    await rt.start()
    with pytest.raises(QueueFullError):
        await rt.submit([JobSpec(kind="sleep", delay_ms=60_000) for _ in range(6)], batch=True)
    assert rt.stats()["submitted"] == 0  # refused whole
    await rt.submit([JobSpec(kind="sleep", delay_ms=60_000) for _ in range(5)], batch=True)
    with pytest.raises(QueueFullError):
        await submit(rt, delay_ms=60_000)
    assert rt.stats()["refused_queue_full"] == 7
    assert len(rt.live) == 5  # acknowledged work untouched


class GatedStore:
    """A memory store whose commits moving a job to ``state`` wait for a gate, then
    go through, or fail with ``fail`` when it is given."""

    def __init__(self, state: State, fail: BaseException | None = None) -> None:
        self.inner = MemoryStore()
        self.state = state
        self.fail = fail
        self.gate = asyncio.Event()
        self.held = asyncio.Event()
        self.name, self.durable, self.sync = "memory", False, "full"

    def hold(self, changes: Sequence[Change]) -> bool:
        return any(isinstance(c, Transition) and c.state is self.state for c in changes)

    async def commit(self, changes: Sequence[Change]) -> None:
        if self.hold(changes):
            self.held.set()
            await self.gate.wait()
            if self.fail is not None:
                raise self.fail
        await self.inner.commit(changes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def cancel_held_while_due(
    runtimes: ServiceFactory, store: GatedStore
) -> tuple[Service, Job, asyncio.Future[Job]]:
    """A job whose cancel is not yet durable when it comes due and a worker passes it over."""
    rt = runtimes(store=store, workers=1)
    await rt.start()
    job = await submit(rt, delay_ms=300)
    cancel = asyncio.ensure_future(rt.cancel(job.id))
    await asyncio.wait_for(store.held.wait(), 5)
    await wait_for(lambda: job.id in rt.claims._skipped, 5, "the worker to pass it over")
    return rt, job, cancel


async def test_cancel_while_a_claim_is_in_flight_is_409_running(
    runtimes: ServiceFactory,
) -> None:
    store = GatedStore(State.RUNNING)
    rt = runtimes(store=store)
    await rt.start()
    job = await submit(rt, args={"work_ms": 1})
    await asyncio.wait_for(store.held.wait(), 5)  # a worker took it; its claim is not durable
    with pytest.raises(JobRunningError):
        await rt.cancel(job.id)
    store.gate.set()
    done = await final(rt, job.id)
    assert done.state is State.COMPLETED  # it ran, and nobody was told it was cancelled


async def test_a_job_whose_cancel_is_in_flight_never_starts(runtimes: ServiceFactory) -> None:
    store = GatedStore(State.CANCELLED)
    rt, job, cancel = await cancel_held_while_due(runtimes, store)
    with pytest.raises(IllegalTransitionError):
        await rt.cancel(job.id)  # a second cancel meanwhile is a conflict, not a second commit
    store.gate.set()
    assert (await cancel).state is State.CANCELLED
    got = await rt.get(job.id)
    assert got is not None
    assert (got.state, got.attempts) == (State.CANCELLED, 0)


async def test_a_failed_cancel_puts_a_passed_over_job_back(runtimes: ServiceFactory) -> None:
    store = GatedStore(State.CANCELLED, fail=StoreFailedError("injected"))
    rt, job, cancel = await cancel_held_while_due(runtimes, store)
    store.gate.set()
    with pytest.raises(StoreFailedError):
        await cancel
    done = await final(rt, job.id)  # it was put back, and ran
    assert done.state is State.COMPLETED


async def test_a_store_failure_during_a_claim_is_not_counted_as_fenced(
    runtimes: ServiceFactory,
) -> None:
    store = GatedStore(State.RUNNING, fail=StoreFailedError("injected"))
    store.gate.set()
    rt = runtimes(store=store, workers=1)
    await rt.start()
    await submit(rt, args={"work_ms": 1})
    await wait_for(lambda: rt.stats()["claim_failed"] == 1, 5, "the failed claim to be counted")
    assert rt.stats()["fenced"] == 0
