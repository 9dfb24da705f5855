"""What the store-level schedule tests share: a schedule record, a tick's job and the
advance that goes with it, as the evaluator would commit them (no runtime)."""

from __future__ import annotations

from typing import Any

from sqlq.common.models import Job
from sqlq.common.schedule import AdvanceSchedule, PutSchedule, Schedule, ScheduleSpec, tick_key
from sqlq.common.store import JobStore
from tests.helpers import NOW

CREATED = int(NOW)  # a record's cursor at creation
MINUTE = 60


def record(name: str = "nightly", version: int = 1, cursor: int = CREATED, **spec: Any) -> Schedule:
    """A schedule as an engine stores it: every minute unless ``spec`` says otherwise."""
    spec.setdefault("every_s", MINUTE)
    spec.setdefault("args", {"n": 1})
    return Schedule(
        name=name,
        spec=ScheduleSpec(kind="noop", **spec),
        version=version,
        cursor=cursor,
        created_at=NOW,
        updated_at=NOW,
    )


def tick_job(name: str, tick: int, job_id: str | None = None) -> Job:
    """The job of ``name``'s ``tick``, with the tick's key."""
    return Job.new(
        kind="noop", args={}, now=tick + 0.5, ready_at=tick,
        idempotency_key=tick_key(name, tick), job_id=job_id,
    )  # fmt: skip


def advance(s: Schedule, to: int, job: Job | None, idle: str | None = None) -> AdvanceSchedule:
    """The advance of ``s`` (as read) to ``to``, with ``job`` as that tick's job."""
    return AdvanceSchedule(
        name=s.name, expect_version=s.version, expect_cursor=s.cursor, cursor=to,
        job=None if job is None else job.id, idle=idle,
    )  # fmt: skip


async def create(store: JobStore, schedule: Schedule) -> Schedule:
    """``schedule`` committed as new."""
    await store.commit([PutSchedule(schedule=schedule, expect_version=0)])
    return schedule
