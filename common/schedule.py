"""Schedules: what a user defines, what an engine stores, and the changes that move them.

A schedule makes one job per tick. Its durable state is a *cursor*: the newest tick
already handled (enqueued, or passed over by the catch-up or overlap policy). The
ticks due are those in ``(cursor, now]``; nobody ever asks "does now match".

A tick is one commit: ``AdvanceSchedule`` (a compare-and-set of the cursor, fenced on
the schedule's version too) and the tick's ``Job``, in one ``JobStore.commit`` call,
so they are durable together or not at all, and of two nodes that evaluate the same
tick only one moves the cursor: the other's call fails whole (``StaleScheduleError``)
and inserts nothing. The job's idempotency key, ``sched:<name>:<tick>``, is the second
guard, and it is also what tells a job's schedule and tick (``schedule_of``).

The tick arithmetic (next and previous ticks, catch-up) is ``sqlq.common.ticks``: pure
functions of a spec, a cursor and a time. Both build on ``sqlq.common.cron``, which reads
cron expressions and zones and knows nothing of schedules.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any

import msgspec

from sqlq.common.errors import OverlapError, StaleScheduleError, ValidationError
from sqlq.common.models import DEFAULT_MAX_ATTEMPTS
from sqlq.common.specs import MAX_KIND, Queue, check_args, decode

# A name is part of every job key of its schedule (``sched:<name>:<tick>``): no colon.
NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$(?!\n)"
Name = Annotated[str, msgspec.Meta(pattern=NAME_PATTERN)]
MAX_SCHEDULES = 10_000  # per store: the evaluator holds them all, and /metrics labels them
MAX_EVERY_S = 366 * 24 * 3600  # a year and a day, as a job's longest delay
MAX_CATCH_UP = 10_000  # ticks one catch-up may enqueue under ``all``
MAX_WINDOW_S = 366 * 24 * 3600
KEY_PREFIX = "sched:"  # idempotency keys a client may not use: they are the schedules'


class CatchUp(StrEnum):
    """What to do with the ticks that fell due while no node ran."""

    LATEST = "latest"  # enqueue only the newest, if within catch_up_window_s
    ALL = "all"  # enqueue every one, at most max_catch_up (the newest)
    SKIP = "skip"  # enqueue none of them


class Overlap(StrEnum):
    ALLOW = "allow"  # a tick's job is enqueued whatever the previous one is doing
    SKIP = "skip"  # no job while the previous tick's job is still live (checked in the commit)


class ScheduleSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """A schedule as ``PUT /schedules/{name}`` takes it (and as it is stored): exactly one of
    ``cron`` (5 fields, read in ``tz``) and ``every_s`` (ticks at whole multiples of it
    since the Unix epoch, so every node and every restart agrees on them)."""

    kind: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_KIND)]
    args: dict[str, Any] = msgspec.field(default_factory=dict)
    cron: Annotated[str, msgspec.Meta(min_length=1, max_length=200)] | None = None
    every_s: Annotated[int, msgspec.Meta(ge=1, le=MAX_EVERY_S)] | None = None
    tz: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] = "UTC"
    queue: Queue = "default"
    priority: Annotated[int, msgspec.Meta(ge=-1_000_000, le=1_000_000)] = 0
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=1000)] = DEFAULT_MAX_ATTEMPTS
    catch_up: CatchUp = CatchUp.LATEST
    catch_up_window_s: Annotated[float, msgspec.Meta(gt=0, le=MAX_WINDOW_S)] = 3600.0
    max_catch_up: Annotated[int, msgspec.Meta(ge=1, le=MAX_CATCH_UP)] = 100
    overlap: Overlap = Overlap.ALLOW
    paused: bool = False


def check_spec(spec: ScheduleSpec) -> ScheduleSpec:
    """``spec`` if its timing and args are valid; a ``ValidationError`` naming the field."""
    # Imported here so that cronsim and zoneinfo load only in a process that checks a
    # schedule (every process imports this module); cron imports nothing of schedules.
    from sqlq.common import cron

    if (spec.cron is None) == (spec.every_s is None):
        raise ValidationError("cron", "give exactly one of cron and every_s")
    if spec.cron is not None:
        cron.parse_cron(spec.cron)  # ValidationError("cron", ...)
    cron.check_zone(spec.tz)  # ValidationError("tz", ...)
    check_args(spec.args)
    return spec


def decode_schedule(body: bytes) -> ScheduleSpec:
    """A ``PUT /schedules/{name}`` body; errors name the field, as a job's do."""
    spec: ScheduleSpec = decode(body, ScheduleSpec)
    return check_spec(spec)


class Schedule(msgspec.Struct, frozen=True, kw_only=True):
    """A schedule as an engine stores it."""

    name: str
    spec: ScheduleSpec
    version: int  # set when created (never reused: see Schedules), bumped by every put
    cursor: int  # the newest tick handled, unix seconds (at creation: the creation time)
    last_job: str | None = None  # the job of the newest tick enqueued
    created_at: float
    updated_at: float


class PutSchedule(msgspec.Struct, frozen=True, kw_only=True):
    """Create (``expect_version`` 0: it must not exist) or replace (the stored version
    must be ``expect_version``) the whole record, except that the cursor never moves back:
    a stored cursor at or past the put's stays, with its ``last_job``; ``StaleScheduleError``
    if the version is not the expected one."""

    schedule: Schedule
    expect_version: int


class DropSchedule(msgspec.Struct, frozen=True, kw_only=True):
    """Delete the schedule, if there is one (its jobs stay). Never refused."""

    name: str


class AdvanceSchedule(msgspec.Struct, frozen=True, kw_only=True):
    """Move the cursor from ``expect_cursor`` to ``cursor``, if the schedule exists at
    ``expect_version`` with that cursor (``StaleScheduleError`` otherwise). ``job``: the
    id of the tick's job, committed in the same call (it becomes ``last_job``); None when
    the tick is passed over (``last_job`` stays). ``idle``: a job that must not be live
    (scheduled or running) for this to apply (``OverlapError``), for overlap ``skip``."""

    name: str
    expect_version: int
    expect_cursor: int
    cursor: int
    job: str | None = None
    idle: str | None = None


ScheduleChange = PutSchedule | DropSchedule | AdvanceSchedule


def tick_key(name: str, tick: int) -> str:
    """The idempotency key of the job of ``name``'s ``tick``."""
    return f"{KEY_PREFIX}{name}:{tick}"


def trigger_key(name: str, job_id: str) -> str:
    """The key of a job ``POST /schedules/{name}/trigger`` made: outside the ticks."""
    return f"{KEY_PREFIX}{name}:trigger-{job_id}"


def schedule_of(key: str | None) -> tuple[str, int | None] | None:
    """(schedule, tick) of a job's idempotency key, tick None for a triggered job; None
    for a job no schedule made."""
    if key is None or not key.startswith(KEY_PREFIX):
        return None
    name, _, tick = key[len(KEY_PREFIX) :].rpartition(":")
    if not name:
        return None
    return name, (int(tick) if tick.isdigit() else None)


def key_range(name: str) -> tuple[str, str]:
    """[low, high) of the idempotency keys of ``name``'s jobs, for a range scan of the
    key index (``;`` is the character after ``:``)."""
    return f"{KEY_PREFIX}{name}:", f"{KEY_PREFIX}{name};"


_NAME = re.compile(NAME_PATTERN.removeprefix("^").removesuffix("$(?!\\n)"))


def check_name(name: str, field: str = "name") -> str:
    """``name`` if it may name a schedule (a path segment, a metric label, part of a key)."""
    if _NAME.fullmatch(name) is None:
        raise ValidationError(field, "1 to 64 of A-Z a-z 0-9 _ . -")
    return name


def fold(
    current: Schedule | None, change: ScheduleChange, idle_live: bool = False
) -> Schedule | None:
    """The schedule ``change`` leaves, from ``current`` (None: there is none), or the
    ``ScheduleError`` it is refused with: the rule every engine keeps (the memory engine
    and walq by calling this; the SQL engines in their statements). ``idle_live``: whether
    the job an ``AdvanceSchedule`` names as ``idle`` is live."""
    if isinstance(change, DropSchedule):
        return None
    if isinstance(change, PutSchedule):
        found = 0 if current is None else current.version
        if found != change.expect_version:
            raise StaleScheduleError(
                change.schedule.name, f"at version {found}, not {change.expect_version}"
            )
        put = change.schedule
        if current is not None and current.cursor >= put.cursor:
            # A cursor never moves back: a put read before a tick and committed after it
            # (advances do not bump the version) keeps the tick's cursor and its job.
            return msgspec.structs.replace(put, cursor=current.cursor, last_job=current.last_job)
        return put
    if current is None:
        raise StaleScheduleError(change.name, "does not exist")
    if current.version != change.expect_version or current.cursor != change.expect_cursor:
        raise StaleScheduleError(
            change.name,
            f"at version {current.version} cursor {current.cursor}, not "
            f"{change.expect_version} {change.expect_cursor}",
        )
    if change.idle is not None and idle_live:
        raise OverlapError(change.name, f"job {change.idle} is still live")
    return msgspec.structs.replace(
        current, cursor=change.cursor, last_job=change.job or current.last_job
    )
