"""Make ``jobs.json``: a PostgreSQL database as sqlq at schema version 3 wrote it, for
tests/test_postgres_migrate_remote.py.

Run with the sqlq of commit 486926a (the last one at schema version 3) first on the path,
against a throwaway cluster of its own, from outside this tree (so that the current
directory does not put this tree first on the path)::

    git worktree add /tmp/e-old 486926a
    cd /tmp && PYTHONPATH=/tmp/e-old /path/to/.venv/bin/python \\
        /path/to/tests/data/postgres_v3/make.py

That code migrates a fresh database and writes jobs in every state through its own
``PostgresStore``: running ones held by a node (one with progress, a checkpoint and a
cancel asked for, renewed), a snoozed one, a failed one with its errors, a schedule with
a tick, a paused queue. The file keeps the tables' rows (``json_agg`` of each: PostgreSQL
prints a double exactly) and what that code read back through ``get``.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path
from typing import Any

import asyncpg
import msgspec

from sqlq.bench.pgcluster import make_cluster
from sqlq.common.backoff import RetryPolicy, after_failure, after_snooze
from sqlq.common.models import Job
from sqlq.common.running import check_progress
from sqlq.common.schedule import AdvanceSchedule, PutSchedule, Schedule, ScheduleSpec, tick_key
from sqlq.common.store import Fence
from sqlq.engines.postgres.migrate import LATEST, migrate
from sqlq.engines.postgres.store import PostgresStore

OUT = Path(__file__).with_name("jobs.json")
NOW = 1_700_000_000.0
NODE = "old-host:4343:abcdef"
TABLES = ("jobs", "schedules", "queues", "nodes")


def job(n: int, **kw: Any) -> Job:
    return Job.new(kind="mail", args={"n": n, "s": "\u00e9\u0000"}, now=NOW + n / 1000, **kw)


async def write(dsn: str) -> dict[str, Any]:
    assert LATEST == 3, f"run this with the sqlq of schema version 3, not {LATEST}"
    await migrate(dsn)
    store = PostgresStore(dsn, node=NODE)
    await store.open()
    rng = random.Random(3)
    try:
        claimed = [job(i, priority=10, max_attempts=2) for i in range(7)]
        await store.commit(claimed)
        running, busy, done, dead, retried, snoozed, asked = await store.claim(
            7, NOW + 1, NOW + 31, {}
        )
        fence = Fence(holder=store.node, lease_from=NOW + 2)
        await store.commit_fenced(
            [done.complete({"ok": [1, 2.5]}, NOW + 2), dead.bury("boom", NOW + 2),
             after_failure(retried, "flaky", NOW + 2, RetryPolicy(), rng),
             after_snooze(snoozed, 30.0, NOW + 2, max_snoozes=10),
             busy.touch(NOW + 2, checkpoint={"page": 3})],
            fence,
        )  # fmt: skip
        progress = check_progress(40, "forty \u00e9", NOW + 3)
        await store.renew(NOW + 3, NOW + 33, [running.id, busy.id], {busy.id: progress})
        await store.request_cancel(busy.id, NOW + 4)
        moved = await store.request_cancel(asked.id, NOW + 4)
        assert moved is not None
        await store.commit_fenced(
            [after_failure(moved, "CancelledError", NOW + 5, RetryPolicy(), rng)], fence
        )  # cancelled
        waiting = job(10, ready_at=NOW + 3600, queue="q2", idempotency_key="k-10",
                      request_hash="h-10")  # fmt: skip
        await store.commit([waiting])
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
        ids = [j.id for j in (*claimed, waiting, made)]
        jobs = [await store.get(i) for i in ids]
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
        "made_by": "486926a (schema version 3), tests/data/postgres_v3/make.py",
        "node": NODE,
        "tables": tables,
        "jobs": [msgspec.to_builtins(j) for j in jobs],
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
