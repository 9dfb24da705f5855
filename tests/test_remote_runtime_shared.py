"""Remote workers in shared mode, on a fake shared store (``tests/remote_fake_shared.py``):
two nodes over one database; a token one node issued is good on the other; the nodes'
own claimers never take a remote queue's job; heartbeats are one ``extend``; outcomes are
fenced writes; an expired remote lease is rescued through the retry policy; a forced
cancel holds the lease to its grace. The same on a real PostgreSQL: ``test_remote_shared.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sqlq.common.backoff import RetryPolicy
from sqlq.common.clock import FakeClock
from sqlq.common.errors import StoreUnavailableError
from sqlq.common.models import State
from sqlq.common.protocol import (
    FENCED,
    CompleteIn,
    FailIn,
    Outcome,
    OutcomesRequest,
    ProgressIn,
    ReleaseIn,
)
from sqlq.common.roles import ADMIN
from sqlq.runtime.service import Service
from sqlq.runtime.shared import SharedClaims
from tests.helpers import ServiceFactory, final, submit
from tests.remote_fake_shared import RemoteDatabase, RemoteFakeStore
from tests.remote_helpers import REMOTE, beat, claim, claim_one, report, stored


async def two_nodes(
    services: ServiceFactory, clock: FakeClock, db: RemoteDatabase, **config: Any
) -> tuple[Service, Service]:
    config.setdefault("remote_queues", REMOTE)
    config.setdefault("workers", 2)
    a = services(RemoteFakeStore(db, "a"), clock=clock, **config)
    b = services(RemoteFakeStore(db, "b"), clock=clock, **config)
    await a.start()
    await b.start()
    assert isinstance(a.claims, SharedClaims)
    return a, b


async def test_a_claim_on_one_node_is_reported_on_the_other(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    db = RemoteDatabase()
    a, b = await two_nodes(services, fake_clock, db)
    job = await submit(a, "anything", queue="r", args={"x": 1})
    g = await claim_one(a, lease_s=10)
    assert (g.job.id, g.job.holder, g.job.epoch) == (job.id, "worker:w1", 1)
    assert (await stored(b, job.id)).holder == "worker:w1"
    [hb] = await beat(b, g.token, progress=ProgressIn(percent=10))
    assert hb.error is None
    assert db.extends == 1
    waiting = asyncio.create_task(a.wait(job.id, 30))
    for _ in range(3):
        await asyncio.sleep(0)
    r = await report(b, g.token, CompleteIn(result="done"))
    assert r.state == "completed"
    heard = await waiting  # node a's waiter hears of it (its finished poll)
    assert heard is not None
    assert heard.result == "done"
    assert (await report(a, g.token, CompleteIn())).error == FENCED


async def test_the_nodes_own_workers_never_take_a_remote_queues_job(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    db = RemoteDatabase()
    a, _ = await two_nodes(services, fake_clock, db)
    remote = await submit(a, "sleep", queue="r")
    local = await submit(a, "sleep", queue="default")
    assert (await final(a, local.id)).state is State.COMPLETED
    assert (await stored(a, remote.id)).state is State.SCHEDULED
    assert (await claim_one(a)).job.id == remote.id


async def test_with_every_queue_remote_a_node_claims_nothing_in_process(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    db = RemoteDatabase()
    a, _ = await two_nodes(services, fake_clock, db, workers=0, remote_queues=frozenset())
    job = await submit(a, "anything", queue="any")
    fake_clock.advance(5)
    for _ in range(5):
        await asyncio.sleep(0)
    assert (await stored(a, job.id)).state is State.SCHEDULED
    assert (await claim_one(a, queues=("any",))).job.id == job.id


async def test_a_long_poll_is_woken_by_a_submit_on_another_node(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    db = RemoteDatabase()
    a, b = await two_nodes(services, fake_clock, db, poll_s=30.0)
    start = fake_clock.time()
    waiting = asyncio.create_task(claim(a, wait_s=20))
    for _ in range(5):
        await asyncio.sleep(0)
    job = await submit(b, "k", queue="r")  # b's commit NOTIFYs a
    [g] = await waiting
    assert g.job.id == job.id
    assert fake_clock.time() - start < 1
    assert await claim(a, wait_s=2) == []  # nothing came: empty after wait_s


async def test_an_expired_remote_lease_is_rescued_through_the_retry_policy(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    db = RemoteDatabase()
    a, b = await two_nodes(services, fake_clock, db, max_attempts=2, lease_s=4.0,
                           retry=RetryPolicy(base_s=1.0, jitter=0.0))  # fmt: skip
    job = await submit(a, "k", queue="r")
    g = await claim_one(a, lease_s=5)
    fake_clock.advance(7)  # past the lease; each node's rescue runs every lease_s / 4
    for _ in range(10):
        await asyncio.sleep(0)
    again = await stored(a, job.id)
    assert (again.state, again.attempts, again.last_error) == (
        State.SCHEDULED, 1, "lease expired: worker w1 went silent",
    )  # fmt: skip
    assert a.stats()["remote"]["expired"] + b.stats()["remote"]["expired"] == 1
    assert (await report(b, g.token, CompleteIn())).error == FENCED
    fake_clock.advance(10)
    await claim_one(b, lease_s=5)
    fake_clock.advance(7)
    for _ in range(10):
        await asyncio.sleep(0)
    assert (await stored(a, job.id)).state is State.DEAD


async def test_a_cancel_asked_on_one_node_reaches_the_heartbeat_on_the_other(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    db = RemoteDatabase()
    a, b = await two_nodes(services, fake_clock, db, cancel_grace_s=3.0)
    job = await submit(a, "k", queue="r")
    g = await claim_one(a, lease_s=60)
    asked = await b.cancel(job.id)
    assert asked.cancel_requested_at is not None
    [hb] = await beat(a, g.token)
    assert hb.cancel_requested
    assert (await report(a, g.token, FailIn(error="stopped"))).state == "cancelled"


async def test_a_forced_cancel_cuts_the_attempt_off_after_the_grace(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    db = RemoteDatabase()
    a, _ = await two_nodes(services, fake_clock, db, cancel_grace_s=3.0, lease_s=2.0)
    job = await submit(a, "k", queue="r")
    g = await claim_one(a, lease_s=60)
    forced = await a.cancel(job.id, force=True)
    assert forced.cancel_requested_at is not None
    assert (forced.cancel_forced, forced.lease_until) == (True, fake_clock.time() + 3.0)
    fake_clock.advance(1)
    [hb] = await beat(a, g.token)
    assert (hb.lease_until, hb.cancel_requested) == (forced.lease_until, True)  # held there
    fake_clock.advance(2.5)
    for _ in range(10):
        await asyncio.sleep(0)
    done = await stored(a, job.id)
    assert (done.state, done.attempts) == (State.CANCELLED, 1)
    assert done.last_error == "cancelled: forced after --cancel-grace"
    assert (a.stats()["remote"]["cut_off"], a.stats()["remote"]["expired"]) == (1, 0)
    assert (await report(a, g.token, CompleteIn())).error == FENCED


async def test_release_and_a_stale_token_on_another_node(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    db = RemoteDatabase()
    a, b = await two_nodes(services, fake_clock, db)
    job = await submit(a, "k", queue="r")
    g = await claim_one(a)
    assert (await report(b, g.token, ReleaseIn())).state == "scheduled"
    back = await stored(a, job.id)
    assert (back.state, back.attempts) == (State.SCHEDULED, 0)
    g2 = await claim_one(b, worker_name="w2")
    assert g2.job.epoch == g.job.epoch + 2  # the release bumps it, and so does a shared claim
    assert (await report(a, g.token, CompleteIn())).error == FENCED
    assert (await report(a, g2.token, CompleteIn())).state == "completed"


async def test_the_listing_marks_remote_queues_and_warns_as_in_local_mode(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    db = RemoteDatabase()
    a, _ = await two_nodes(services, fake_clock, db)
    await submit(a, "k", queue="r")
    queues = await a.queues()
    assert (queues["r"].remote, queues["r2"].remote) == (True, True)
    assert queues["r"].warning is not None
    assert queues["r2"].warning is None
    await claim_one(a)
    await submit(a, "k", queue="r")
    assert (await a.queues())["r"].warning is None


async def test_a_node_counts_no_held_jobs_in_shared_mode(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """A job claimed through a and ended through b is never heard of by a again: a shows
    no count it can't keep true (``WorkersSeen.counts_held``), however many workers come."""
    db = RemoteDatabase()
    a, b = await two_nodes(services, fake_clock, db)
    for i in range(5):
        await submit(a, "anything", queue="r")
        g = await claim_one(a, worker_name=f"host-{i}", lease_s=10)
        assert (await report(b, g.token, CompleteIn())).state == "completed"
    assert {w.name: w.held for w in a.remote.workers().workers} == {
        f"host-{i}": 0 for i in range(5)
    }
    assert not a.remote.seen.held
    assert not b.remote.seen.held


async def test_a_batch_whose_store_fails_one_item_answers_the_others(
    fake_clock: FakeClock, services: ServiceFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One outcome the database does not take (unavailable past its write deadline) is
    ``unavailable`` in a 200 answer whose other items landed, so the worker is told of them
    (asked again, they would be fenced); it reports that one again. Nothing landed: 503."""
    db = RemoteDatabase()
    a, _ = await two_nodes(services, fake_clock, db)
    for _ in range(2):
        await submit(a, "anything", queue="r")
    g1, g2 = await claim(a, max=2, lease_s=10)
    real = RemoteFakeStore.commit_fenced
    down = {g2.job.id}

    async def flaky(self: RemoteFakeStore, changes: Any, fence: Any) -> None:
        if any(getattr(c, "job_id", None) in down for c in changes):
            raise StoreUnavailableError("connection lost")
        await real(self, changes, fence)

    monkeypatch.setattr(RemoteFakeStore, "commit_fenced", flaky)
    both = OutcomesRequest(
        outcomes=[Outcome(token=g.token, complete=CompleteIn()) for g in (g1, g2)]
    )
    answer = await a.remote.outcomes(both, ADMIN)
    assert [(o.token, o.state, o.error) for o in answer.outcomes] == [
        (g1.token, "completed", None), (g2.token, None, "unavailable"),
    ]  # fmt: skip
    assert (await stored(a, g1.job.id)).state is State.COMPLETED
    assert (await stored(a, g2.job.id)).state is State.RUNNING
    second = OutcomesRequest(outcomes=both.outcomes[1:])
    with pytest.raises(StoreUnavailableError):  # nothing of it landed: the call fails whole
        await a.remote.outcomes(second, ADMIN)
    down.clear()
    [again] = (await a.remote.outcomes(second, ADMIN)).outcomes
    assert (again.state, again.error) == ("completed", None)


async def test_a_long_poll_does_not_spin_once_another_queues_job_fell_due(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """Review: the store's next due time is any queue's. Once it had passed and the claim
    found nothing for this worker's queues, the wait slept 1 ms, again and again until
    the cached time aged out (a poll): a spin. A past due time is waited on no more."""
    db = RemoteDatabase()
    a, _ = await two_nodes(services, fake_clock, db, poll_s=30.0, workers=0)
    await submit(a, "k", queue="other", delay_ms=1000)  # no one here runs it
    store = a.claims._store  # type: ignore[attr-defined]
    calls = 0
    claim_once = store.claim

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return await claim_once(*args, **kwargs)

    store.claim = counted
    assert await claim(a, wait_s=20) == []
    assert calls < 10  # woken at its due time once, then at the poll: not every 1 ms


async def test_a_long_poll_takes_each_delayed_job_as_it_falls_due(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """Review: a wait that waited on no past due time at all left the next delayed job of
    its own queue a poll late (t=21 for a job due at t=2). A past time is read again, once."""
    db = RemoteDatabase()
    a, _ = await two_nodes(services, fake_clock, db, poll_s=30.0, workers=0)
    t0 = fake_clock.time()
    await submit(a, "k", queue="r", delay_ms=1000)
    await submit(a, "k", queue="r", delay_ms=2000)
    [_] = await claim(a, wait_s=20)
    [_] = await claim(a, wait_s=20)
    assert fake_clock.time() - t0 < 3.0
