"""Schedules in the SQLite engine: the three changes as guarded statements, why one was
refused, the table's rows as ``Schedule``, and a schedule's jobs by their key range.

``sqlq.common.schedule.fold`` is the rule; here it is SQL. Each change is one statement
whose WHERE clause is its compare-and-set (queries.sql): a put is fenced on the version
(an INSERT that a taken name turns into nothing, for version 0), an advance on version,
cursor and, for overlap ``skip``, on the previous job not being live; a drop is never
refused. A refused statement changes no row, so "applied" is "its rowcount is 1"
(``Statement.expect``), and the batch is then redone one caller at a time, where
``schedule_refused`` reads the row inside that transaction and lets ``fold`` raise the precise
error: the rule is written twice, but a disagreement can only move the error's text.
"""

from __future__ import annotations

import sqlite3
from itertools import product
from typing import Any, cast

import aiosqlite
import msgspec

from sqlq.common.errors import StaleScheduleError
from sqlq.common.schedule import (
    AdvanceSchedule,
    DropSchedule,
    PutSchedule,
    Schedule,
    ScheduleChange,
    ScheduleSpec,
    fold,
    key_range,
)
from sqlq.common.store import JobQuery
from sqlq.engines.listing import directed, sqlite_params
from sqlq.engines.sqlite.queries import Q, Statement

_SPEC = msgspec.json.Decoder(ScheduleSpec)
_ENCODER = msgspec.json.Encoder()


def schedule_statement(change: ScheduleChange) -> Statement:
    """One schedule change as its statement: encoded on the caller's turn, like a job's
    row, so a spec that cannot be encoded fails that caller alone."""
    if isinstance(change, DropSchedule):
        return Statement(Q["drop_schedule"], (change.name,))
    if isinstance(change, AdvanceSchedule):
        params = {
            "name": change.name,
            "expect_version": change.expect_version,
            "expect_cursor": change.expect_cursor,
            "cursor": change.cursor,
            "job": change.job,
            "idle": change.idle,
        }
        return Statement(Q["advance_schedule"], params, expect=1)
    s = change.schedule
    spec = _ENCODER.encode(s.spec).decode()
    record = (spec, s.version, s.cursor, s.last_job, s.created_at, s.updated_at)
    if change.expect_version == 0:
        return Statement(Q["put_new_schedule"], (s.name, *record), expect=1)
    return Statement(Q["put_schedule"], (*record, s.name, change.expect_version), expect=1)


def row_schedule(_: sqlite3.Cursor | None, row: tuple[Any, ...]) -> Schedule:
    """A cursor's ``row_factory``: the schedule of a row of ``schedule_columns``, made as
    sqlite3 fetches it, on the connection's thread (10,000 of them are not decoded on the
    event loop)."""
    name, spec, version, cursor, last_job, created_at, updated_at = row
    return Schedule(
        name=name,
        spec=_SPEC.decode(spec),
        version=version,
        cursor=cursor,
        last_job=last_job,
        created_at=created_at,
        updated_at=updated_at,
    )


async def select_schedules(
    db: aiosqlite.Connection, sql: str, params: tuple[Any, ...] = ()
) -> list[Schedule]:
    """The schedules ``sql`` selects, decoded on the connection's thread."""
    cursor = await db.execute(sql, params)
    cursor.row_factory = row_schedule  # type: ignore[assignment]  # aiosqlite types it as a type
    return cast(list[Schedule], await cursor.fetchall())


def schedule_refused(conn: sqlite3.Connection, change: ScheduleChange) -> None:
    """Why the guard refused ``change``, read in the slow path's own transaction (so after
    the changes before it), on the connection's thread: the stored row and the idle job,
    through ``fold``."""
    name = change.schedule.name if isinstance(change, PutSchedule) else change.name
    found = [row_schedule(None, r) for r in conn.execute(Q["get_schedule"], (name,))]
    idle = change.idle if isinstance(change, AdvanceSchedule) else None
    live = idle is not None and conn.execute(Q["job_is_live"], (idle,)).fetchone() is not None
    fold(found[0] if found else None, change, live)  # raises the precise ScheduleError
    raise StaleScheduleError(name, "refused by the database guard")


# A listing shape: (state set, kind set, queue set). The state term is the plain one:
# the partial indexes' terms would draw the planner off the key index.
ScheduleShape = tuple[bool, bool, bool, bool]  # ... and descending
_TERMS = ("list_by_state", "list_by_kind", "list_by_queue")


def _statements() -> dict[ScheduleShape, str]:
    out: dict[ScheduleShape, str] = {}
    for state, kind, queue, descending in product((False, True), repeat=4):
        on = (state, kind, queue)
        filters = "".join(f" AND {Q[t]}" for t, used in zip(_TERMS, on, strict=True) if used)
        sql = directed(Q["list_by_schedule"], descending)
        out[(*on, descending)] = sql.replace("{filters}", filters)
    return out


LISTINGS = _statements()


def schedule_listing(query: JobQuery) -> tuple[str, dict[str, object]]:
    """The statement and parameters of a page of ``query.schedule``'s jobs."""
    low, high = key_range(query.schedule or "")
    shape = (
        query.state is not None,
        query.kind is not None,
        query.queue is not None,
        query.descending,
    )
    return LISTINGS[shape], {**sqlite_params(query), "low": low, "high": high}
