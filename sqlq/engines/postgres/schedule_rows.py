"""Schedule changes as the arguments of their statements, and a ``schedules`` row back.

A commit call that changes a schedule is applied change by change, in order
(``schedules.py``); its steps are made here on the caller's turn, as the job rows
are (``batch.Encoded``), so a value that cannot be encoded fails that caller alone.
The tick's shape, ``[AdvanceSchedule, Job...]``, is one step: one statement that
moves the cursor and inserts the jobs only if it moved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from sqlq.common.models import Job, Transition
from sqlq.common.schedule import AdvanceSchedule, PutSchedule, Schedule, ScheduleSpec
from sqlq.common.store import Change

INT8 = (-(2**63), 2**63)  # [low, high) of a bigint column
_encode = msgspec.json.Encoder().encode
_decode_spec = msgspec.json.Decoder(ScheduleSpec).decode


@dataclass(frozen=True, slots=True)
class Step:
    """One statement of a caller's: ``change`` with its arguments (a job's row, a
    transition's guarded row, a schedule statement's arguments). An advance may carry
    the jobs of its tick (``jobs``, their rows ``rows``), inserted by the same statement."""

    change: Change
    args: tuple[Any, ...]
    jobs: tuple[Job, ...] = ()
    rows: tuple[tuple[Any, ...], ...] = ()


def steps(
    changes: Sequence[Change], job_rows: list[tuple[Any, ...]], move_rows: list[tuple[Any, ...]]
) -> list[Step]:
    """The steps of a call with a schedule change; ``job_rows`` and ``move_rows`` are its
    jobs' and transitions' rows in call order."""
    first, rest = changes[0], changes[1:]
    if (
        isinstance(first, AdvanceSchedule)
        and all(isinstance(c, Job) for c in rest)
        and (first.idle is None or all(c.id != first.idle for c in rest if isinstance(c, Job)))
    ):  # a tick: nothing before the advance, and no job of its own is its idle one
        jobs = tuple(c for c in rest if isinstance(c, Job))
        return [Step(first, advance_args(first), jobs, tuple(job_rows))]
    jobs_in, moves_in = iter(job_rows), iter(move_rows)
    out = []
    for c in changes:
        if isinstance(c, Job):
            out.append(Step(c, next(jobs_in)))
        elif isinstance(c, Transition):
            out.append(Step(c, next(moves_in)))
        elif isinstance(c, PutSchedule):
            out.append(Step(c, put_args(c)))
        elif isinstance(c, AdvanceSchedule):
            out.append(Step(c, advance_args(c)))
        else:
            out.append(Step(c, (c.name,)))
    return out


def _int8(*values: int) -> None:
    for v in values:
        if not INT8[0] <= v < INT8[1]:
            raise OverflowError(f"{v} does not fit a bigint")


def advance_args(c: AdvanceSchedule) -> tuple[Any, ...]:
    """The ``advance`` statement's arguments after the job columns ($24..$29)."""
    _int8(c.expect_version, c.expect_cursor, c.cursor)
    return (c.name, c.expect_version, c.expect_cursor, c.cursor, c.idle, c.job)


def put_args(c: PutSchedule) -> tuple[Any, ...]:
    """The ``put_schedule`` statement's arguments: the record, then the version expected."""
    s = c.schedule
    _int8(s.version, s.cursor, c.expect_version)
    spec = _encode(s.spec).decode()
    return (s.name, spec, s.version, s.cursor, s.last_job, s.created_at, s.updated_at,
            c.expect_version)  # fmt: skip


def row_schedule(row: Sequence[Any]) -> Schedule:
    """A ``schedules`` row (the ``schedules`` statement's columns) as the record."""
    name, spec, version, cursor, last_job, created_at, updated_at = row
    return Schedule(
        name=name,
        spec=_decode_spec(spec),
        version=version,
        cursor=cursor,
        last_job=last_job,
        created_at=created_at,
        updated_at=updated_at,
    )
