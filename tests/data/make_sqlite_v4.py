"""What schema version 4's code writes into tests/data/sqlite_v4.db (``make_sqlite.py 4``).

Run with *that* code on the path, not this tree's (tests/data/README.md says how): the
migration test (tests/test_sqlite_migrate_v5.py) must open a database exactly as users
have it, written by the engine of its day. It writes a job in every state, and the
running job's fields of version 4 (progress, a checkpoint, a cancel asked for, a
snooze, an attempt's error), a queue paused and a schedule with a tick; the JSON beside
it is what was written, as that code's ``to_dict`` gives it, for the test to compare.
"""

from __future__ import annotations

import random
from pathlib import Path

import msgspec

from sqlq.common.backoff import RetryPolicy, after_failure, after_snooze
from sqlq.common.models import Job, Transition
from sqlq.common.running import check_progress
from sqlq.common.schedule import AdvanceSchedule, PutSchedule, Schedule, ScheduleSpec, tick_key
from sqlq.engines.sqlite.store import SCHEMA_VERSION, SQLiteStore

NOW = 1_700_000_000.0


def _id(i: int) -> str:
    return f"018bcfe56900{i:020x}"


def _new(i: int, **kw: object) -> Job:
    kw.setdefault("kind", "noop")
    kw.setdefault("args", {"i": i})
    return Job.new(now=NOW + i, job_id=_id(i), **kw)  # type: ignore[arg-type]


def _step(job: Job, move: str, at: float) -> Transition:
    rng = random.Random(4)
    moves = {
        "start": lambda: job.start(at),
        "complete": lambda: job.complete({"ok": True, "s": "\u00e9"}, at),
        "fail": lambda: after_failure(job, "ValueError: boom", at, RetryPolicy(), rng),
        "cancel": lambda: job.cancel(at),
        "revive": lambda: job.revive(at),
        "ask": lambda: job.request_cancel(at),
        "snooze": lambda: after_snooze(job, 30.0, at, max_snoozes=10),
        "touch": lambda: job.touch(
            at, progress=check_progress(40, "forty \u00e9", at), checkpoint={"page": 4}
        ),
    }
    return moves[move]()


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
    await put(_new(2, kind="sleep", args={"work_ms": 5}), "start", "touch", "ask")
    await put(_new(3), "start", "fail", "start", "complete")  # an error in its history
    await put(_new(4, max_attempts=3), "start", "fail")  # retried: scheduled again
    await put(_new(5, max_attempts=1), "start", "fail")  # dead
    await put(_new(6), "cancel")
    await put(_new(7), "start", "ask", "fail")  # cancelled while it ran
    await put(_new(8), "start", "snooze")
    await put(_new(9, max_attempts=1, queue="mail"), "start", "fail", "revive")
    await store.set_queue_paused("mail", True)
    spec = ScheduleSpec(kind="noop", every_s=60, args={"n": 1})
    schedule = Schedule(
        name="nightly", spec=spec, version=1, cursor=int(NOW), created_at=NOW, updated_at=NOW
    )
    await store.commit([PutSchedule(schedule=schedule, expect_version=0)])
    tick = int(NOW) + 60
    job = Job.new(kind="noop", args={}, now=tick + 0.5, ready_at=tick,
                  idempotency_key=tick_key("nightly", tick), job_id=_id(10))  # fmt: skip
    advance = AdvanceSchedule(name="nightly", expect_version=1, expect_cursor=int(NOW),
                              cursor=tick, job=job.id, idle=None)  # fmt: skip
    await store.commit([advance, job])
    jobs[job.id] = job
    schedules = await store.list_schedules()
    await store.close()
    return {
        "made_by": "486926a (schema version 4), tests/data/make_sqlite_v4.py",
        "schema_version": SCHEMA_VERSION,
        "jobs": [j.to_dict() for j in jobs.values()],
        "schedules": [msgspec.to_builtins(s) for s in schedules],
        "paused_queues": ["mail"],
    }
