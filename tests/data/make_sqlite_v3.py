"""What schema version 3's code writes into tests/data/sqlite_v3.db (``make_sqlite.py 3``).

Run with *that* code on the path, not this tree's (tests/data/README.md says how):
the point of the file is that the engine of its day wrote it, so the migration test
opens a database exactly as users have them. It writes a job in every state (and a
retried one, a revived one, one with an idempotency key, a schedule's tick), pauses a
queue and puts a schedule; the JSON beside it is what was written, as that code's
``to_dict`` gives it, for the test to compare against.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from sqlq.common.models import Job, Transition
from sqlq.common.schedule import AdvanceSchedule, PutSchedule, Schedule, ScheduleSpec, tick_key
from sqlq.engines.sqlite.store import SCHEMA_VERSION, SQLiteStore

NOW = 1_700_000_000.0


def _id(i: int) -> str:
    return f"018bcfe56800{i:020x}"


def _new(i: int, **kw: object) -> Job:
    kw.setdefault("kind", "noop")
    kw.setdefault("args", {"i": i})
    return Job.new(now=NOW + i, job_id=_id(i), **kw)  # type: ignore[arg-type]


def _step(job: Job, move: str, at: float) -> Transition:
    if move == "start":
        return job.start(at)
    if move == "complete":
        return job.complete({"ok": True, "s": "\u00e9"}, at)
    if move == "retry":
        return job.retry("ValueError: boom", at + 30, at)
    if move == "bury":
        return job.bury("RuntimeError: fatal", at)
    if move == "cancel":
        return job.cancel(at)
    return job.revive(at)


async def _write(data: Path) -> dict[str, object]:
    store = SQLiteStore(data)
    await store.open()
    jobs: dict[str, Job] = {}

    async def put(job: Job, *moves: str) -> None:
        await store.commit([job])
        for step, move in enumerate(moves, start=1):
            t = _step(job, move, job.updated_at + step)
            await store.commit([t])
            job = job.apply(t)
        jobs[job.id] = job

    await put(_new(1, priority=5, queue="mail", idempotency_key="k1", request_hash="h1"))
    await put(_new(2, kind="sleep", args={"work_ms": 5}), "start")
    await put(_new(3), "start", "complete")
    await put(_new(4, max_attempts=3), "start", "retry")
    await put(_new(5, max_attempts=1), "start", "bury")
    await put(_new(6), "cancel")
    await put(_new(7, max_attempts=1, queue="mail"), "start", "bury", "revive")
    await store.set_queue_paused("mail", True)
    spec = ScheduleSpec(kind="noop", every_s=60, args={"n": 1})
    schedule = Schedule(
        name="nightly", spec=spec, version=1, cursor=int(NOW), created_at=NOW, updated_at=NOW
    )
    await store.commit([PutSchedule(schedule=schedule, expect_version=0)])
    tick = int(NOW) + 60
    job = Job.new(kind="noop", args={}, now=tick + 0.5, ready_at=tick,
                  idempotency_key=tick_key("nightly", tick), job_id=_id(8))  # fmt: skip
    advance = AdvanceSchedule(name="nightly", expect_version=1, expect_cursor=int(NOW),
                              cursor=tick, job=job.id, idle=None)  # fmt: skip
    await store.commit([advance, job])
    jobs[job.id] = job
    schedules = await store.list_schedules()
    await store.close()
    return {
        "schema_version": SCHEMA_VERSION,
        "jobs": [j.to_dict() for j in jobs.values()],
        "schedules": [msgspec.to_builtins(s) for s in schedules],
        "paused_queues": ["mail"],
    }
