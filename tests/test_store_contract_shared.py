"""The ``SharedStore`` contract (what shared mode adds to ``JobStore``), run over the real
PostgreSQL engine and the two fakes that stand in for it in the runtime's tests
(``tests/fake_shared.py``, ``tests/remote_fake_shared.py``), so no fake can drift from what
it fakes. Speaks only the protocol.

Each fake runs the part of the contract it fakes: the small one has no leases that run
out (``LEASED`` leaves it out of those tests); the remote workers' one has them for
remote holders, as PostgreSQL has them for every holder.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from sqlq.common.errors import TransitionError
from sqlq.common.models import Job, State
from sqlq.common.protocol import remote_holder
from sqlq.common.running import Progress
from sqlq.common.store import Fence, SharedStore
from sqlq.engines.postgres.store import PostgresStore
from tests.fake_shared import Database, FakeSharedStore
from tests.helpers import NOW
from tests.remote_fake_shared import (
    LeasedDatabase,
    LeasedStore,
    RemoteDatabase,
    RemoteFakeStore,
)

Nodes = Callable[[str], "asyncio.Future[SharedStore]"]
ALL = ("postgres", "fake", "remote-fake", "leased-fake")
# leases that run out (for remote holders at least; leased-fake: for nodes too, as PostgreSQL)
LEASED = ("postgres", "remote-fake", "leased-fake")
NODE_LEASED = ("postgres", "leased-fake")  # a node's own leases run out too


def new_job(n: int = 0, **kw: Any) -> Job:
    return Job.new(kind="work", args={"n": n}, now=NOW - 1, **kw)


async def _nodes(kind: str, request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    made: list[Any] = []
    dsn = request.getfixturevalue("pg_db") if kind == "postgres" else ""
    db: Database = (LeasedDatabase() if kind == "leased-fake" else
                    RemoteDatabase() if kind == "remote-fake" else Database())  # fmt: skip

    async def node(name: str) -> SharedStore:
        store: Any
        if kind == "postgres":
            store = PostgresStore(dsn, node=name)
        elif kind == "remote-fake":
            store = RemoteFakeStore(db, name)  # type: ignore[arg-type]
        elif kind == "leased-fake":
            store = LeasedStore(db, name)  # type: ignore[arg-type]
        else:
            store = FakeSharedStore(db, name)
        await store.open()
        made.append(store)
        return store  # type: ignore[no-any-return]

    yield node
    for store in made:
        await store.close()


@pytest.fixture(params=ALL)
async def nodes(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    async for node in _nodes(request.param, request):
        yield node


@pytest.fixture(params=LEASED)
async def leased_nodes(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    async for node in _nodes(request.param, request):
        yield node


@pytest.fixture(params=NODE_LEASED)
async def node_leased(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    async for node in _nodes(request.param, request):
        yield node


async def test_a_claim_takes_due_jobs_running_for_this_node_with_a_new_epoch(nodes: Any) -> None:
    a = await nodes("a")
    due, later = new_job(1), Job.new(kind="work", args={}, now=NOW, ready_at=NOW + 60)
    await a.commit([due, later])
    [got] = await a.claim(10, NOW, NOW + 5, {})
    assert (got.id, got.state, got.epoch, got.attempts) == (due.id, State.RUNNING, 1, 1)
    assert got.holder == "a"  # this node, by its name
    assert await a.get(due.id) == got  # durable as returned
    assert await a.claim(10, NOW, NOW + 5, {}) == []  # the later one is not due
    assert await a.next_due(NOW) == later.ready_at


async def test_no_job_goes_to_two_nodes(nodes: Any) -> None:
    a, b = await nodes("a"), await nodes("b")
    jobs = [new_job(i) for i in range(40)]
    await a.commit(jobs)
    got = await asyncio.gather(*(s.claim(7, NOW, NOW + 5, {}) for s in (a, b, a, b, a, b, a)))
    ids = [j.id for batch in got for j in batch]
    assert sorted(ids) == sorted(j.id for j in jobs)  # every one, once


async def test_a_fenced_write_applies_only_for_the_holder(nodes: Any) -> None:
    a, b = await nodes("a"), await nodes("b")
    await a.commit([new_job()])
    [job] = await a.claim(1, NOW, NOW + 5, {})
    done = job.complete({"by": "b"}, NOW + 1)
    with pytest.raises(TransitionError):
        await b.commit_fenced([done], Fence(holder="b"))
    assert await a.get(job.id) == job  # nothing of it applied
    await a.commit_fenced([job.complete({"by": "a"}, NOW + 1)], Fence(holder="a"))
    stored = await a.get(job.id)
    assert stored is not None
    assert (stored.state, stored.result) == (State.COMPLETED, {"by": "a"})


async def test_a_renewal_counts_what_the_node_holds_stores_progress_and_says_cancels(
    nodes: Any,
) -> None:
    a, b = await nodes("a"), await nodes("b")
    await a.commit([new_job(1), new_job(2)])
    mine = await a.claim(2, NOW, NOW + 5, {})
    first, second = mine
    asked = await b.request_cancel(second.id, NOW + 1)  # from another node
    assert asked is not None
    assert (asked.state, asked.cancel_requested_at) == (State.RUNNING, NOW + 1)
    progress = Progress(percent=40.0, message="half", at=NOW + 2)
    renewal = await a.renew(NOW + 2, NOW + 7, [j.id for j in mine], {first.id: progress})
    assert renewal.renewed == 2
    assert renewal.cancel_asked == frozenset({second.id})
    assert renewal.lost == frozenset()
    stored = await b.get(first.id)
    assert stored is not None
    assert stored.progress == progress
    theirs = await b.renew(NOW + 2, NOW + 7, [first.id])
    assert (theirs.renewed, theirs.lost) == (0, frozenset({first.id}))  # not b's: lost to b


async def test_a_renewal_past_a_nodes_lease_extends_nothing_and_says_it_lost(
    node_leased: Any,
) -> None:
    """A node that renews too late (a partition, a pause) does not get its lease back: the
    job may be another node's by then. The renewal says so, and the node's attempt stops
    (``SharedClaims.renew``)."""
    a = await node_leased("a")
    await a.commit([new_job(1), new_job(2)])
    late, fine = await a.claim(2, NOW, NOW + 5, {})
    assert (await a.renew(NOW + 3, NOW + 8, [fine.id])).lost == frozenset()
    renewal = await a.renew(NOW + 6, NOW + 11, [late.id, fine.id])
    assert (renewal.renewed, renewal.lost) == (1, frozenset({late.id}))
    assert [j.id for j in await a.expired(NOW + 6, 10)] == [late.id]


async def test_a_cancel_asked_holds_while_it_runs_and_turns_a_retry_into_cancelled(
    nodes: Any,
) -> None:
    a = await nodes("a")
    await a.commit([new_job()])
    [job] = await a.claim(1, NOW, NOW + 5, {})
    await a.request_cancel(job.id, NOW + 1)
    retried = job.retry("RuntimeError: no", NOW + 2, NOW + 2)  # a holder that had not heard
    await a.commit_fenced([retried], Fence(holder="a"))
    stored = await a.get(job.id)
    assert stored is not None
    assert stored.state is State.CANCELLED


async def test_request_cancel_of_a_job_that_is_not_running_changes_nothing(nodes: Any) -> None:
    a = await nodes("a")
    job = new_job()
    await a.commit([job])
    assert await a.request_cancel(job.id, NOW) == job
    assert await a.request_cancel("0" * 32, NOW) is None


async def test_finished_and_get_many_read_many_jobs_by_id(nodes: Any) -> None:
    a = await nodes("a")
    jobs = [new_job(i) for i in range(3)]
    await a.commit(jobs)
    [running] = await a.claim(1, NOW, NOW + 5, {})
    await a.commit_fenced([running.complete(None, NOW + 1)], Fence(holder="a"))
    ended = await a.finished([j.id for j in jobs])
    assert [j.id for j in ended] == [running.id]
    got = await a.get_many([jobs[2].id, "0" * 32, running.id])
    assert [j.id if j is not None else None for j in got] == [jobs[2].id, None, running.id]


async def test_a_remote_holders_lease_runs_out_and_is_fenced_after(leased_nodes: Any) -> None:
    a = await leased_nodes("a")
    await a.commit([new_job()])
    holder = remote_holder("w1")
    [job] = await a.claim(1, NOW, NOW + 5, {}, only=["default"], holder=holder)
    assert (job.holder, job.lease_until) == (holder, NOW + 5)
    assert await a.expired(NOW + 4, 10) == []
    [gone] = await a.expired(NOW + 6, 10)
    assert gone.id == job.id
    late = job.complete(None, NOW + 6)
    with pytest.raises(TransitionError):
        await a.commit_fenced([late], Fence(holder=holder, lease_from=NOW + 6))
    rescue = job.retry("lease expired", NOW + 6, NOW + 6)
    await a.commit_fenced([rescue], Fence(lease_before=NOW + 6))  # a rescue: still run out
    stored = await a.get(job.id)
    assert stored is not None
    assert (stored.state, stored.epoch) == (State.SCHEDULED, 2)
