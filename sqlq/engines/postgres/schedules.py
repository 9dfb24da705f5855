"""The calls that change a schedule, applied on the writer's connection.

A batch of jobs and transitions is one statement (``batch.py``); the calls of a
batch that change schedules come after that statement, so a refused
compare-and-set fails its caller alone and costs the others nothing. The ticks
(``[AdvanceSchedule, Job...]``) of distinct schedules are one more statement for
all of them: each cursor moves, and its jobs go in, or neither, call by call. Any
other call of one step (a put, a drop) is one statement, so atomic by itself; a
longer one runs in a transaction, a statement per change in call order, each seeing
the ones before it. The rule is ``sqlq.common.schedule.fold``: each refusal is
named from what the statement read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import asyncpg

from sqlq.common.engine.groupcommit import Pending
from sqlq.common.errors import (
    OverlapError,
    SqlqError,
    StaleScheduleError,
    StoreError,
    StoreUnavailableError,
)
from sqlq.common.models import Job, Transition
from sqlq.common.schedule import AdvanceSchedule, DropSchedule, PutSchedule
from sqlq.engines.postgres.batch import (
    JOB_WIDTH,
    Encoded,
    collision,
    columns,
    fast_path_safe,
    insert_one,
    move_one,
    one_caller,
    unencodable,
    write_batch,
    write_one_by_one,
)
from sqlq.engines.postgres.connections import UNAVAILABLE
from sqlq.engines.postgres.queries import SQ
from sqlq.engines.postgres.schedule_rows import Step


async def flush(
    conn: asyncpg.Connection,
    batch: list[Pending],
    pool: asyncpg.Pool,
    lost: Callable[[BaseException], str],
) -> tuple[list[BaseException | None], int, int]:
    """A batch with calls that change schedules: the other calls as one statement (as
    any batch is), then each schedule call on its own (``apply``). If two calls touch
    one job, every call goes on its own, in batch order. Returns the outcomes, the
    commits made and whether the batch was redone one caller at a time (0 or 1).

    Each part commits by itself, so if the connection is lost midway the calls already
    committed hear so (they are durable), and the rest hear ``lost``'s message."""
    found: dict[int, BaseException | None] = {}
    syncs = slow = 0
    try:
        if not fast_path_safe([p.encoded for p in batch]):
            slow = 1
            for p in batch:
                syncs += 1
                one = one_caller if p.encoded.steps is None else apply
                found[id(p)] = await one(conn, p, pool)
        else:
            plain = [p for p in batch if p.encoded.steps is None]
            if plain:
                syncs += 1
                if await write_batch(conn, [p.encoded for p in plain]):
                    found.update((id(p), None) for p in plain)
                else:
                    slow = 1
                    done = await write_one_by_one(conn, plain, pool)
                    found.update((id(p), o) for p, o in zip(plain, done, strict=True))
            ticks, rest = _split([p for p in batch if p.encoded.steps is not None])
            if ticks:
                syncs += 1
                try:
                    refused = await advance_all(conn, [p.encoded.steps[0] for p in ticks])
                    found.update((id(p), r) for p, r in zip(ticks, refused, strict=True))
                except (asyncpg.UniqueViolationError, asyncpg.DataError):
                    rest = ticks + rest  # nothing applied: each on its own hears why
            for p in rest:
                syncs += 1
                found[id(p)] = await apply(conn, p, pool)
    except UNAVAILABLE as exc:
        gone = StoreUnavailableError(lost(exc))
        return [found.get(id(p), gone) for p in batch], syncs, slow
    except asyncpg.PostgresError as exc:
        if not found:
            raise  # nothing committed: the batch fails as any batch does
        # Some parts committed (each part is its own transaction): their callers hear so,
        # and only the rest hear the error, never "the batch failed" for a durable call.
        failed = StoreError(f"postgres: {type(exc).__name__}: {exc}")
        return [found.get(id(p), failed) for p in batch], syncs, slow
    return [found[id(p)] for p in batch], syncs, slow


def _split(calls: list[Pending]) -> tuple[list[Pending], list[Pending]]:
    """The calls that are one tick each, of distinct schedules (one statement for all of
    them: ``advance_all``), and the rest (each on its own: ``apply``)."""
    ticks: list[Pending] = []
    rest: list[Pending] = []
    names: set[str] = set()
    for p in calls:
        todo: list[Step] = p.encoded.steps
        c = todo[0].change
        if len(todo) == 1 and isinstance(c, AdvanceSchedule) and c.name not in names:
            names.add(c.name)
            ticks.append(p)
        else:
            rest.append(p)
    return ticks, rest


async def apply(
    conn: asyncpg.Connection, pending: Pending, pool: asyncpg.Pool
) -> BaseException | None:
    """Apply one caller's changes, whole or not at all; the error it hears, or None."""
    e: Encoded = pending.encoded
    todo = e.steps or []
    try:
        try:
            if len(todo) == 1:
                await _step(conn, todo[0], e, pool)
            else:
                await _in_transaction(conn, todo, e, pool)
        except _Collided:  # a tick's jobs collided, and not one of them: find which
            await _in_transaction(conn, unfused(todo[0]), e, pool)
    except SqlqError as exc:
        return exc
    except asyncpg.DataError as exc:
        return unencodable(exc)
    return None


class _Collided(Exception):
    """One of several jobs a tick inserts holds an id or a key another job holds."""


def unfused(step: Step) -> list[Step]:
    """A tick as separate steps: the advance, then each of its jobs."""
    return [Step(step.change, step.args), *map(Step, step.jobs, step.rows)]


async def _in_transaction(
    conn: asyncpg.Connection, todo: Sequence[Step], e: Encoded, pool: asyncpg.Pool
) -> None:
    async with conn.transaction():
        for step in todo:
            await _step(conn, step, e, pool)


async def _step(conn: asyncpg.Connection, step: Step, e: Encoded, pool: asyncpg.Pool) -> None:
    c = step.change
    if isinstance(c, Job):
        await insert_one(conn, c, step.args, e.wakes)
    elif isinstance(c, Transition):
        await move_one(conn, c, step.args, e, pool)
    elif isinstance(c, PutSchedule):
        written, found = await conn.fetchrow(SQ["put_schedule"], *step.args)
        if not written:
            raise StaleScheduleError(
                c.schedule.name, f"at version {found or 0}, not {c.expect_version}"
            )
    elif isinstance(c, DropSchedule):
        await conn.execute(SQ["drop_schedule"], c.name)
    else:
        await _advance(conn, step)


async def _advance(conn: asyncpg.Connection, step: Step) -> None:
    try:
        (refused,) = await advance_all(conn, [step])
    except asyncpg.UniqueViolationError as exc:
        if len(step.jobs) != 1:
            raise _Collided from None
        raise collision(exc, step.jobs[0]) from None
    if refused is not None:
        raise refused


async def advance_all(conn: asyncpg.Connection, ticks: Sequence[Step]) -> list[SqlqError | None]:
    """Advance steps (of distinct schedules), each with its tick's jobs, in one statement:
    each one's refusal, or None. A job that collides aborts all of it (nothing applied)."""
    rows = [row for step in ticks for row in step.rows]
    owners = [n for n, step in enumerate(ticks) for _ in step.rows]
    advances = [list(column) for column in zip(*(step.args for step in ticks), strict=True)]
    found = await conn.fetch(
        SQ["advance"], *columns(rows, JOB_WIDTH), *advances, list(range(len(ticks))), owners
    )
    return [
        refusal(cast(AdvanceSchedule, step.change), tuple(row[1:5]))
        for step, row in zip(ticks, found, strict=True)
    ]


def refusal(c: AdvanceSchedule, row: tuple[Any, ...]) -> SqlqError | None:
    """Why the ``advance`` statement that returned ``row`` did not move the cursor (None:
    it did), in ``fold``'s order: the version and cursor first, then the idle job."""
    moved, version, cursor, idle_live = row[:4]
    if moved:
        return None
    if version is None:
        return StaleScheduleError(c.name, "does not exist")
    if (version, cursor) != (c.expect_version, c.expect_cursor):
        return StaleScheduleError(
            c.name,
            f"at version {version} cursor {cursor}, not {c.expect_version} {c.expect_cursor}",
        )
    if c.idle is not None and idle_live:
        return OverlapError(c.name, f"job {c.idle} is still live")
    return StaleScheduleError(c.name, "changed while the change was written")
