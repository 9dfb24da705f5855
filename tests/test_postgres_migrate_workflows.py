"""Schema 6 in place, from a database at schema version 5: workflows (a ``flow`` column on
jobs, the ``edges`` and ``members`` tables). The version-3 rows of
``data/postgres_v3/jobs.json`` (no column of jobs changed in 4; 5's is a constant
default) migrate without a rewrite of the table, every job reads back as it was, with no
flow, and a workflow then runs beside them."""

from __future__ import annotations

import asyncpg

from sqlq.common.models import Job, State
from sqlq.common.workflow import Flow
from sqlq.engines.postgres.migrate import LATEST, migrate, migrations, version
from sqlq.engines.postgres.migrate import Q as MQ
from sqlq.engines.postgres.store import PostgresStore
from tests.migrate_helpers import at_version
from tests.test_postgres_migrate_remote import MADE, NOW, OLD_JOBS


async def test_the_old_jobs_read_back_with_no_flow_and_a_workflow_runs_beside_them(
    pg_dsn: str,
) -> None:
    conn = await asyncpg.connect(pg_dsn)
    try:
        await at_version(conn, 4, MADE["tables"])
        five = migrations()[4]  # (the old rows have no cancel_forced: added after them)
        await conn.execute(five.sql)
        await conn.execute(MQ["set_version"], five.version)
        before = await conn.fetchval("SELECT pg_relation_filenode('jobs')")
        assert await migrate(pg_dsn) == (5, LATEST) == (5, 7)
        assert await version(conn) == LATEST
        assert await conn.fetchval("SELECT pg_relation_filenode('jobs')") == before  # in place
        assert await conn.fetchval("SELECT count(*) FROM jobs WHERE flow IS NOT NULL") == 0
    finally:
        await conn.close()
    store = PostgresStore(pg_dsn)
    await store.open()
    try:
        for job in OLD_JOBS:
            assert await store.get(job.id) == job
        root = Job.new(kind="k", args={}, now=NOW, flow=Flow(workflow_id="f" * 32))
        flow = Flow(workflow_id="f" * 32, parents=(root.id,), deps_pending=1)
        child = Job.new(kind="k", args={}, now=NOW, flow=flow)
        await store.commit([root, child])
        [held] = await store.claim(1, NOW + 1, NOW + 60, {}, only=["default"],
                                   kinds=["k"])  # fmt: skip
        assert held.id == root.id
        await store.commit([held.complete(None, NOW + 2)])
        got = await store.get(child.id)
        assert got is not None
        assert got.state is State.SCHEDULED
        assert got.flow == Flow(workflow_id="f" * 32, parents=(root.id,))
    finally:
        await store.close()
