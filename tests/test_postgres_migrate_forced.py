"""Schema 5 in place, from a database at schema version 4: ``cancel_forced``.

Version 4 changed no column of the jobs table, so the rows the sqlq of schema version 3
wrote (``data/postgres_v3/jobs.json``, ``make.py`` beside it) are a version-4 table's
rows as they were: here today's files make a database at version 4 holding them, ``sqlq
migrate`` takes it to version 5, in place, and every job reads as it was, none forced;
then a remote worker's job is force-cancelled beside the old node's running ones, and its
lease is held where the cancel put it.
"""

from __future__ import annotations

import asyncpg

from sqlq.common.models import State
from sqlq.common.protocol import remote_holder
from sqlq.common.store import Extended, Lease
from sqlq.engines.postgres.migrate import LATEST, migrate, version
from sqlq.engines.postgres.store import PostgresStore
from tests.migrate_helpers import at_version
from tests.test_postgres_migrate_remote import MADE, NOW, OLD_JOBS


async def _migrated(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await at_version(conn, 4, MADE["tables"])
        before = await conn.fetchval("SELECT pg_relation_filenode('jobs')")
        assert await migrate(dsn) == (4, LATEST) == (4, 7)
        assert await version(conn) == LATEST
        assert await conn.fetchval("SELECT pg_relation_filenode('jobs')") == before  # in place
        assert await conn.fetchval("SELECT count(*) FROM jobs WHERE cancel_forced") == 0
    finally:
        await conn.close()


async def test_every_job_reads_back_as_it_was_and_none_forced(pg_dsn: str) -> None:
    await _migrated(pg_dsn)
    store = PostgresStore(pg_dsn)
    await store.open()
    try:
        for job in OLD_JOBS:
            got = await store.get(job.id)
            assert got == job
            assert got is not None
            assert got.cancel_forced is False
    finally:
        await store.close()


async def test_a_forced_cancel_holds_a_remote_lease_beside_the_old_nodes_jobs(
    pg_dsn: str,
) -> None:
    await _migrated(pg_dsn)
    store = PostgresStore(pg_dsn)
    await store.open()
    worker = remote_holder("w1")
    try:
        [held] = await store.claim(1, NOW + 11, NOW + 71, {}, only=["default"], holder=worker)
        forced = await store.request_cancel(held.id, NOW + 12, forced_until=NOW + 22)
        assert forced is not None
        assert (forced.cancel_forced, forced.lease_until) == (True, NOW + 22)
        lease = Lease(held.id, held.epoch, worker, NOW + 90)
        assert await store.extend(NOW + 13, [lease]) == [Extended(held.id, NOW + 22, True)]
        old_running = [j for j in OLD_JOBS if j.state is State.RUNNING]
        for job in old_running:  # a node's job, forced: only asked (its node cuts it off)
            asked = await store.request_cancel(job.id, NOW + 14, forced_until=NOW + 24)
            assert asked is not None
            assert (asked.cancel_forced, asked.lease_until) == (False, job.lease_until)
            assert asked.cancel_requested_at is not None
    finally:
        await store.close()
