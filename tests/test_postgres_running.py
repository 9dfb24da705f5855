"""A running job in shared mode on PostgreSQL: a cancel asked for by any node, heard by its
holder (NOTIFY, and the renewal's answer when that is lost), and the two rules the batch
statement restates because another node may write the row between a holder's read and
its commit: the request sticks while the job runs, and a holder's failure, snooze or a
rescuer's requeue after it lands as cancelled."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import asyncpg
import msgspec
import pytest

from sqlq.common.backoff import RetryPolicy, after_failure, after_snooze
from sqlq.common.errors import StaleEpochError
from sqlq.common.models import Job, State
from sqlq.common.running import check_progress
from sqlq.common.store import Fence, Renewal
from sqlq.engines.postgres.batch import Encoded, move_all, move_one
from sqlq.engines.postgres.store import PostgresStore
from tests import shared_helpers
from tests.helpers import NOW, dead_root_cone, wait_for

stores = shared_helpers.stores  # the fixture, by its name
Stores = Callable[..., Any]
LEASE = NOW + 30


async def _held(store: PostgresStore, n: int = 1) -> list[Job]:
    """``n`` jobs submitted, then claimed by ``store``'s node (lease until LEASE)."""
    jobs = [Job.new(kind="k", args={"i": i}, now=NOW, max_attempts=3) for i in range(n)]
    await store.commit(jobs)
    held = await store.claim(n, NOW, LEASE, {})
    assert len(held) == n
    return held


def _mine(store: PostgresStore) -> Fence:
    """A holder's outcome fence, as SharedClaims writes one."""
    return Fence(holder=store.node, lease_from=NOW + 1)


async def _got(store: PostgresStore, job_id: str) -> Job:
    got = await store.get(job_id)
    assert got is not None
    return got


async def test_request_cancel_records_once_and_leaves_other_jobs_as_they_are(
    stores: Stores,
) -> None:
    a, b = await stores(node="a"), await stores(node="b")
    [job] = await _held(a)
    asked = await b.request_cancel(job.id, NOW + 2)  # any node may ask
    assert asked == msgspec.structs.replace(job, cancel_requested_at=NOW + 2, updated_at=NOW + 2)
    assert await _got(a, job.id) == asked
    assert await b.request_cancel(job.id, NOW + 3) == asked  # the first request's time holds
    waiting = Job.new(kind="k", args=None, now=NOW, ready_at=NOW + 999)
    await a.commit([waiting])
    assert await b.request_cancel(waiting.id, NOW + 2) == waiting  # not running: unchanged
    assert await b.request_cancel("0" * 32, NOW + 2) is None


async def test_the_holder_hears_a_cancel_and_no_other_node_does(stores: Stores) -> None:
    a, b = await stores(node="a"), await stores(node="b")
    heard: dict[str, list[str]] = {"a": [], "b": []}
    for name, store in (("a", a), ("b", b)):
        store.listen(lambda: None, heard[name].append)
    await wait_for(lambda: a._listener is not None and b._listener is not None, 10, "LISTEN")
    [job, other] = await _held(a, 2)
    await b.request_cancel(job.id, NOW + 2)
    await wait_for(lambda: heard["a"] == [job.id], 10, "a to hear the cancel")
    # Asking again sends nothing; a job no longer running is not asked. A payload that is no
    # request of ours (anyone may NOTIFY on the channel) is dropped.
    await b.request_cancel(job.id, NOW + 3)
    await a.commit_fenced([other.complete(None, NOW + 2)], _mine(a))
    await b.request_cancel(other.id, NOW + 3)
    conn = await asyncpg.connect(a.dsn)
    try:
        await conn.execute("SELECT pg_notify('sqlq_cancel', 'junk')")
        await conn.execute("""SELECT pg_notify('sqlq_cancel', '{"id": "x", "node": "b"}')""")
    finally:
        await conn.close()
    await wait_for(lambda: heard["b"] == ["x"], 10, "b to hear the one meant for it")
    assert heard == {"a": [job.id], "b": ["x"]}


async def test_a_store_that_listens_without_cancel_hears_wakes_only(stores: Stores) -> None:
    """The runtime of today calls ``listen(wake)``: that still works, and hears no cancel."""
    a = await stores(node="a")
    woken = asyncio.Event()
    a.listen(woken.set)
    await wait_for(lambda: a._listener is not None, 10, "LISTEN")
    woken.clear()
    [job] = await _held(a)
    await a.request_cancel(job.id, NOW + 2)
    await a.commit([Job.new(kind="k", args=None, now=NOW)])
    await asyncio.wait_for(woken.wait(), 10)


async def test_renewal_stores_progress_fenced_like_the_lease_and_answers_the_cancels(
    stores: Stores,
) -> None:
    a, b = await stores(node="a"), await stores(node="b")
    j1, j2, j3 = await _held(a, 3)
    p1, p2 = check_progress(10, "one", NOW + 1), check_progress(None, "two", NOW + 1)
    await b.request_cancel(j2.id, NOW + 1)
    renewal = await a.renew(NOW + 2, NOW + 40, [j1.id, j2.id], {j1.id: p1, j3.id: p2})
    assert renewal == Renewal(2, frozenset({j2.id}))
    got = {j.id: await _got(a, j.id) for j in (j1, j2, j3)}
    assert (got[j1.id].progress, got[j1.id].updated_at) == (p1, NOW + 2)
    assert got[j2.id].progress is None  # held but given none
    assert got[j3.id].progress is None  # given progress, but not among the held named
    # Another node's renewal, or this node's after the lease ran out, stores nothing.
    lost = Renewal(0, lost=frozenset({j1.id}))  # said so: the asking node's attempt stops
    assert await b.renew(NOW + 3, NOW + 50, [j1.id], {j1.id: p2}) == lost
    assert await a.renew(NOW + 41, NOW + 90, [j1.id], {j1.id: p2}) == lost
    assert (await _got(a, j1.id)).progress == p1


async def test_a_holder_that_did_not_hear_keeps_the_request_while_the_job_runs(
    stores: Stores,
) -> None:
    """Sticky cancel: the holder's touch, read before the request, clears nothing."""
    a, b = await stores(node="a"), await stores(node="b")
    [job] = await _held(a)
    await b.request_cancel(job.id, NOW + 2)
    progress = check_progress(50, None, NOW + 3)
    await a.commit_fenced([job.touch(NOW + 3, progress=progress, checkpoint={"n": 1})], _mine(a))
    got = await _got(a, job.id)
    assert (got.state, got.cancel_requested_at) == (State.RUNNING, NOW + 2)
    assert (got.progress, got.checkpoint, got.epoch) == (progress, {"n": 1}, job.epoch)
    done = job.complete({"ok": True}, NOW + 4)  # a success still ends completed
    await a.commit_fenced([done], _mine(a))
    got = await _got(a, job.id)
    assert (got.state, got.result, got.cancel_requested_at) == (State.COMPLETED, {"ok": True},
                                                               NOW + 2)  # fmt: skip


@pytest.mark.parametrize("ending", ["retry", "bury", "snooze"])
async def test_a_holder_that_did_not_hear_ends_the_job_cancelled(
    stores: Stores, ending: str
) -> None:
    """The cancel rule: the holder's failure or snooze, built from its read before the
    request, lands as cancelled, with the transition's epoch, errors and last_error."""
    a, b = await stores(node="a"), await stores(node="b")
    [job] = await _held(a)
    await b.request_cancel(job.id, NOW + 2)
    if ending == "retry":
        t = after_failure(job, "boom", NOW + 3, RetryPolicy(), random.Random(1))
        assert t.state is State.SCHEDULED
    elif ending == "bury":
        t = job.bury("boom", NOW + 3)
    else:
        t = after_snooze(job, 60.0, NOW + 3, max_snoozes=100)
        assert t.state is State.SCHEDULED
    await a.commit_fenced([t], _mine(a))
    got = await _got(a, job.id)
    expect = msgspec.structs.replace(
        job.apply(t), state=State.CANCELLED, cancel_requested_at=NOW + 2
    )
    assert got == expect
    assert (got.epoch, got.errors, got.last_error) == (t.epoch, t.errors, t.last_error)
    assert await a.claim(1, NOW + 999, NOW + 1030, {}) == []  # never run again
    with pytest.raises(StaleEpochError):  # its late outcome is fenced like any other
        await a.commit_fenced([job.complete(None, NOW + 4)], _mine(a))
    revived = got.apply(got.revive(NOW + 5))  # an operator's retry: the request is over
    await a.commit([got.revive(NOW + 5)])
    assert await _got(a, job.id) == revived
    assert revived.cancel_requested_at is None


async def test_a_rescued_job_whose_cancel_was_asked_for_is_cancelled_not_rerun(
    stores: Stores,
) -> None:
    a, b = await stores(node="a"), await stores(node="b")
    [job] = await _held(a)
    [expired] = await b.expired(LEASE + 1, 10)  # b reads the dead node's job ...
    await b.request_cancel(job.id, LEASE + 2)  # ... and someone asks before the requeue
    requeue = after_failure(expired, "its node died", LEASE + 3, RetryPolicy(), random.Random(2))
    assert requeue.state is State.SCHEDULED
    await b.commit_fenced([requeue], Fence(lease_before=LEASE + 1))
    got = await _got(b, job.id)
    assert (got.state, got.epoch, got.last_error) == (State.CANCELLED, requeue.epoch,
                                                      "its node died")  # fmt: skip
    assert got.all_attempts == 1


async def test_the_rules_hold_when_a_batch_is_redone_one_caller_at_a_time(
    stores: Stores,
) -> None:
    """A refused caller in a batch sends it down the slow path, which writes each caller's
    transitions on their own (``move_one``), with the same statement: the rule holds there."""
    a, b = await stores(node="a"), await stores(node="b")
    [job] = await _held(a)
    await b.request_cancel(job.id, NOW + 2)
    t = job.bury("boom", NOW + 3)
    encoded = Encoded([t], _mine(a))
    await move_one(await a._db.writer(), t, encoded.moves[0], encoded, a._db.pool)
    got = await _got(a, job.id)
    assert (got.state, got.epoch, got.cancel_requested_at) == (State.CANCELLED, t.epoch, NOW + 2)


async def test_a_cascades_moves_go_together_and_a_refused_one_is_named(stores: Stores) -> None:
    """A cascade's moves between two of its reads are one guarded statement
    (``batch.move_all``) under a savepoint; one a guard refuses undoes it, and each goes
    alone, which names it (the caller's transaction then rolls back whatever went)."""
    a = await stores(node="a")
    jobs = [Job.new(kind="k", args={}, now=NOW) for _ in range(3)]
    await a.commit(jobs)
    moves = [j.cancel(NOW + 1) for j in jobs]
    stale = msgspec.structs.replace(moves[1], expect_epoch=moves[1].expect_epoch + 1)
    conn = await a._db.writer()
    with pytest.raises(StaleEpochError, match=jobs[1].id):
        async with conn.transaction():
            await move_all(conn, [moves[0], stale, moves[2]], a._db.pool)
    for job in jobs:
        assert await _got(a, job.id) == job  # nothing of it written
    async with conn.transaction():
        await move_all(conn, moves, a._db.pool)
    for job, t in zip(jobs, moves, strict=True):
        assert await _got(a, job.id) == job.apply(t)


async def test_a_dead_roots_children_move_set_wise_not_one_by_one(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cascade's moves of 1,200 children go through ``move_all``'s one statement: the
    one-by-one ``move_one`` runs only for the root's own start and death."""
    from sqlq.engines.postgres import batch

    singles: list[str] = []
    one = batch.move_one

    async def counted(conn: asyncpg.Connection, t: Any, *args: Any) -> None:
        singles.append(t.job_id)
        await one(conn, t, *args)

    monkeypatch.setattr(batch, "move_one", counted)
    a = await stores(node="a")
    root, kids = await dead_root_cone(a, 1200)
    assert singles == [root.id, root.id]
    assert (await _got(a, kids[-1].id)).state is State.CANCELLED
