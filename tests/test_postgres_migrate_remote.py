"""Schema 4 in place, from a database made by the sqlq of schema version 3.

``data/postgres_v3/jobs.json`` holds the rows that code wrote (``make.py`` beside it says
how: commit 486926a's own ``PostgresStore``, jobs in every state, two held by a node with
a lease, one with progress, a checkpoint and a cancel asked for) and what it read back.
Here today's files make a database at version 3, the rows go in as they were, ``sqlq
migrate`` takes it to version 4, and today's store reads every job as it was, its holder
being the node that held it; then a remote worker claims, extends and completes, beside
the old node's own lease, and every store gets the same signing key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import asyncpg
import msgspec

from sqlq.common.models import Job, State
from sqlq.common.protocol import remote_holder
from sqlq.common.store import Extended, Fence, Lease, Renewal
from sqlq.common.tokens import KEY_BYTES
from sqlq.engines.postgres.migrate import LATEST, migrate, version
from sqlq.engines.postgres.store import PostgresStore
from tests.migrate_helpers import at_version

MADE: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "postgres_v3" / "jobs.json").read_text()
)
NOW = 1_700_000_000.0  # make.py's
ROWS = {r["id"]: r for r in MADE["tables"]["jobs"]}
READ = [Job.from_dict(d) for d in MADE["jobs"]]  # as that code read them: no holder field
# What today's store reads: the same, with the row's node as the holder, and its lease.
OLD_JOBS = [
    msgspec.structs.replace(j, holder=ROWS[j.id]["node"], lease_until=ROWS[j.id]["lease_until"])
    for j in READ
]


async def _migrated(dsn: str) -> None:
    """The database at version 3 (today's files 001 to 003) holding make.py's rows, then
    migrated: in place (the jobs table's file is the same one), with the secrets table."""
    conn = await asyncpg.connect(dsn)
    try:
        await at_version(conn, 3, MADE["tables"])
        before = await conn.fetchval("SELECT pg_relation_filenode('jobs')")
        assert await migrate(dsn) == (3, LATEST) == (3, 7)
        assert await version(conn) == LATEST
        assert await conn.fetchval("SELECT pg_relation_filenode('jobs')") == before
        assert await conn.fetchval("SELECT count(*) FROM secrets") == 0  # made when asked
    finally:
        await conn.close()


def _running() -> list[Job]:
    return sorted((j for j in OLD_JOBS if j.state is State.RUNNING), key=lambda j: j.id)


async def test_every_job_reads_back_with_its_node_as_its_holder(pg_dsn: str) -> None:
    assert {j.state for j in READ} == set(State) - {State.WAITING}  # the data covers every state
    assert any(j.progress and j.checkpoint and j.cancel_requested_at for j in READ)
    await _migrated(pg_dsn)
    store = PostgresStore(pg_dsn)
    await store.open()
    try:
        for job in OLD_JOBS:
            assert await store.get(job.id) == job
        assert [(j.holder, j.lease_until) for j in _running()] == [(MADE["node"], NOW + 33)] * 2
        assert all(j.holder is None and j.lease_until is None
                   for j in OLD_JOBS if j.state is not State.RUNNING)  # fmt: skip
    finally:
        await store.close()


async def test_a_remote_worker_works_beside_the_old_nodes_leases(pg_dsn: str) -> None:
    await _migrated(pg_dsn)
    old = PostgresStore(pg_dsn, node=MADE["node"])
    other = PostgresStore(pg_dsn)
    await old.open()
    await other.open()
    worker = remote_holder("w1")
    try:
        running = _running()
        assert await old.renew(NOW + 10, NOW + 40, [j.id for j in running]) == Renewal(
            2, frozenset(j.id for j in running if j.cancel_requested_at)
        )
        [held] = await other.claim(1, NOW + 11, NOW + 41, {}, only=["default"], holder=worker)
        assert (held.holder, held.lease_until, held.state) == (worker, NOW + 41, State.RUNNING)
        leases = [Lease(held.id, held.epoch, worker, NOW + 60)]
        leases += [Lease(j.id, j.epoch, worker, NOW + 60) for j in running]  # not the worker's
        assert await old.extend(NOW + 12, leases) == [Extended(held.id, NOW + 60, False)]
        assert [(await old.get(j.id)).lease_until for j in running] == [NOW + 40] * 2  # type: ignore[union-attr]
        renewed = await other.get(held.id)
        assert renewed is not None
        await other.commit_fenced(
            [renewed.complete({"ok": 1}, NOW + 13)], Fence(holder=worker, lease_from=NOW + 13)
        )
        done = await old.get(held.id)
        assert done is not None
        assert (done.state, done.holder, done.lease_until) == (State.COMPLETED, None, None)
        key = await old.signing_key()
        assert len(key) == KEY_BYTES
        assert await other.signing_key() == key
    finally:
        await other.close()
        await old.close()
