"""Remote workers in shared mode on a real PostgreSQL: two nodes over one database. A token
one node issued is good on the other; the nodes' own workers never take a remote queue's
job; a heartbeat is one ``extend``; a cancel asked on one node reaches the heartbeat on
the other, and a forced one holds the lease on every node; a silent worker's lease is
rescued through the retry policy and its late outcome is fenced; a claim waiting on one
node is woken by a submit on the other (NOTIFY).
The same on a fake store, step by step: ``test_remote_runtime_shared.py``.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.fair import Policy, Rate
from sqlq.common.models import State
from sqlq.common.protocol import FENCED, ClaimRequest, CompleteIn, FailIn, Outcome, ProgressIn
from sqlq.common.roles import ADMIN
from sqlq.runtime.remote import CUT_OFF_REASON
from sqlq.runtime.shared import SharedClaims
from tests import shared_helpers
from tests.helpers import NOW, final, wait_for
from tests.remote_helpers import REMOTE, beat, claim, claim_one, report, stored
from tests.shared_helpers import Node, submit

nodes = shared_helpers.nodes  # the fixture, by its name


async def test_a_claim_on_one_node_is_renewed_and_reported_on_the_other(nodes: Node) -> None:
    a = nodes(workers=1, remote_queues=REMOTE)
    b = nodes(workers=1, remote_queues=REMOTE)
    await a.start()
    await b.start()
    [remote_job] = await submit(a, queue="r", args={"name": "remote"})
    [local_job] = await submit(a, args={"name": "local"})
    assert (await final(a, local_job.id, within=10)).state is State.COMPLETED
    assert (await stored(a, remote_job.id)).state is State.SCHEDULED  # no node took it
    g = await claim_one(a, lease_s=30)
    assert (g.job.id, g.job.holder, g.job.state) == (remote_job.id, "worker:w1", State.RUNNING)
    [hb] = await beat(b, g.token, progress=ProgressIn(percent=40, message="on b"))
    assert hb.error is None
    assert hb.lease_until is not None
    assert hb.lease_until >= g.lease_until
    held = await stored(a, remote_job.id)
    assert (held.state, held.holder) == (State.RUNNING, "worker:w1")
    assert held.progress is not None
    assert held.progress.percent == 40
    assert (await report(b, g.token, CompleteIn(result={"on": "b"}))).state == "completed"
    done = await stored(a, remote_job.id)
    assert (done.state, done.result, done.attempts) == (State.COMPLETED, {"on": "b"}, 1)
    assert (await report(a, g.token, CompleteIn())).error == FENCED


async def test_a_cancel_asked_on_one_node_reaches_the_heartbeat_on_the_other(
    nodes: Node,
) -> None:
    a = nodes(workers=0, all_remote=False, remote_queues=REMOTE)
    b = nodes(workers=0, all_remote=False, remote_queues=REMOTE)
    await a.start()
    await b.start()
    [job] = await submit(a, queue="r")
    g = await claim_one(a, lease_s=30)
    asked = await b.cancel(job.id)
    assert asked.cancel_requested_at is not None
    [hb] = await beat(a, g.token)
    assert hb.cancel_requested
    assert (await report(a, g.token, FailIn(error="stopped"))).state == "cancelled"


async def test_a_silent_workers_lease_is_rescued_and_its_late_outcome_fenced(
    nodes: Node,
) -> None:
    clock = FakeClock(NOW)
    a = nodes(workers=0, all_remote=False, remote_queues=REMOTE, clock=clock, max_attempts=2)
    await a.start()
    assert isinstance(a.claims, SharedClaims)
    a.claims.by_hand()  # this test rescues, step by step
    [job] = await submit(a, queue="r")
    g = await claim_one(a, lease_s=5)
    clock.advance(6)
    assert await a.claims.rescue() == 1
    again = await stored(a, job.id)
    assert (again.state, again.attempts, again.last_error) == (
        State.SCHEDULED, 1, "lease expired: worker w1 went silent",
    )  # fmt: skip
    assert a.stats()["remote"]["expired"] == 1
    assert (await report(a, g.token, CompleteIn(result="late"))).error == FENCED
    clock.advance(1)  # past the retry's backoff
    g2 = await claim_one(a, worker_name="w2", lease_s=5)
    assert g2.job.epoch > g.job.epoch
    clock.advance(6)
    assert await a.claims.rescue() == 1
    assert (await stored(a, job.id)).state is State.DEAD


async def test_a_waiting_claim_on_one_node_is_woken_by_a_submit_on_the_other(
    nodes: Node,
) -> None:
    a = nodes(workers=0, all_remote=False, remote_queues=REMOTE, poll_s=30.0)
    b = nodes(workers=0, all_remote=False, remote_queues=REMOTE, poll_s=30.0)
    await a.start()
    await b.start()
    t0 = time.monotonic()
    waiting = asyncio.create_task(claim(a, wait_s=20))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    [job] = await submit(b, queue="r")
    [g] = await asyncio.wait_for(waiting, 10)
    assert g.job.id == job.id
    assert time.monotonic() - t0 < 10  # the NOTIFY, not the 30 s poll


async def test_a_kinds_filter_and_several_queues(nodes: Node) -> None:
    a = nodes(workers=0, all_remote=False, remote_queues=REMOTE)
    await a.start()
    [first] = await submit(a, queue="r")
    [other] = await submit(a, queue="r2", priority=3)
    got = await claim(a, ("r", "r2"), max=5, kinds=["work"])
    assert [g.job.id for g in got] == [other.id, first.id]
    [none] = await submit(a, queue="r")
    assert await claim(a, kinds=["something-else"]) == []
    assert (await claim_one(a)).job.id == none.id


async def test_a_forced_cancel_cuts_the_remote_attempt_off_after_the_grace(
    nodes: Node,
) -> None:
    clock = FakeClock(NOW)
    a = nodes(workers=0, all_remote=False, remote_queues=REMOTE, clock=clock,
              cancel_grace_s=3.0)  # fmt: skip
    await a.start()
    assert isinstance(a.claims, SharedClaims)
    a.claims.by_hand()
    [job] = await submit(a, queue="r")
    g = await claim_one(a, lease_s=600)
    forced = await a.cancel(job.id, force=True)
    assert (forced.cancel_forced, forced.lease_until) == (True, clock.time() + 3.0)
    clock.advance(1)
    [hb] = await beat(a, g.token)
    assert (hb.lease_until, hb.cancel_requested) == (forced.lease_until, True)  # held there
    clock.advance(2.5)
    await a.claims.remote_side.drain()  # (the cut-off's write)
    done = await stored(a, job.id)
    assert (done.state, done.attempts) == (State.CANCELLED, 1)
    assert (await report(a, g.token, CompleteIn())).error == FENCED


async def test_a_forced_cancel_holds_on_every_node_and_any_node_cuts_it_off(
    nodes: Node,
) -> None:
    """The hold is in the row (``cancel_forced``), not in the forcing node: node a forces
    and stops before the grace is over (its timer gone with it); a heartbeat that reaches
    node b renews nothing; at the grace's end b's rescue ends the attempt cancelled,
    counted as cut off by the forced cancel, not as an expired lease."""
    clock = FakeClock(NOW)
    a = nodes(workers=0, all_remote=False, remote_queues=REMOTE, clock=clock,
              cancel_grace_s=3.0)  # fmt: skip
    b = nodes(workers=0, all_remote=False, remote_queues=REMOTE, clock=clock,
              cancel_grace_s=3.0)  # fmt: skip
    await a.start()
    await b.start()
    for node in (a, b):
        assert isinstance(node.claims, SharedClaims)
        node.claims.by_hand()  # this test rescues, step by step
    [job] = await submit(a, queue="r")
    g = await claim_one(a, lease_s=600)
    forced = await a.cancel(job.id, force=True)
    grace_end = clock.time() + 3.0
    assert (forced.cancel_forced, forced.lease_until) == (True, grace_end)
    await a.stop(0)  # the forcing node is gone before the grace's end
    clock.advance(1)
    [hb] = await beat(b, g.token)
    assert (hb.error, hb.lease_until, hb.cancel_requested) == (None, grace_end, True)
    held = await stored(b, job.id)
    assert (held.state, held.cancel_forced, held.lease_until) == (State.RUNNING, True, grace_end)
    assert isinstance(b.claims, SharedClaims)
    assert await b.claims.rescue() == 0  # not yet: the grace holds
    clock.advance(2.5)  # past the grace's end
    assert await b.claims.rescue() == 1
    done = await stored(b, job.id)
    assert (done.state, done.attempts, done.last_error, done.cancel_forced) == (
        State.CANCELLED, 1, CUT_OFF_REASON, False,
    )  # fmt: skip
    assert (b.stats()["remote"]["cut_off"], b.stats()["remote"]["expired"]) == (1, 0)
    assert (await report(b, g.token, CompleteIn())).error == FENCED


async def test_a_claim_carrying_outcomes_lands_them_and_claims_more_across_nodes(
    nodes: Node,
) -> None:
    """Outcomes of jobs claimed on node a ride a claim made on node b: each lands once
    (asked again, fenced), and the claim takes the next jobs, none of the finished."""
    a = nodes(workers=0, all_remote=False, remote_queues=REMOTE)
    b = nodes(workers=0, all_remote=False, remote_queues=REMOTE)
    await a.start()
    await b.start()
    jobs = await submit(a, 4, queue="r")
    first = await claim(a, max=2, lease_s=30)
    outcomes = [Outcome(token=g.token, complete=CompleteIn(result=i)) for i, g in enumerate(first)]
    answer = await b.remote.claim(
        ClaimRequest(queues=["r"], worker="w1", max=5, outcomes=outcomes), ADMIN
    )
    assert [r.state for r in answer.outcomes or []] == ["completed", "completed"]
    assert [(await stored(a, g.job.id)).result for g in first] == [0, 1]
    assert {g.job.id for g in answer.claims} == {j.id for j in jobs} - {g.job.id for g in first}
    again = await b.remote.claim(
        ClaimRequest(queues=["r"], worker="w1", max=5, outcomes=outcomes), ADMIN
    )
    assert [r.error for r in again.outcomes or []] == [FENCED, FENCED]
    assert again.claims == []


async def test_a_waiting_claim_on_a_rate_held_key_wakes_at_its_token(nodes: Node) -> None:
    """Fair claims (#37): a remote long-poll that a key's bucket holds back wakes when its
    token comes (the round leaves it, the wait reads it again), not at the 30 s poll."""
    a = nodes(workers=0, all_remote=False, remote_queues=REMOTE, poll_s=30.0)
    await a.start()
    await a.set_policy("r", Policy(rate=Rate(per_s=4.0, burst=1)))
    jobs = [*await submit(a, queue="r", key="A"), *await submit(a, queue="r", key="A")]
    first = await claim_one(a)
    [g] = await asyncio.wait_for(claim(a, wait_s=20), 10)  # its token: 0.25 s on
    assert {first.job.id, g.job.id} == {j.id for j in jobs}


async def test_a_waiting_claim_on_a_full_key_wakes_when_a_slot_comes_free(nodes: Node) -> None:
    """An attempt's end that frees a slot of a key under key_concurrency rings the waiting
    claims, not the 30 s poll."""
    a = nodes(workers=0, all_remote=False, remote_queues=REMOTE, poll_s=30.0)
    await a.start()
    await a.set_policy("r", Policy(key_concurrency=1))
    await submit(a, queue="r", key="A")
    [second] = await submit(a, queue="r", key="A")
    first = await claim_one(a)
    assert await claim(a) == []  # A is full
    waiting = asyncio.create_task(claim(a, wait_s=20))
    await wait_for(lambda: a.remote.waiting() == 1, 10)
    assert (await report(a, first.token, CompleteIn())).state == "completed"
    [g] = await asyncio.wait_for(waiting, 10)
    assert g.job.id == second.id


async def test_a_waiting_claim_sweeps_on_to_a_due_job_past_its_window(
    nodes: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past WALK_KEYS keys a round reads a window; one short of jobs says "at once" for the
    keys after it. A remote long poll read that as a token already past and waited its
    30 s poll a window: a due job behind windows of delayed jobs took minutes."""
    from sqlq.engines.postgres import fair as pg_fair

    monkeypatch.setattr(pg_fair, "WALK_KEYS", 2)
    a = nodes(workers=0, all_remote=False, remote_queues=REMOTE, poll_s=30.0)
    await a.start()
    await a.set_policy("r", Policy(key_concurrency=100))
    for i in range(8):  # (four windows of keys with no due job)
        await submit(a, queue="r", key=f"a{i}", delay_ms=3_600_000)
    [late] = await submit(a, queue="r", key="z")
    [g] = await asyncio.wait_for(claim(a, wait_s=20), 10)
    assert g.job.id == late.id


async def test_a_key_held_in_an_earlier_window_wakes_the_claim_at_its_token(
    nodes: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of short rounds kept only its last window's token: a key its bucket held back
    in an earlier window waited for the 30 s poll. The run now reports its earliest."""
    from sqlq.engines.postgres import fair as pg_fair

    monkeypatch.setattr(pg_fair, "WALK_KEYS", 2)
    a = nodes(workers=0, all_remote=False, remote_queues=REMOTE, poll_s=30.0)
    await a.start()
    await a.set_policy("r", Policy(rate=Rate(per_s=4.0, burst=1)))
    jobs = [*await submit(a, queue="r", key="A"), *await submit(a, queue="r", key="A")]
    for i in range(6):  # (the windows after A's: keys with no due job)
        await submit(a, queue="r", key=f"b{i}", delay_ms=3_600_000)
    first = await claim_one(a)
    [g] = await asyncio.wait_for(claim(a, wait_s=20), 10)  # its token: 0.25 s on
    assert {first.job.id, g.job.id} == {j.id for j in jobs}
