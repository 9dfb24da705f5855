"""Races of a remote claim in local mode: with a cancel of the same job (whichever commits
first decides, and the other follows it), a claim the store refuses in part, and the turns
themselves (``Serial``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.engine.memory import MemoryStore
from sqlq.common.errors import JobNotFoundError, StaleEpochError, StoreUnavailableError
from sqlq.common.models import State, Transition
from sqlq.common.protocol import FailIn
from sqlq.common.store import Change
from sqlq.runtime.remote_local import LocalSide
from sqlq.runtime.serial import Serial
from tests.helpers import ServiceFactory, submit
from tests.remote_helpers import claim, claim_one, remote_on, report, stored
from tests.running_helpers import HeldStore


async def test_a_claim_passes_over_a_job_whose_cancel_is_in_flight(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    store = HeldStore(lambda t: t.state is State.CANCELLED, clock=fake_clock)
    rt = await remote_on(services, store, fake_clock)
    job = await submit(rt, "k", queue="r")
    cancelling = asyncio.create_task(rt.cancel(job.id))
    await store.held.wait()  # the cancel's commit is in flight
    assert await claim(rt) == []  # passed over: the cancel decides
    store.gate.set()
    assert (await cancelling).state is State.CANCELLED
    assert (await stored(rt, job.id)).state is State.CANCELLED
    assert await claim(rt) == []


async def test_a_cancel_during_a_remote_claims_commit_becomes_a_request(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    store = HeldStore(lambda t: t.state is State.RUNNING and t.holder is not None,
                      clock=fake_clock)  # fmt: skip
    rt = await remote_on(services, store, fake_clock)
    job = await submit(rt, "k", queue="r")
    claiming = asyncio.create_task(claim_one(rt))
    await store.held.wait()  # the claim's commit is in flight
    cancelling = asyncio.create_task(rt.cancel(job.id))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not cancelling.done()  # it waits for the claim's turn
    store.pick = None
    store.gate.set()
    g = await claiming
    asked = await cancelling
    assert (asked.state, asked.cancel_requested_at is not None) == (State.RUNNING, True)
    assert (await report(rt, g.token, FailIn(error="stopped"))).state == "cancelled"


class Refusing(MemoryStore):
    """Refuses every commit that starts the job ``refused`` (as a store whose job moved on)."""

    refused = ""

    async def commit(self, changes: Sequence[Change]) -> None:
        if any(isinstance(c, Transition) and c.job_id == self.refused and
               c.state is State.RUNNING for c in changes):  # fmt: skip
            raise StaleEpochError(self.refused, "refused")
        await super().commit(changes)


async def test_a_claim_the_store_refuses_in_part_hands_out_the_rest(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """A call's claims go in one commit; refused, each goes alone and only the refused one is
    left out (its turn given back, its job untouched)."""
    store = Refusing(clock=fake_clock)
    rt = await remote_on(services, store, fake_clock)
    jobs = [await submit(rt, "k", queue="r") for _ in range(3)]
    store.refused = jobs[1].id
    granted = await claim(rt, max=3)
    assert sorted(g.job.id for g in granted) == sorted([jobs[0].id, jobs[2].id])
    left = await stored(rt, jobs[1].id)
    assert (left.state, left.attempts) == (State.SCHEDULED, 0)
    assert _all_given_back(rt)
    store.refused = ""
    assert await claim(rt, max=3) == []  # (a refused claim's job is not put back: as before)


async def test_a_calls_claims_are_one_commit(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    store = MemoryStore(clock=fake_clock)
    rt = await remote_on(services, store, fake_clock, 3)
    before = store.stats().to_dict()["commits"]
    assert len(await claim(rt, max=3)) == 3
    assert store.stats().to_dict()["commits"] == before + 1


class Failing(MemoryStore):
    """Fails every commit of more than one change with ``error`` (set by the test)."""

    error: Exception | None = None

    async def commit(self, changes: Sequence[Change]) -> None:
        if self.error is not None and len(changes) > 1:
            raise self.error
        await super().commit(changes)


async def _failing_claim(rt_store: tuple[Any, Failing], error: Exception) -> list[Any]:
    rt, store = rt_store
    for _ in range(3):
        await submit(rt, "k", queue="r")
    store.error = error
    return await claim(rt, max=3)


@pytest.fixture
async def failing(fake_clock: FakeClock, services: ServiceFactory) -> tuple[Any, Failing]:
    store = Failing(clock=fake_clock)
    rt = await remote_on(services, store, fake_clock)
    return rt, store


@pytest.mark.parametrize("error", [StoreUnavailableError("the disk is away"),
                                   RuntimeError("a bug")])  # fmt: skip
async def test_a_claim_commit_that_fails_gives_back_every_turn_and_count(
    failing: tuple[Any, Failing], error: Exception
) -> None:
    """Whatever the batch commit raises, no turn or cap count outlives it (a turn kept would
    hold the job's cancel and expiry for ever, a count the queue's room)."""
    with pytest.raises(type(error)):
        await _failing_claim(failing, error)
    assert _all_given_back(failing[0])


async def test_a_claim_commit_refused_as_missing_goes_one_by_one(
    failing: tuple[Any, Failing],
) -> None:
    """Refused as a value (the contract: nothing of the call applied), each goes alone."""
    assert len(await _failing_claim(failing, JobNotFoundError("0" * 32))) == 3
    assert _all_given_back(failing[0])


def _all_given_back(rt: Any) -> bool:
    """No job's turn held, no claim counted as being committed."""
    side = rt.claims.remote_side
    assert isinstance(side, LocalSide)
    return len(side.serial) == 0 and not side._starting


async def test_turns_are_taken_in_order_and_a_cancelled_waiter_passes_its_turn_on() -> None:
    serial = Serial()
    order: list[str] = []
    assert serial.try_take("j")
    assert not serial.try_take("j")

    async def write(name: str) -> None:
        await serial.take("j")
        try:
            order.append(name)
        finally:
            serial.give("j")

    first = asyncio.create_task(write("first"))
    gone = asyncio.create_task(write("gone"))
    last = asyncio.create_task(write("last"))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.sleep(0)
    serial.give("j")
    await asyncio.gather(first, last)
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert order == ["first", "last"]
    assert len(serial) == 0  # nothing held: nothing kept
    await serial.idle("j")
