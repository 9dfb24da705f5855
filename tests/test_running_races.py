"""A cancel racing an attempt's end: exactly one wins, and the job's state says which.

The store holds one chosen commit (``HeldStore``) so each order is forced, not
hoped for: the request first (the outcome is built from a claim that carries it,
so a failure ends the job cancelled and a success completed), or the outcome
first (the request then finds the job as the outcome left it).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from sqlq.common.backoff import RetryPolicy
from sqlq.common.clock import FakeClock
from sqlq.common.errors import IllegalTransitionError, StoreUnavailableError
from sqlq.common.models import Job, State, Transition
from sqlq.common.store import Change
from sqlq.runtime.kinds import JobContext, Registry, task
from sqlq.runtime.service import Service
from tests.helpers import ServiceFactory, StoreFactory, final, submit, wait_for
from tests.running_helpers import HeldStore, asks_cancel, cut_off, running


async def turns(n: int = 20) -> None:
    """Let every ready task run a few steps, without letting the fake clock move."""
    for _ in range(n):
        await asyncio.sleep(0)


def gated() -> tuple[Registry, asyncio.Event]:
    reg = Registry()
    go = asyncio.Event()

    @task(registry=reg)
    async def step(args: Any, ctx: JobContext) -> Any:
        await go.wait()
        if args.get("fail"):
            raise RuntimeError("failed on purpose")
        return "done"

    return reg, go


@pytest.mark.parametrize(("fail", "ends"), [(False, State.COMPLETED), (True, State.CANCELLED)])
async def test_a_request_written_first_decides_what_the_outcome_becomes(
    fake_clock: FakeClock, services: ServiceFactory, fail: bool, ends: State
) -> None:
    """The attempt ends while its request is not yet durable: its outcome was built from
    the marked claim, so a failure is withdrawn (never retried) and a success completes."""
    reg, go = gated()
    store = HeldStore(asks_cancel, clock=fake_clock)
    rt = services(store, clock=fake_clock, kinds=reg, max_attempts=3)
    await rt.start()
    job = await submit(rt, "step", args={"fail": fail})
    await running(rt, job.id)
    cancel = asyncio.ensure_future(rt.cancel(job.id))
    await asyncio.wait_for(store.held.wait(), 5)  # the request is on its way, not durable
    go.set()  # the handler ends now
    await turns()
    assert (await rt.store.get(job.id)).state is State.RUNNING  # type: ignore[union-attr]
    store.gate.set()
    asked = await cancel
    assert asked.state is State.RUNNING
    assert asked.cancel_requested_at is not None
    done = await final(rt, job.id)
    assert (done.state, done.attempts) == (ends, 1)
    assert done.cancel_requested_at == asked.cancel_requested_at
    assert rt.stats()["retried"] == 0
    assert rt.stats()["fenced"] == 0


async def test_a_completion_written_first_wins_and_the_cancel_is_refused(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    reg, go = gated()
    store = HeldStore(lambda t: t.state is State.COMPLETED, clock=fake_clock)
    rt = services(store, clock=fake_clock, kinds=reg)
    await rt.start()
    job = await submit(rt, "step")
    await running(rt, job.id)
    go.set()
    await asyncio.wait_for(store.held.wait(), 5)  # the outcome is built and on its way
    cancel = asyncio.ensure_future(rt.cancel(job.id))
    await turns()
    assert not cancel.done()  # it waits for the outcome in flight
    store.gate.set()
    with pytest.raises(IllegalTransitionError):
        await cancel
    done = await final(rt, job.id)
    assert (done.state, done.cancel_requested_at) == (State.COMPLETED, None)
    assert rt.stats()["cancel_requested"] == 0


async def test_a_retry_written_first_leaves_a_scheduled_job_the_cancel_then_cancels(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    reg, go = gated()
    store = HeldStore(lambda t: t.state is State.SCHEDULED, clock=fake_clock)
    rt = services(store, clock=fake_clock, kinds=reg, max_attempts=3,
                  retry=RetryPolicy(base_s=5.0))  # fmt: skip
    await rt.start()
    job = await submit(rt, "step", args={"fail": True})
    await running(rt, job.id)
    go.set()
    await asyncio.wait_for(store.held.wait(), 5)  # the retry is built and on its way
    cancel = asyncio.ensure_future(rt.cancel(job.id))
    await turns()
    store.gate.set()
    cancelled = await cancel
    assert (cancelled.state, cancelled.attempts, cancelled.cancel_requested_at) == (
        State.CANCELLED, 1, None,
    )  # fmt: skip
    assert [e.error for e in cancelled.errors] == ["RuntimeError: failed on purpose"]


async def test_a_job_found_running_with_a_cancel_asked_for_ends_cancelled_at_recovery(
    durable_engine: str, durable_factory: StoreFactory, tmp_path: Path
) -> None:
    """The request is durable before it is answered: a stop before the attempt ended
    leaves it on the running job, and recovery ends that job cancelled, not retried."""
    reg = Registry()
    release = threading.Event()

    @task(registry=reg)
    def deaf(args: Any, ctx: JobContext) -> Any:
        release.wait(30)  # never looks at ctx.cancelled
        return "late"

    async def ask(rt: Service, job: Job) -> Job:
        await running(rt, job.id)
        asked = await rt.cancel(job.id)
        assert asked.cancel_requested_at is not None
        return asked  # then the stop cuts the attempt off: no outcome is written

    second, job, asked = await cut_off(durable_factory, reg, "deaf", ask, release)
    assert asked is not None
    try:
        done = await second.get(job.id)
        assert done is not None
        assert (done.state, done.attempts, done.cancel_requested_at) == (
            State.CANCELLED, 1, asked.cancel_requested_at,
        )  # fmt: skip
        assert [e.error for e in done.errors] == ["interrupted: the server stopped"]
        stats = second.stats()
        assert (stats["cancelled_running"], stats["requeued_at_recovery"]) == (1, 0)
        assert stats["dead_at_recovery"] == 0
    finally:
        await second.stop(0)


async def test_a_cancelled_cpu_job_stops_its_process(services: ServiceFactory) -> None:
    """The child sees its stop flag within 1024 rounds: the job ends at once, and the one
    process of the pool is free for the next job."""
    rt = services(cpu_processes=1, workers=2)
    await rt.start()
    long = await submit(rt, "cpu", args={"rounds": 100_000_000})  # minutes of work
    await running(rt, long.id)
    await wait_for(lambda: rt.cpu._counters is not None and rt.cpu._counters[0] > 0, 30,
                   "the child to start computing")  # fmt: skip
    await rt.cancel(long.id)
    done = await final(rt, long.id, within=10)
    assert (done.state, done.attempts) == (State.CANCELLED, 1)
    short = await submit(rt, "cpu", args={"rounds": 10})
    assert (await final(rt, short.id, within=10)).state is State.COMPLETED


class FailOnce(HeldStore):
    """A store whose first write of a cancel request fails (the database out of reach)."""

    failed = False

    async def commit(self, changes: Sequence[Change]) -> None:
        if not self.failed and any(isinstance(c, Transition) and asks_cancel(c) for c in changes):
            self.failed = True
            raise StoreUnavailableError("down for a moment")
        await self.inner.commit(changes)


async def test_a_cancel_retried_after_its_write_failed_writes_it_again(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """The first DELETE's write fails (a 503); the client's retry must not answer "asked"
    from the mark in memory alone: it writes the request, and only then answers."""
    reg, _ = gated()
    store = FailOnce(clock=fake_clock)
    rt = services(store, clock=fake_clock, kinds=reg, max_attempts=3)
    await rt.start()
    job = await submit(rt, "step", args={})
    await running(rt, job.id)
    with pytest.raises(StoreUnavailableError):
        await rt.cancel(job.id)
    asked = await rt.cancel(job.id)
    assert asked.state is State.RUNNING
    assert asked.cancel_requested_at is not None
    stored = await store.inner.get(job.id)
    assert stored is not None
    assert stored.cancel_requested_at is not None  # durable before the 202
    done = await final(rt, job.id)  # its task was cancelled: the request was told
    assert (done.state, done.attempts) == (State.CANCELLED, 1)
