"""Schema 3 in place, from a database made by the sqlq of schema version 2.

``data/postgres_v2/jobs.json`` holds the rows that code wrote (``make.py`` beside it says
how it was made: that commit's own ``PostgresStore``, jobs in every state, a schedule
with a tick, a paused queue, a running job's lease) and what it read back. Here today's
migration files make a database at version 2, the rows go in as they were, ``sqlq
migrate`` takes it to the latest version, and today's store reads every job and schedule
as it was with the new fields at their defaults, then stores new values in them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import asyncpg
import msgspec

from sqlq.common.backoff import RetryPolicy, after_failure, after_snooze
from sqlq.common.models import Job, State
from sqlq.common.running import check_progress
from sqlq.common.schedule import AdvanceSchedule, Schedule, tick_key
from sqlq.common.store import Fence, JobQuery, Renewal
from sqlq.engines.postgres.migrate import LATEST, migrate, version
from sqlq.engines.postgres.store import PostgresStore
from sqlq.engines.rows import RUNNING_COLUMNS
from tests.migrate_helpers import at_version

MADE: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "postgres_v2" / "jobs.json").read_text()
)
NOW = 1_700_000_000.0  # make.py's
ROWS = {r["id"]: r for r in MADE["tables"]["jobs"]}
# The new fields take their defaults, but a job's holder and lease are its row's node and
# lease_until (schema 004 reads node as holder): the running job's node, still holding it.
OLD_JOBS = [
    msgspec.structs.replace(
        Job.from_dict(d), holder=ROWS[d["id"]]["node"], lease_until=ROWS[d["id"]]["lease_until"]
    )
    for d in MADE["jobs"]
]
OLD_SCHEDULES = [msgspec.convert(d, Schedule) for d in MADE["schedules"]]


async def _as_version_2_left_it(dsn: str) -> int:
    """The database at version 2 (today's files 001 and 002), holding make.py's rows;
    returns the jobs table's file node, to tell whether the migration rewrote it."""
    conn = await asyncpg.connect(dsn)
    try:
        await at_version(conn, 2, MADE["tables"])
        node: int = await conn.fetchval("SELECT pg_relation_filenode('jobs')")
        return node
    finally:
        await conn.close()


def _by_state(state: State) -> list[Job]:
    return [j for j in OLD_JOBS if j.state is state]


async def _migrated(dsn: str) -> None:
    before = await _as_version_2_left_it(dsn)
    assert await migrate(dsn) == (2, LATEST)
    conn = await asyncpg.connect(dsn)
    try:
        assert await version(conn) == LATEST
        # In place: the new columns are catalog entries, the table's file is the same one.
        assert await conn.fetchval("SELECT pg_relation_filenode('jobs')") == before
        columns = {
            r[0]: (r[1], r[2], r[3])
            for r in await conn.fetch(
                "SELECT column_name, udt_name, is_nullable, column_default"
                " FROM information_schema.columns WHERE table_name = 'jobs'"
            )
        }
    finally:
        await conn.close()
    assert {c: columns[c] for c in RUNNING_COLUMNS} == {
        "cancel_requested_at": ("float8", "YES", None),
        "progress": ("text", "YES", None),
        "checkpoint": ("text", "YES", None),
        "snoozes": ("int8", "NO", "0"),
        "errors": ("text", "YES", None),
    }


async def test_every_job_and_schedule_reads_back_with_the_new_fields_at_defaults(
    pg_dsn: str,
) -> None:
    assert {j.state for j in OLD_JOBS} == set(State) - {
        State.WAITING
    }  # the data covers every state
    await _migrated(pg_dsn)
    store = PostgresStore(pg_dsn)
    await store.open()
    try:
        assert [(j.holder, j.lease_until) for j in _by_state(State.RUNNING)] == [
            (MADE["node"], NOW + 35)
        ]
        for job in OLD_JOBS:
            got = await store.get(job.id)
            assert got == job
            assert got is not None
            assert (got.cancel_requested_at, got.progress, got.checkpoint, got.snoozes,
                    got.errors) == (None, None, None, 0, ())  # fmt: skip
        assert await store.list_jobs(JobQuery(limit=100)) == sorted(OLD_JOBS, key=lambda j: j.id)
        assert await store.list_schedules() == OLD_SCHEDULES
        assert await store.paused_queues() == ["q2"]
        [revived] = [j for j in _by_state(State.SCHEDULED) if j.attempts_total]
        assert revived.all_attempts == 1
    finally:
        await store.close()


async def test_the_migrated_jobs_take_new_values_and_keep_them(pg_dsn: str) -> None:
    """The running job, whose lease its old node still holds, renews with progress, is asked
    to cancel, checkpoints and ends cancelled; a waiting job snoozes; a dead one is revived
    and fails once more; the schedule ticks again. A new store reads it all back."""
    await _migrated(pg_dsn)
    old = PostgresStore(pg_dsn, node=MADE["node"])  # the node that held the running job
    await old.open()
    try:
        [running] = _by_state(State.RUNNING)
        progress = check_progress(25, "a quarter", NOW + 6)
        assert await old.renew(NOW + 6, NOW + 36, [running.id], {running.id: progress}) == (
            Renewal(1)
        )
        asked = await old.request_cancel(running.id, NOW + 7)
        assert asked is not None
        assert (asked.progress, asked.cancel_requested_at) == (progress, NOW + 7)
        assert await old.renew(NOW + 8, NOW + 38, [running.id]) == Renewal(
            1, frozenset({running.id})
        )
        fence = Fence(holder=old.node, lease_from=NOW + 9)
        await old.commit_fenced([asked.touch(NOW + 9, checkpoint={"page": 3})], fence)
        saved = asked.apply(asked.touch(NOW + 9, checkpoint={"page": 3}))
        end = after_failure(saved, "CancelledError", NOW + 10, RetryPolicy(), random.Random(1))
        await old.commit_fenced([end], fence)
        cancelled = saved.apply(end)
        assert cancelled.state is State.CANCELLED

        [snoozer] = await old.claim(1, NOW + 11, NOW + 41, {})
        assert snoozer.attempts_total == 1  # the revived job: due first
        nap = after_snooze(snoozer, 30.0, NOW + 15, max_snoozes=100)
        await old.commit_fenced([nap], Fence(holder=old.node, lease_from=NOW + 15))
        napped = snoozer.apply(nap)
        assert (napped.state, napped.snoozes) == (State.SCHEDULED, 1)

        [dead] = _by_state(State.DEAD)
        revive = dead.revive(NOW + 16)
        await old.commit([revive])
        [claimed] = await old.claim(1, NOW + 17, NOW + 47, {})
        assert claimed.id == dead.id  # the snoozer waits: due first
        failed = after_failure(claimed, "boom again", NOW + 18, RetryPolicy(), random.Random(2))
        await old.commit_fenced([failed], Fence(holder=old.node, lease_from=NOW + 18))
        twice = claimed.apply(failed)
        assert (twice.all_attempts, [e.error for e in twice.errors]) == (2, ["boom again"])

        [s] = OLD_SCHEDULES
        tick = s.cursor + 60
        made = Job.new(kind="noop", args={"n": 1}, now=tick + 0.5, ready_at=tick,
                       idempotency_key=tick_key(s.name, tick))  # fmt: skip
        await old.commit([AdvanceSchedule(name=s.name, expect_version=s.version,
                                          expect_cursor=s.cursor, cursor=tick, job=made.id),
                          made])  # fmt: skip
    finally:
        await old.close()
    now = PostgresStore(pg_dsn)
    await now.open()
    try:
        for job in (cancelled, twice, napped, made):
            assert await now.get(job.id) == job
        assert len(await now.list_jobs(JobQuery(schedule=s.name))) == 2
    finally:
        await now.close()
