"""Shared mode: several nodes (``Service``s, each with its own store and connections) on one
real PostgreSQL database. What only a shared queue has to get right: claims, leases,
fencing, waking, priorities and caps across nodes, and connections that drop.

The kill -9 of whole nodes and of PostgreSQL itself is in ``test_shared_crash.py``.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import asyncpg
import pytest

from sqlq.common.errors import StaleEpochError, UnencodableError
from sqlq.common.models import Job, State
from sqlq.common.store import Fence
from sqlq.engines.postgres.store import PostgresStore
from tests import shared_helpers
from tests.helpers import NOW
from tests.shared_helpers import new_job

nodes = shared_helpers.nodes  # the fixture, by its name
stores = shared_helpers.stores  # the fixture, by its name


# -- the store's shared calls ---------------------------------------------------------------


async def test_no_job_is_claimed_twice_by_concurrent_claimers(stores: Any) -> None:
    first = await stores()
    jobs = [new_job(i) for i in range(3000)]
    await first.commit(jobs)
    claimers = [first, *[await stores() for _ in range(7)]]
    got: Counter[str] = Counter()

    async def drain(store: PostgresStore, rng: random.Random) -> None:
        while batch := await store.claim(rng.randint(1, 60), NOW, NOW + 60, {}):
            got.update(j.id for j in batch)
            assert all(j.state is State.RUNNING and j.epoch == 1 for j in batch)

    await asyncio.gather(*(drain(s, random.Random(i)) for i, s in enumerate(claimers)))
    assert set(got) == {j.id for j in jobs}
    assert max(got.values()) == 1, "a job was claimed twice"
    conn = await asyncpg.connect(first.dsn)
    try:
        nodes = await conn.fetchval("SELECT count(DISTINCT node) FROM jobs")
        unowned = await conn.fetchval("SELECT count(*) FROM jobs WHERE node IS NULL")
    finally:
        await conn.close()
    assert (nodes, unowned) == (8, 0)  # every claimer took some, every job has its claimer


async def test_a_claim_takes_priority_then_age_within_a_queue(stores: Any) -> None:
    s = await stores()
    low = [new_job(i, priority=0, ready_at=NOW - 10 + i) for i in range(5)]  # oldest first
    high = new_job(99, priority=5)
    await s.commit([*low, high])
    claimed = await s.claim(3, NOW, NOW + 60, {})
    assert [j.id for j in claimed] == [high.id, low[0].id, low[1].id]


async def test_an_expired_lease_is_rescued_and_the_late_outcome_is_fenced(stores: Any) -> None:
    a, b = await stores(), await stores()
    job = new_job(max_attempts=2)
    await a.commit([job])
    [held] = await a.claim(1, NOW, NOW + 5, {})
    assert await b.expired(NOW + 4, 10) == []  # still leased
    [late] = await b.expired(NOW + 6, 10)
    requeue = late.retry("lease expired", NOW + 6, NOW + 6)
    await b.commit_fenced([requeue], Fence(lease_before=NOW + 6))
    again = await a.get(job.id)
    assert again is not None
    assert (again.state, again.epoch, again.attempts) == (State.SCHEDULED, 2, 1)
    with pytest.raises(StaleEpochError):  # node a comes back with its result: refused
        await a.commit_fenced(
            [held.complete("late", NOW + 7)], Fence(holder=a.node, lease_from=NOW + 7)
        )
    [second] = await b.claim(1, NOW + 7, NOW + 12, {})
    assert (second.epoch, second.attempts) == (3, 2)
    with pytest.raises(StaleEpochError):  # b's lease has run out: its outcome is refused too
        await b.commit_fenced(
            [second.complete(1, NOW + 20)], Fence(holder=b.node, lease_from=NOW + 20)
        )
    await b.commit_fenced([second.complete(1, NOW + 8)], Fence(holder=b.node, lease_from=NOW + 8))
    done = await a.get(job.id)
    assert done is not None
    assert (done.state, done.result) == (State.COMPLETED, 1)


async def test_a_renewed_lease_is_not_rescued(stores: Any) -> None:
    a, b = await stores(), await stores()
    job = new_job()
    await a.commit([job])
    [held] = await a.claim(1, NOW, NOW + 5, {})
    [stale_view] = await b.expired(NOW + 6, 10)
    assert (await a.renew(NOW + 4, NOW + 20, [job.id])).renewed == 1  # lands before the rescue
    with pytest.raises(StaleEpochError):
        await b.commit_fenced(
            [stale_view.retry("lease expired", NOW + 6, NOW + 6)], Fence(lease_before=NOW + 6)
        )
    got = await a.get(job.id)
    assert got is not None
    assert got.state is State.RUNNING
    assert got.epoch == held.epoch


async def test_a_nul_in_a_text_column_fails_only_its_caller(stores: Any) -> None:
    s = await stores()
    good = [new_job(i) for i in range(5)]
    bad = Job.new(kind="nul\x00kind", args={}, now=NOW)
    outcomes = await asyncio.gather(
        *(s.commit([j]) for j in [*good[:2], bad, *good[2:]]), return_exceptions=True
    )
    assert isinstance(outcomes[2], UnencodableError), outcomes
    assert [o for i, o in enumerate(outcomes) if i != 2] == [None] * 5
    assert s.stats().failed is None
    assert await s.get(bad.id) is None


async def test_get_many_reads_the_jobs_named_in_their_order_in_one_statement(
    stores: Any,
) -> None:
    """What a remote worker's heartbeat is fenced against: one read for every item."""
    s = await stores()
    jobs = [new_job(i) for i in range(3)]
    await s.commit(jobs)
    ids = [jobs[2].id, "0" * 32, jobs[0].id, jobs[2].id]
    got = await s.get_many(ids)
    assert [j.id if j is not None else None for j in got] == [
        jobs[2].id, None, jobs[0].id, jobs[2].id,
    ]  # fmt: skip
    assert got[0] == await s.get(jobs[2].id)
    assert await s.get_many([]) == []
