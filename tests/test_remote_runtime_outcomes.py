"""A remote worker's outcomes in local mode, what only the protocol has: a waiter told, the
single form's body, ``retry_in_s`` and ``retry``, the bounds of a result and a checkpoint;
the fence's reasons (a lease run out before its expiry is written, a forged token, a worker
outside its queues); the batch form, in order. (What each outcome becomes, and the fence of
a stale attempt, for every holder: ``test_claims_contract.py``.)"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.engine.memory import MemoryStore
from sqlq.common.errors import UnencodableError
from sqlq.common.models import State, Transition
from sqlq.common.protocol import (
    FENCED,
    CheckpointIn,
    CompleteBody,
    CompleteIn,
    FailIn,
    Outcome,
    OutcomesRequest,
    ReleaseIn,
    SnoozeIn,
)
from sqlq.common.roles import ADMIN
from sqlq.common.store import Change
from sqlq.common.tokens import KEY_BYTES, Ticket, sign
from sqlq.runtime.remote import fence
from tests.helpers import ServiceFactory, submit
from tests.remote_helpers import claim, claim_one, remote_on, remote_service, report, stored, worker


async def test_complete_is_durable_and_a_waiter_hears_of_it(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    job = await submit(rt, "k", queue="r")
    g = await claim_one(rt)
    waiting = asyncio.create_task(rt.wait(job.id, 30))
    for _ in range(3):
        await asyncio.sleep(0)
    fake_clock.advance(2)
    r = await report(rt, g.token, CompleteIn(result={"n": 1}))
    assert (r.state, r.error, r.token) == ("completed", None, g.token)
    done = await stored(rt, job.id)
    assert (done.state, done.result, done.attempts, done.holder) == (
        State.COMPLETED, {"n": 1}, 1, None,
    )  # fmt: skip
    heard = await waiting
    assert heard is not None
    assert heard.state is State.COMPLETED
    assert rt.stats()["remote"]["complete"] == 1
    assert rt.stats()["jobs"]["completed"] == 1


async def test_the_single_forms_body_is_an_outcome_too(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    await submit(rt, "k", queue="r")
    g = await claim_one(rt)
    body = CompleteBody(token=g.token, result=7)
    assert (await report(rt, body.token, body)).state == "completed"


async def test_fail_with_retry_in_s_and_without_retry(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    a = await submit(rt, "k", queue="r")
    b = await submit(rt, "k", queue="r")
    ga, gb = await claim(rt, max=2)
    now = fake_clock.time()
    assert (await report(rt, ga.token, FailIn(error="later", retry_in_s=90))).state == "scheduled"
    assert (await stored(rt, a.id)).ready_at == now + 90
    assert (await report(rt, gb.token, FailIn(error="never", retry=False))).state == "dead"
    assert (await stored(rt, b.id)).attempts == 1


async def test_a_checkpoint_outside_its_bounds_is_invalid_and_keeps_the_last_one(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """(A checkpoint's durability and the next attempt's reading of it: the claims
    contract.)"""
    rt = await remote_service(services, fake_clock)
    job = await submit(rt, "k", queue="r")
    g = await claim_one(rt)
    assert (await report(rt, g.token, CheckpointIn(data={"step": 3}))).state == "running"
    bad = await report(rt, g.token, CheckpointIn(data=None))
    assert bad.error == "invalid"
    assert bad.detail is not None
    assert bad.detail.startswith("data: ")
    assert (await stored(rt, job.id)).checkpoint == {"step": 3}


async def test_a_result_past_the_stored_value_bounds_fails_the_attempt(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    job = await submit(rt, "k", queue="r")
    g = await claim_one(rt)
    deep: object = 1
    for _ in range(70):
        deep = [deep]
    assert (await report(rt, g.token, CompleteIn(result=deep))).state == "scheduled"
    failed = await stored(rt, job.id)
    assert failed.last_error is not None
    assert "bounds" in failed.last_error


def test_the_fence_names_why() -> None:
    ticket = Ticket("a" * 32, 3, 30.0)
    assert fence(None, ticket, 0.0) == "the job is finished or gone"


async def test_a_lease_run_out_is_fenced_even_before_its_expiry_is_written(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    await submit(rt, "k", queue="r")
    g = await claim_one(rt, lease_s=10)
    job = await stored(rt, g.job.id)
    ticket = Ticket(job.id, job.epoch, 10.0)
    assert fence(job, ticket, fake_clock.time() + 10) is None  # (the last instant holds)
    assert fence(job, ticket, fake_clock.time() + 10.5) == "the lease ran out"
    assert fence(job, Ticket(job.id, job.epoch + 1, 10.0), fake_clock.time()) is not None


async def test_a_forged_token_is_invalid_and_writes_nothing(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    job = await submit(rt, "k", queue="r")
    g = await claim_one(rt)
    forged = sign(b"\x01" * KEY_BYTES, job.id, g.job.epoch, 30)
    for token in (forged, "not-a-token", g.token[:-2] + "AA"):
        r = await report(rt, token, CompleteIn(result="forged"))
        assert r.error == "invalid"
        assert r.detail is not None
        assert r.detail.startswith("token: ")
    assert (await stored(rt, job.id)).state is State.RUNNING
    assert rt.stats()["remote"]["invalid"] == 3


async def test_a_worker_may_report_only_on_its_queues_jobs(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    job = await submit(rt, "k", queue="r")
    g = await claim_one(rt)
    r = await report(rt, g.token, CompleteIn(), who=worker("other", "r2"))
    assert r.error == "forbidden"
    assert (await stored(rt, job.id)).state is State.RUNNING
    assert (await report(rt, g.token, CompleteIn(), who=worker("mine", "r"))).state == "completed"


async def test_the_batch_form_answers_each_in_order(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    for _ in range(4):
        await submit(rt, "k", queue="r")
    g = await claim(rt, max=4)
    both = Outcome(token=g[2].token, complete=CompleteIn(), release=ReleaseIn())
    req = OutcomesRequest(outcomes=[
        Outcome(token=g[0].token, complete=CompleteIn(result=0)),
        Outcome(token=g[1].token, fail=FailIn(error="e", retry=False)),
        both,
        Outcome(token="nonsense", complete=CompleteIn()),
        Outcome(token=g[3].token, snooze=SnoozeIn(delay_s=5)),
        Outcome(token=g[0].token, complete=CompleteIn(result="again")),
    ])  # fmt: skip
    answer = await rt.remote.outcomes(req, ADMIN)
    assert [(a.token, a.state, a.error) for a in answer.outcomes] == [
        (g[0].token, "completed", None),
        (g[1].token, "dead", None),
        (g[2].token, None, "invalid"),
        ("nonsense", None, "invalid"),
        (g[3].token, "scheduled", None),
        (g[0].token, None, FENCED),  # the same token twice: its turn came after the first
    ]
    assert (await stored(rt, g[0].job.id)).result == 0
    assert (await stored(rt, g[2].job.id)).state is State.RUNNING


@pytest.mark.parametrize("n", [1, 50])
async def test_many_outcomes_at_once_all_land(
    fake_clock: FakeClock, services: ServiceFactory, n: int
) -> None:
    rt = await remote_service(services, fake_clock)
    for _ in range(n):
        await submit(rt, "k", queue="r")
    granted = await claim(rt, max=n)
    req = OutcomesRequest(outcomes=[Outcome(token=g.token, complete=CompleteIn(result=i))
                                    for i, g in enumerate(granted)])  # fmt: skip
    answer = await rt.remote.outcomes(req, ADMIN)
    assert [a.state for a in answer.outcomes] == ["completed"] * n
    for i, g in enumerate(granted):
        assert (await stored(rt, g.job.id)).result == i
    assert rt.remote.workers().workers[0].held == 0


class Unencoding(MemoryStore):
    """Cannot encode a completion whose result is ``"bad"`` (as a store whose encoder
    refuses a value), failing the whole commit it is in."""

    async def commit(self, changes: Sequence[Change]) -> None:
        if any(isinstance(c, Transition) and c.result == "bad" for c in changes):
            raise UnencodableError("result: bad")
        await super().commit(changes)


async def test_one_outcome_the_store_cannot_encode_fails_only_its_own_attempt(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """A call's outcomes go in one commit; refused as a value, each goes alone: the others
    land, and the one that cannot be stored fails its attempt (as in process)."""
    rt = await remote_on(services, Unencoding(clock=fake_clock), fake_clock, 3)
    g = await claim(rt, max=3)
    results = [1, "bad", 3]
    req = OutcomesRequest(outcomes=[Outcome(token=x.token, complete=CompleteIn(result=r))
                                    for x, r in zip(g, results, strict=True)])  # fmt: skip
    answer = await rt.remote.outcomes(req, ADMIN)
    assert [a.state for a in answer.outcomes] == ["completed", "scheduled", "completed"]
    bad = await stored(rt, g[1].job.id)
    assert (bad.last_error or "").startswith("result is not JSON-serialisable")
    assert [(await stored(rt, x.job.id)).result for x in (g[0], g[2])] == [1, 3]


async def test_a_calls_outcomes_are_one_commit(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    store = MemoryStore(clock=fake_clock)
    rt = await remote_on(services, store, fake_clock, 3)
    g = await claim(rt, max=3)
    before = store.stats().to_dict()["commits"]
    req = OutcomesRequest(outcomes=[Outcome(token=x.token, complete=CompleteIn()) for x in g])
    answer = await rt.remote.outcomes(req, ADMIN)
    assert [a.state for a in answer.outcomes] == ["completed"] * 3
    assert store.stats().to_dict()["commits"] == before + 1


class Breaking(MemoryStore):
    """Fails every commit of more than one change with a bug's exception."""

    async def commit(self, changes: Sequence[Change]) -> None:
        if len(changes) > 1:
            raise RuntimeError("a bug")
        await super().commit(changes)


async def test_an_outcome_batch_that_fails_unexpectedly_answers_each_item(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """Not a value the store refused, not the store gone: the items answer ``unavailable``
    (report them again) and the call fails whole as nothing landed, never a stray error."""
    rt = await remote_on(services, Breaking(clock=fake_clock), fake_clock, 2)
    g = [await claim_one(rt), await claim_one(rt)]  # one by one: a claim of two would fail
    req = OutcomesRequest(outcomes=[Outcome(token=x.token, complete=CompleteIn()) for x in g])
    with pytest.raises(RuntimeError, match="a bug"):
        await rt.remote.outcomes(req, ADMIN)
    assert len(rt.claims.remote_side.serial) == 0
    assert [(await stored(rt, x.job.id)).state for x in g] == [State.RUNNING] * 2
