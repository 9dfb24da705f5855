"""The JobStore contract for remote workers (issue 23): a running job's holder and lease,
and the signing key of claim tokens.

Every engine stores a remote claim's holder and lease whole, renews the lease, clears both
when the job leaves running, and keeps them through a close and reopen (a local durable
engine's recovery reports the job in ``running``: the runtime keeps it running while its
lease holds). In a local engine the claim is a transition (``Job.start(holder=...,
lease_until=...)``) and the renewal one too (``Job.renew``); in PostgreSQL they are its
own calls (``claim(holder=...)``, ``extend``), because its claim and renewal statements
own the columns. A forced cancel's hold on that lease (``cancel_forced``: no renewal moves
it, leaving running clears it) is stored alike, through a reopen too: a transition
(``Job.force_cancel``) locally, ``request_cancel(forced_until=...)`` in PostgreSQL. The
signing key is 32 bytes, the same for the life of a store, and the same after a reopen on
every durable engine.

Then what only PostgreSQL does: the claim's filters (``only``, ``besides``, ``kinds``,
``holder``, a capped queue's path too), ``extend``'s fence (a stale epoch, another holder,
an expired lease each left out of the answer), and one key for every node.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import cast

import pytest

from sqlq.common.models import Job, State
from sqlq.common.protocol import remote_holder
from sqlq.common.running import check_progress
from sqlq.common.store import Extended, Fence, JobStore, Lease, SharedStore
from sqlq.common.tokens import KEY_BYTES
from sqlq.engines.postgres.queries import Q
from sqlq.engines.postgres.store import PostgresStore
from sqlq.engines.registry import DURABLE
from sqlq.walq.signing import KEY_NAME
from sqlq.walq.store import WalStore
from tests.helpers import NOW, StoreFactory
from tests.store_contract_helpers import assert_reopened_holds, new_job

WORKER = remote_holder("w1")
LEASE = NOW + 30


async def _remote_start(store: JobStore, job: Job, lease_until: float = LEASE) -> Job:
    """``job`` (committed, due) claimed by the remote worker ``WORKER``: the job as the
    store now holds it."""
    if store.shared:
        [claimed] = await cast(SharedStore, store).claim(1, NOW + 1, lease_until, {},
                                                         holder=WORKER)  # fmt: skip
        assert claimed.id == job.id
    else:
        t = job.start(NOW + 1, holder=WORKER, lease_until=lease_until)
        await store.commit([t])
        claimed = job.apply(t)
    got = await store.get(job.id)
    assert got == claimed
    return claimed


async def _renew(store: JobStore, held: Job, lease_until: float) -> Job:
    if store.shared:
        lease = Lease(held.id, held.epoch, WORKER, lease_until)
        longest = max(lease_until, held.lease_until or lease_until)  # never shortened
        assert await cast(SharedStore, store).extend(NOW + 2, [lease]) == [
            Extended(held.id, longest, False)
        ]
    else:
        await store.commit([held.renew(NOW + 2, lease_until)])
    got = await store.get(held.id)
    assert got is not None
    return got


async def test_a_remote_claim_stores_its_holder_and_lease_and_renews_it(store: JobStore) -> None:
    job = new_job()
    await store.commit([job])
    held = await _remote_start(store, job)
    assert (held.state, held.holder, held.lease_until) == (State.RUNNING, WORKER, LEASE)
    assert (held.attempts, held.started_at) == (1, NOW + 1)
    renewed = await _renew(store, held, LEASE + 30)
    assert (renewed.state, renewed.holder, renewed.lease_until) == (
        State.RUNNING, WORKER, LEASE + 30,
    )  # fmt: skip
    assert (renewed.epoch, renewed.attempts, renewed.started_at) == (
        held.epoch, held.attempts, held.started_at,
    )  # fmt: skip
    again = await _renew(store, renewed, LEASE + 10)  # never shortened
    assert again.lease_until == LEASE + 30


@pytest.mark.parametrize("end", ["complete", "retry", "bury", "release", "withdraw"])
async def test_leaving_running_clears_the_holder_and_lease(store: JobStore, end: str) -> None:
    job = new_job()
    await store.commit([job])
    held = await _remote_start(store, job)
    t = {
        "complete": lambda: held.complete({"ok": 1}, NOW + 3),
        "retry": lambda: held.retry("boom", NOW + 10, NOW + 3),
        "bury": lambda: held.bury("boom", NOW + 3),
        "release": lambda: held.release(NOW + 3),
        "withdraw": lambda: held.withdraw("asked", NOW + 3),
    }[end]()
    assert (t.holder, t.lease_until) == (None, None)
    if store.shared:  # as the runtime writes a remote outcome: fenced on its holder
        await cast(SharedStore, store).commit_fenced([t], Fence(holder=WORKER, lease_from=NOW + 3))
    else:
        await store.commit([t])
    got = await store.get(job.id)
    assert got == held.apply(t)
    assert got is not None
    assert (got.holder, got.lease_until) == (None, None)


async def test_a_move_that_stays_running_keeps_the_holder_and_lease(store: JobStore) -> None:
    """A checkpoint, progress or a cancel asked for (running -> running) leaves the claim as
    it is: in PostgreSQL because the row keeps its own, elsewhere because the move says so."""
    job = new_job()
    await store.commit([job])
    held = await _remote_start(store, job)
    touch = held.touch(NOW + 2, progress=check_progress(50, "half", NOW + 2),
                       checkpoint={"page": 2})  # fmt: skip
    await store.commit([touch])
    asked = held.apply(touch)
    await store.commit([asked.request_cancel(NOW + 3)])
    got = await store.get(job.id)
    assert got == asked.apply(asked.request_cancel(NOW + 3))
    assert got is not None
    assert (got.holder, got.lease_until, got.checkpoint) == (WORKER, LEASE, {"page": 2})


async def test_the_holder_and_lease_survive_a_close_and_reopen(
    reopen_factory: StoreFactory,
) -> None:
    s = reopen_factory()
    await s.open()
    remote, local = new_job(1), new_job(2, priority=-1)  # the remote claim takes the first
    await s.commit([remote, local])
    held = await _remote_start(s, remote)
    renewed = await _renew(s, held, LEASE + 60)
    await s.close()
    again = reopen_factory()
    recovery = await again.open()
    try:
        assert await again.get(remote.id) == renewed
        assert (renewed.holder, renewed.lease_until) == (WORKER, LEASE + 60)
        if not again.shared:  # found running: the runtime tells remote from in-process by it
            assert recovery.running == [remote.id]
    finally:
        await again.close()
    await assert_reopened_holds(reopen_factory(), {remote.id: renewed, local.id: local})


async def _force(store: JobStore, held: Job, until: float) -> Job:
    """A forced cancel of the remotely held ``held``, its lease held at ``until``: a
    transition in a local engine (``Job.force_cancel``), its own call in PostgreSQL
    (``request_cancel``: the row's lease is its statements'); the job as stored."""
    want = held.apply(held.force_cancel(NOW + 3, until))
    if store.shared:
        got = await cast(SharedStore, store).request_cancel(held.id, NOW + 3, forced_until=until)
    else:
        await store.commit([held.force_cancel(NOW + 3, until)])
        got = await store.get(held.id)
    assert got == want
    assert (want.cancel_forced, want.lease_until, want.cancel_requested_at) == (
        True, min(until, LEASE), NOW + 3)  # fmt: skip
    return want


async def test_a_forced_cancel_holds_the_lease_no_renewal_moves_and_leaving_clears_it(
    store: JobStore,
) -> None:
    job = new_job()
    await store.commit([job])
    held = await _remote_start(store, job)
    assert held.cancel_forced is False
    forced = await _force(store, held, NOW + 13)
    if store.shared:  # a heartbeat (on any node): answered with the lease as it stands
        lease = Lease(forced.id, forced.epoch, WORKER, LEASE + 60)
        assert await cast(SharedStore, store).extend(NOW + 4, [lease]) == [
            Extended(forced.id, NOW + 13, True)
        ]
    else:
        await store.commit([forced.renew(NOW + 4, LEASE + 60)])
    got = await store.get(job.id)
    assert got is not None
    assert (got.lease_until, got.cancel_forced) == (NOW + 13, True)
    out = got.withdraw("cancelled: forced", NOW + 5)
    if store.shared:
        await cast(SharedStore, store).commit_fenced([out], Fence(holder=WORKER))
    else:
        await store.commit([out])
    ended = await store.get(job.id)
    assert ended == got.apply(out)
    assert ended is not None
    assert (ended.state, ended.cancel_forced, ended.holder) == (State.CANCELLED, False, None)


async def test_a_forced_cancel_survives_a_close_and_reopen(reopen_factory: StoreFactory) -> None:
    """What holds the lease after a restart is the stored fact, on every durable engine."""
    s = reopen_factory()
    await s.open()
    remote, other = new_job(1), new_job(2, priority=-1)
    await s.commit([remote, other])
    held = await _remote_start(s, remote)
    forced = await _force(s, held, NOW + 13)
    await s.close()
    again = reopen_factory()
    recovery = await again.open()
    try:
        assert await again.get(remote.id) == forced
        if not again.shared:  # found running, under the lease the cancel holds
            assert recovery.running == [remote.id]
    finally:
        await again.close()
    await assert_reopened_holds(reopen_factory(), {remote.id: forced, other.id: other})


@pytest.mark.parametrize("engine", ["memory", *DURABLE])  # PostgreSQL's: the tests below
async def test_an_in_process_claim_leaves_the_holder_and_lease_empty(
    factory: StoreFactory,
) -> None:
    """In a local engine only a remote claim sets them (recovery requeues the others)."""
    s = factory()
    await s.open()
    try:
        job = new_job()
        await s.commit([job])
        await s.commit([job.start(NOW + 1)])
        got = await s.get(job.id)
        assert got is not None
        assert (got.state, got.holder, got.lease_until) == (State.RUNNING, None, None)
    finally:
        await s.close()


async def test_the_signing_key_is_32_bytes_and_the_same_for_the_stores_life(
    store: JobStore,
) -> None:
    keys = await asyncio.gather(*(store.signing_key() for _ in range(3)))
    assert len(keys[0]) == KEY_BYTES
    assert set(keys) == {keys[0]}
    assert await store.signing_key() == keys[0]


async def test_the_signing_key_is_the_same_after_a_reopen(reopen_factory: StoreFactory) -> None:
    s = reopen_factory()
    await s.open()
    key = await s.signing_key()
    await s.close()
    again = reopen_factory()
    await again.open()
    try:
        assert await again.signing_key() == key
    finally:
        await again.close()
    if isinstance(again, WalStore):
        path = Path(again.dir) / KEY_NAME
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert path.read_bytes() == key


# -- PostgreSQL: the claim's filters, extend's fence, one key for every node -----------------


@pytest.fixture
async def pg(pg_db: str) -> AsyncIterator[PostgresStore]:
    store = PostgresStore(pg_db)
    await store.open()
    yield store
    await store.close()


async def _submit(store: PostgresStore, *specs: tuple[str, str]) -> list[Job]:
    """One due job per (queue, kind), oldest first."""
    jobs = [
        Job.new(kind=kind, args={"n": n}, now=NOW + n / 1000, queue=queue)
        for n, (queue, kind) in enumerate(specs)
    ]
    await store.commit(jobs)
    return jobs


def _ids(jobs: list[Job]) -> list[str]:
    return [j.id for j in jobs]


async def test_postgres_a_claim_takes_only_its_queues_and_kinds(pg: PostgresStore) -> None:
    a1, b1, a2, c1 = await _submit(pg, ("a", "x"), ("b", "x"), ("a", "y"), ("c", "x"))
    held = await pg.claim(10, NOW + 1, LEASE, {}, only=["a", "b"], kinds=["x"], holder=WORKER)
    assert _ids(held) == [a1.id, b1.id]
    assert {(j.holder, j.lease_until) for j in held} == {(WORKER, LEASE)}
    assert _ids(await pg.claim(10, NOW + 1, LEASE, {}, only=["b", "c"], kinds=["x"])) == [c1.id]
    mine = await pg.claim(10, NOW + 1, LEASE, {})
    assert _ids(mine) == [a2.id]
    assert (mine[0].holder, mine[0].lease_until) == (pg.node, LEASE)  # this node's own


async def test_postgres_a_nodes_claim_leaves_out_the_remote_queues(pg: PostgresStore) -> None:
    r1, l1, r2 = await _submit(pg, ("remote", "x"), ("local", "x"), ("remote", "x"))
    assert _ids(await pg.claim(10, NOW + 1, LEASE, {}, besides=["remote"])) == [l1.id]
    assert await pg.claim(10, NOW + 1, LEASE, {}, besides=["remote"]) == []
    assert await pg.claim(10, NOW + 1, LEASE, {}, only=["remote"], besides=["remote"]) == []
    assert await pg.claim(10, NOW + 1, LEASE, {}, only=[]) == []
    got = await pg.claim(10, NOW + 1, LEASE, {}, only=["remote"], holder=WORKER)
    assert _ids(got) == [r1.id, r2.id]


async def test_postgres_a_capped_queue_honours_the_same_filters(pg: PostgresStore) -> None:
    jobs = await _submit(pg, ("cap", "x"), ("cap", "y"), ("cap", "x"), ("cap", "x"),
                         ("free", "x"))  # fmt: skip
    caps = {"cap": 2}
    got = await pg.claim(10, NOW + 1, LEASE, caps, only=["cap"], kinds=["x"], holder=WORKER)
    assert _ids(got) == [jobs[0].id, jobs[2].id]  # two: the cap, and of kind x only
    assert await pg.claim(10, NOW + 1, LEASE, caps, only=["cap"], holder=WORKER) == []  # full
    assert _ids(await pg.claim(10, NOW + 1, LEASE, caps, besides=["cap"])) == [jobs[4].id]
    await pg.commit_fenced([got[0].complete(None, NOW + 2)], Fence(holder=WORKER))
    assert await pg.claim(10, NOW + 1, LEASE, caps, besides=["cap"]) == []  # left out still
    assert await pg.claim(10, NOW + 1, LEASE, caps, only=["cap"], kinds=["z"]) == []
    [third] = await pg.claim(10, NOW + 1, LEASE, caps, only=["cap"], kinds=["y"])
    assert third.id == jobs[1].id


async def test_postgres_extend_renews_only_what_its_fence_lets_through(pg: PostgresStore) -> None:
    await _submit(pg, *[("q", "x")] * 5)
    ok, stale, other, asked = await pg.claim(4, NOW + 1, LEASE, {}, holder=WORKER)
    [expired] = await pg.claim(1, NOW + 1, NOW + 2, {}, holder=WORKER)  # runs out at NOW + 2
    await pg.request_cancel(asked.id, NOW + 2)
    progress = check_progress(10, "a tenth", NOW + 5)
    leases = [
        Lease(ok.id, ok.epoch, WORKER, NOW + 90, progress),
        Lease(stale.id, stale.epoch - 1, WORKER, NOW + 90),  # an epoch it has left
        Lease(other.id, other.epoch, remote_holder("w2"), NOW + 90),  # not its holder's
        Lease(expired.id, expired.epoch, WORKER, NOW + 90),
        Lease(asked.id, asked.epoch, WORKER, NOW + 90),
        Lease("0" * 32, 1, WORKER, NOW + 90),  # no such job
    ]
    # At NOW + 31 the first claims' leases (until NOW + 30) ran out: all are fenced.
    assert await pg.extend(NOW + 31, leases) == []
    answer = await pg.extend(NOW + 5, [*leases[:3], leases[4]])
    assert sorted(answer, key=lambda e: e.job_id) == sorted(
        [Extended(ok.id, NOW + 90, False), Extended(asked.id, NOW + 90, True)],
        key=lambda e: e.job_id,
    )
    got = {j: await pg.get(j) for j in _ids([ok, stale, other, expired])}
    assert got[ok.id].lease_until == NOW + 90  # type: ignore[union-attr]
    assert got[ok.id].progress == progress  # type: ignore[union-attr]
    assert got[ok.id].updated_at == NOW + 5  # type: ignore[union-attr]
    assert [got[i].lease_until for i in _ids([stale, other])] == [LEASE] * 2  # type: ignore[union-attr]
    assert await pg.extend(NOW + 6, [Lease(expired.id, expired.epoch, WORKER, NOW + 90)]) == []
    assert await pg.extend(NOW + 6, []) == []
    # Never shortened; the last of a repeated lease counts.
    twice = [Lease(ok.id, ok.epoch, WORKER, NOW + 200), Lease(ok.id, ok.epoch, WORKER, NOW + 50)]
    assert await pg.extend(NOW + 7, twice) == [Extended(ok.id, NOW + 90, False)]


async def test_postgres_a_nodes_renewal_never_touches_a_remote_lease(pg: PostgresStore) -> None:
    """A remote row's node is worker:<name>, never a node's name: its own renew and
    release pass it by, and its rescue takes it once the lease runs out."""
    [job] = await _submit(pg, ("q", "x"))
    [held] = await pg.claim(1, NOW + 1, LEASE, {}, holder=WORKER)
    assert (await pg.renew(NOW + 2, NOW + 99, [held.id])).renewed == 0
    assert await pg.release(NOW + 3) == 0
    assert await pg.expired(NOW + 29, 10) == []
    assert _ids(await pg.expired(NOW + 31, 10)) == [job.id]


async def test_postgres_every_node_gets_the_same_key(pg_db: str) -> None:
    stores = [PostgresStore(pg_db) for _ in range(3)]
    for s in stores:
        await s.open()
    try:
        keys = await asyncio.gather(*(s.signing_key() for s in stores))
    finally:
        for s in stores:
            await s.close()
    assert len(keys[0]) == KEY_BYTES
    assert set(keys) == {keys[0]}


async def test_postgres_every_claim_shape_walks_the_claim_index_in_order(
    pg: PostgresStore,
) -> None:
    """The claim's filters are terms of its ordered walk of jobs_claim, never a read and a
    sort of every due row: for a node's claim and a remote one, custom plans and generic
    (asyncpg prepares the claim, and PostgreSQL may switch to a generic plan)."""
    jobs = [
        Job.new(kind=f"k{i % 3}", args=None, now=NOW, queue=f"q{i % 4}", priority=i % 5)
        for i in range(3000)
    ]
    await pg.commit(jobs)
    shapes = [
        ([], pg.node, None, None),  # a node's claim, nothing remote
        (["q3"], pg.node, None, None),  # a node's claim beside a remote queue
        (["q0"], WORKER, ["q1", "q2"], ["k1"]),  # a remote worker's
        ([], WORKER, ["q1"], None),
    ]
    async with pg._conn(claims=True) as conn:
        await conn.execute("ANALYZE jobs")
        try:
            for mode in ("force_custom_plan", "force_generic_plan"):
                await conn.execute(f"SET plan_cache_mode = {mode}")
                for skipped, holder, only, kinds in shapes:
                    args = (NOW, 10, LEASE, skipped, holder, only, kinds)
                    plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + Q["claim"], *args))
                    assert "Index Scan using jobs_claim" in plan, plan
                    assert "Sort" not in plan, plan
        finally:
            await conn.execute("RESET plan_cache_mode")
