"""Cancelling a running job in this process's worker pool, with real handlers: how an async
one's task and a sync one's ``ctx`` are told, a handler that catches the cancel, a request
asked twice, a bulk cancel, a stop on top of a request. (Before the claim, after the end,
forced, a claim given back under a cancel, for every holder: ``test_claims_contract.py``.)

On the memory engine and the injected clock unless durability is the point: a
test that asserts "promptly" asserts it in fake seconds, which only the code
under test can spend.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from sqlq.common.clock import FakeClock
from sqlq.common.models import State
from sqlq.common.specs import CancelSpec
from sqlq.runtime.kinds import JobContext, Registry, task
from tests.helpers import ServiceFactory, final, submit
from tests.running_helpers import cancelled_running, running


async def test_a_running_30_s_sleep_job_is_cancelled_within_a_heartbeat(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = services(clock=fake_clock)
    await rt.start()
    job = await submit(rt, args={"work_ms": 30_000})
    await running(rt, job.id)
    asked_at = fake_clock.time()
    asked = await rt.cancel(job.id)
    assert (asked.state, asked.cancel_requested_at) == (State.RUNNING, asked_at)
    done = await final(rt, job.id)
    assert (done.state, done.attempts, done.all_attempts) == (State.CANCELLED, 1, 1)
    assert done.updated_at - asked_at <= 0.010  # ended within one of sleep's beats
    assert done.last_error == "cancelled: a cancel was asked for while it ran"
    assert [e.attempt for e in done.errors] == [1]
    stats = rt.stats()
    assert (stats["cancel_requested"], stats["cancelled_running"]) == (1, 1)
    assert stats["jobs"]["cancelled"] == 1
    assert rt.pool.stats()["live"] == 4  # the worker went on to its next job: none replaced
    assert rt.pool.replaced == 0


async def test_an_async_handler_that_catches_the_cancel_and_returns_completes(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    reg = Registry()
    cleaned: list[str] = []

    @task(registry=reg)
    async def tidy(args: Any, ctx: JobContext) -> Any:
        try:
            await ctx.clock.sleep(3600)
        except asyncio.CancelledError:
            cleaned.append("cleaned up")
            await ctx.clock.sleep(1)  # awaits after catching it work: the cancel is spent
            return "partial"
        return "full"

    rt = services(clock=fake_clock, kinds=reg)
    await rt.start()
    done = await cancelled_running(rt, "tidy")
    assert (done.state, done.result, cleaned) == (State.COMPLETED, "partial", ["cleaned up"])
    assert done.cancel_requested_at is not None  # the record says it was asked
    # The worker took it as the attempt's end and carried on with the next job.
    again = await submit(rt, "sleep", args={"work_ms": 5})
    assert (await final(rt, again.id)).state is State.COMPLETED
    assert rt.pool.replaced == 0


async def test_a_sync_handler_is_told_through_ctx(services: ServiceFactory) -> None:
    reg = Registry()
    started = threading.Event()

    @task(registry=reg)
    def polite(args: Any, ctx: JobContext) -> Any:
        started.set()
        while True:
            if args["mode"] == "raise":
                ctx.raise_if_cancelled()
            elif ctx.cancelled:
                return "stopped early"
            time.sleep(0.001)

    rt = services(kinds=reg)
    await rt.start()
    raising = await submit(rt, "polite", args={"mode": "raise"})
    returning = await submit(rt, "polite", args={"mode": "return"})
    await running(rt, raising.id)
    await running(rt, returning.id)
    await rt.cancel(raising.id)
    await rt.cancel(returning.id)
    done = await final(rt, raising.id)
    assert (done.state, done.last_error) == (
        State.CANCELLED, "Cancelled: a cancel of this job was asked for",
    )  # fmt: skip
    done = await final(rt, returning.id)
    assert (done.state, done.result) == (State.COMPLETED, "stopped early")
    assert rt.executor.threads.abandoned == 0  # told, never cut off


async def test_a_forced_cancel_cuts_off_a_handler_that_ignores_it_after_the_grace(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """Through the real pool and a real task (the claims contract plays the handler
    itself): a handler that swallows the cancel's CancelledError is cut off by the health
    loop at the grace's end, and the job ends cancelled, one attempt."""
    reg = Registry()

    @task(registry=reg, timeout=None)
    async def stubborn(args: Any, ctx: JobContext) -> Any:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass  # ignores the request
        await asyncio.Event().wait()  # until cut off

    rt = services(clock=fake_clock, kinds=reg, cancel_grace_s=10.0)
    await rt.start()
    job = await submit(rt, "stubborn")
    await running(rt, job.id)
    asked_at = fake_clock.time()
    await rt.cancel(job.id, force=True)
    done = await final(rt, job.id)
    assert (done.state, done.attempts) == (State.CANCELLED, 1)
    assert done.last_error is not None
    assert done.last_error.startswith("cancelled: still running"), done.last_error
    hb = rt.config.hb_timeout_s
    assert 10.0 - 1e-3 <= done.updated_at - asked_at <= 10.0 + hb / 4  # the grace, then a look


async def test_a_cancel_asked_twice_writes_one_request(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    reg = Registry()

    @task(registry=reg)
    def slow(args: Any, ctx: JobContext) -> Any:
        while not ctx.cancelled:
            time.sleep(0.001)
        return "done"

    rt = services(clock=fake_clock, kinds=reg)
    await rt.start()
    job = await submit(rt, "slow")
    await running(rt, job.id)
    first, second = await asyncio.gather(rt.cancel(job.id), rt.cancel(job.id))
    assert first.cancel_requested_at == second.cancel_requested_at is not None
    assert rt.stats()["cancel_requested"] == 1
    assert (await final(rt, job.id)).state is State.COMPLETED


async def test_cancel_matching_cancels_the_scheduled_and_asks_the_running(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = services(clock=fake_clock, workers=2)
    await rt.start()
    waiting = [await submit(rt, delay_ms=60_000) for _ in range(3)]
    long = [await submit(rt, args={"work_ms": 600_000}) for _ in range(2)]
    other = await submit(rt, "cpu", delay_ms=60_000, args={"rounds": 1})
    for job in long:
        await running(rt, job.id)
    n = await rt.cancel_matching(CancelSpec(kind="sleep"))
    assert n == (3, 2)
    for job in [*waiting, *long]:
        assert (await final(rt, job.id)).state is State.CANCELLED
    assert (await rt.get(other.id)).state is State.SCHEDULED  # type: ignore[union-attr]
    assert await rt.cancel_matching(CancelSpec(state="running")) == (0, 0)
    assert await rt.cancel_matching(CancelSpec(state="scheduled", queue="default")) == (1, 0)


async def test_a_stop_while_a_handler_ignores_its_cancel_records_no_outcome(
    services: ServiceFactory,
) -> None:
    """The stop's cancellation is not the request's: the worker re-raises it, nothing is
    written, and the job is left running for recovery (which ends it cancelled)."""
    reg = Registry()
    ignored = asyncio.Event()

    @task(registry=reg, timeout=None)
    async def deaf(args: Any, ctx: JobContext) -> Any:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            ignored.set()  # ignores the request
        await asyncio.Event().wait()

    rt = services(kinds=reg)
    await rt.start()
    job = await submit(rt, "deaf")
    await running(rt, job.id)
    await rt.cancel(job.id)
    await asyncio.wait_for(ignored.wait(), 5)
    store = rt.store
    await rt.pool.stop(0)  # the stop's cancellation, on top of the request's
    await rt.claims.settle()
    left = await store.get(job.id)
    assert left is not None
    assert (left.state, left.cancel_requested_at is not None) == (State.RUNNING, True)
    assert rt.stats()["cancelled_running"] == 0
