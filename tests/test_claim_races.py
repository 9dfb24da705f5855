"""Hardening: the queue limit, and cancels and store failures racing a claim in flight."""

from __future__ import annotations

import asyncio

import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.errors import (
    IllegalTransitionError,
    QueueFullError,
    StoreFailedError,
)
from sqlq.common.models import State
from sqlq.common.specs import JobSpec
from tests import hardening_helpers
from tests.hardening_helpers import GatedStore, cancel_held_while_due
from tests.helpers import ServiceFactory, final, submit, wait_for

runtimes = hardening_helpers.runtimes  # the fixture, by its name


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


async def test_a_cancel_while_a_claim_is_in_flight_asks_the_attempt_to_stop(
    runtimes: ServiceFactory,
) -> None:
    """The worker holds the claim while it is not yet durable: the cancel marks that claim,
    waits for it to hold, then writes the request; the attempt is told and ends cancelled."""
    store = GatedStore(State.RUNNING)
    rt = runtimes(store=store)
    await rt.start()
    job = await submit(rt, args={"work_ms": 60_000})
    await asyncio.wait_for(store.held.wait(), 5)  # a worker took it; its claim is not durable
    cancel = asyncio.ensure_future(rt.cancel(job.id))
    for _ in range(50):  # loop turns, not time: the gate is shut, so it cannot end meanwhile
        await asyncio.sleep(0)
    assert not cancel.done()  # the request waits for the claim: nothing is told before
    store.gate.set()
    asked = await cancel
    assert (asked.state, asked.cancel_requested_at is not None) == (State.RUNNING, True)
    done = await final(rt, job.id)
    assert (done.state, done.attempts) == (State.CANCELLED, 1)


async def test_a_job_whose_cancel_is_in_flight_never_starts(
    runtimes: ServiceFactory, fake_clock: FakeClock
) -> None:
    store = GatedStore(State.CANCELLED)
    rt, job, cancel = await cancel_held_while_due(runtimes, store, fake_clock)
    with pytest.raises(IllegalTransitionError):
        await rt.cancel(job.id)  # a second cancel meanwhile is a conflict, not a second commit
    store.gate.set()
    assert (await cancel).state is State.CANCELLED
    got = await rt.get(job.id)
    assert got is not None
    assert (got.state, got.attempts) == (State.CANCELLED, 0)


async def test_a_failed_cancel_puts_a_passed_over_job_back(
    runtimes: ServiceFactory, fake_clock: FakeClock
) -> None:
    store = GatedStore(State.CANCELLED, fail=StoreFailedError("injected"))
    rt, job, cancel = await cancel_held_while_due(runtimes, store, fake_clock)
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
