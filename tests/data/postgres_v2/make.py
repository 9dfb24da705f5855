"""Make ``jobs.json``: a PostgreSQL database as sqlq at schema version 2 wrote it, for
tests/test_postgres_migrate_running.py.

Run with the sqlq of commit ab7b3a9 (the last one at schema version 2) first on the path,
against a throwaway cluster of its own::

    git archive ab7b3a9 | tar -x -C /tmp/sqlq-v2
    PYTHONPATH=/tmp/sqlq-v2 .venv/bin/python tests/data/postgres_v2/make.py

That code migrates a fresh database and writes jobs in every state (and a schedule with
a tick, a paused queue, a node) through its own ``PostgresStore``, so the rows are exactly
what it writes. The file keeps the tables' rows (``json_agg`` of each: PostgreSQL prints
a double exactly) and what that code read back through ``get`` and ``list_schedules``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import asyncpg
import msgspec

from sqlq.bench.pgcluster import make_cluster
from sqlq.common.models import Job
from sqlq.common.schedule import AdvanceSchedule, PutSchedule, Schedule, ScheduleSpec, tick_key
from sqlq.common.store import Fence
from sqlq.engines.postgres.migrate import LATEST, migrate
from sqlq.engines.postgres.store import PostgresStore

OUT = Path(__file__).with_name("jobs.json")
NOW = 1_700_000_000.0
NODE = "old-host:4242:abcdef"
TABLES = ("jobs", "schedules", "queues", "nodes")


def job(n: int, **kw: Any) -> Job:
    return Job.new(kind="mail", args={"n": n, "s": "\u00e9\u0000"}, now=NOW + n / 1000, **kw)


async def write(dsn: str) -> dict[str, Any]:
    assert LATEST == 2, f"run this with the sqlq of schema version 2, not {LATEST}"
    await migrate(dsn)
    store = PostgresStore(dsn, node=NODE)
    await store.open()
    try:
        # Claimed first (a claim takes the highest priority): running, completed, dead,
        # retried, revived.
        claimed = [job(i, priority=10, max_attempts=2) for i in range(5)]
        await store.commit(claimed)
        running, done, dead, retried, revived = await store.claim(5, NOW + 1, NOW + 31, {})
        await store.commit_fenced(
            [done.complete({"ok": [1, 2.5]}, NOW + 2), dead.bury("boom", NOW + 2),
             retried.retry("flaky", NOW + 60, NOW + 2), revived.bury("gone", NOW + 2)],
            Fence(holder=store.node, lease_from=NOW + 2),
        )  # fmt: skip
        buried = await store.get(revived.id)
        assert buried is not None
        await store.commit([buried.revive(NOW + 3)])
        waiting = job(10, ready_at=NOW + 3600, queue="q2", idempotency_key="k-10",
                      request_hash="h-10")  # fmt: skip
        withdrawn = job(11)
        await store.commit([waiting, withdrawn])
        await store.commit([withdrawn.cancel(NOW + 4)])
        await store.set_queue_paused("q2", True)
        spec = ScheduleSpec(kind="noop", args={"n": 1}, every_s=60)
        record = Schedule(name="nightly", spec=spec, version=1, cursor=int(NOW),
                          created_at=NOW, updated_at=NOW)  # fmt: skip
        await store.commit([PutSchedule(schedule=record, expect_version=0)])
        tick = int(NOW) + 60
        made = Job.new(kind="noop", args={"n": 1}, now=tick + 0.5, ready_at=tick,
                       idempotency_key=tick_key("nightly", tick))  # fmt: skip
        advance = AdvanceSchedule(name="nightly", expect_version=1, expect_cursor=int(NOW),
                                  cursor=tick, job=made.id)  # fmt: skip
        await store.commit([advance, made])
        await store.renew(NOW + 5, NOW + 35, [running.id])
        ids = [j.id for j in (*claimed, waiting, withdrawn, made)]
        jobs = [await store.get(i) for i in ids]
        schedules = await store.list_schedules()
    finally:
        await store.close()
    conn = await asyncpg.connect(dsn)
    try:
        tables = {t: json.loads(await conn.fetchval(
            f"SELECT coalesce(json_agg(t), '[]')::text FROM {t} t"))
            for t in TABLES}  # fmt: skip
    finally:
        await conn.close()
    return {
        "made_by": "ab7b3a9 (schema version 2), tests/data/postgres_v2/make.py",
        "node": NODE,
        "tables": tables,
        "jobs": [msgspec.to_builtins(j) for j in jobs],
        "schedules": [msgspec.to_builtins(s) for s in schedules],
    }


def main() -> None:
    cluster = make_cluster()
    try:
        made = asyncio.run(write(cluster.create_database()))
    finally:
        cluster.discard()
    OUT.write_text(json.dumps(made, indent=1, ensure_ascii=True) + "\n")
    print(f"wrote {OUT}: {len(made['jobs'])} jobs", file=sys.stderr)


if __name__ == "__main__":
    main()
