"""The SQL side of one group-commit batch: rows, statements, and the two write paths.

Coroutines over an ``aiosqlite.Connection``, through its public API only: every
call is one hop to the connection's own thread (aiosqlite queues each to it).
``plan`` builds the batch's multi-row statements on the event loop's thread (the
Python work), so a batch is a few hops whatever its size: ``write_batch`` runs
them as one transaction (``BEGIN IMMEDIATE``, a statement per table, ``COMMIT``);
``write_one_by_one`` is the slow path that finds the caller at fault under
savepoints, a hop per statement, and runs only when a guard refused a row.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import aiosqlite

from sqlq.common.engine.sql import batch_sql, load_queries
from sqlq.common.errors import (
    DuplicateJobError,
    DuplicateKeyError,
    IllegalTransitionError,
    JobNotFoundError,
    SqlqError,
)
from sqlq.common.models import Job
from sqlq.common.store import Change
from sqlq.engines.rows import job_values, row_job, transition_values

Q = load_queries("sqlq.engines.sqlite", "queries.sql")


def encode_rows(changes: Sequence[Change]) -> list[tuple[Any, ...]]:
    """One caller's changes as statement rows, on its own turn (see ``GroupCommitter``)."""
    return [job_values(c) if isinstance(c, Job) else transition_values(c) for c in changes]


# Rows per statement: SQLite allows 32,766 parameters in one statement.
CHUNK_ROWS = 1000
# Prepared statements kept per connection (sqlite3's default is 128): there are two
# batch statements per batch size, and sizes up to ~100 are common under load.
STATEMENT_CACHE = 256


@dataclass(frozen=True, slots=True)
class Statement:
    """One multi-row statement of a batch, built on the event loop's thread."""

    sql: str
    params: list[Any]
    rows: int
    counted: bool  # an update: every row must match, or a guard refused one


def plan(inserts: list[tuple[Any, ...]], updates: list[tuple[Any, ...]]) -> list[Statement]:
    """The batch as few statements as SQLite's parameter limit allows."""
    plan = []
    for name, rows in (("insert_jobs", inserts), ("apply_transitions", updates)):
        for i in range(0, len(rows), CHUNK_ROWS):
            chunk = rows[i : i + CHUNK_ROWS]
            sql = batch_sql(Q[name], len(chunk), len(chunk[0]))
            params = [value for row in chunk for value in row]
            plan.append(Statement(sql, params, len(chunk), counted=name == "apply_transitions"))
    return plan


def decode_row(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> Job:
    """A cursor's ``row_factory``: sqlite3 calls it as it fetches, so on the connection's
    thread, off the event loop and on that thread's shallow stack, not a request's."""
    return row_job(row)


async def select_jobs(
    db: aiosqlite.Connection, sql: str, params: tuple[Any, ...] | dict[str, Any]
) -> list[Job]:
    """The jobs ``sql`` selects, decoded on the connection's thread (two hops: the first
    step, then the fetch; sqlite3 makes each row at the fetch, through the factory)."""
    cursor = await db.execute(sql, params)
    cursor.row_factory = decode_row  # type: ignore[assignment]  # aiosqlite types it as a type
    return cast(list[Job], await cursor.fetchall())


async def write_batch(db: aiosqlite.Connection, plan: list[Statement]) -> bool:
    """The whole batch in one transaction; False (rolled back) if any guard refused.

    A batch that is one statement, an insert or a one-row update, runs without BEGIN
    and COMMIT: a single statement is its own transaction, all or nothing, and two
    statements fewer are two hops to the connection's thread fewer (about 15% more
    submits/s, measured). A one-row update that a guard refuses changed nothing, so
    the slow path finds out why as after a rollback.
    """
    if len(plan) == 1 and (not plan[0].counted or plan[0].rows == 1):
        only = plan[0]
        try:
            cursor = await db.execute(only.sql, only.params)
        except sqlite3.IntegrityError:
            return False
        return not only.counted or cursor.rowcount == only.rows
    await db.execute("BEGIN IMMEDIATE")
    try:
        for st in plan:
            cursor = await db.execute(st.sql, st.params)
            if cursor.rowcount != st.rows and st.counted:
                # A guard refused a row, or two rows named one job: redo the
                # batch one caller at a time to find out who.
                await db.rollback()
                return False
    except sqlite3.IntegrityError:
        await db.rollback()
        return False
    except BaseException:
        await db.rollback()  # on the connection's thread, after the statement: a no-op if none
        raise
    await commit(db)
    return True


async def commit(db: aiosqlite.Connection) -> None:
    """COMMIT; if it fails, roll back (SQLite may leave the transaction open after an
    I/O error), so no later read on this connection sees the batch that was never durable."""
    try:
        await db.commit()
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            await db.rollback()
        raise


async def write_one_by_one(
    db: aiosqlite.Connection, batch: list[list[Change]]
) -> list[BaseException | None]:
    """The slow path: one savepoint per caller, so only the guilty caller rolls back."""
    outcomes: list[BaseException | None] = []
    await db.execute("BEGIN IMMEDIATE")
    try:
        for changes in batch:
            await db.execute("SAVEPOINT caller")
            try:
                for change in changes:
                    await apply_one(db, change)
            except SqlqError as exc:
                await db.execute("ROLLBACK TO caller")
                outcomes.append(exc)
            else:
                outcomes.append(None)
            await db.execute("RELEASE caller")
    except BaseException:
        await db.rollback()
        raise
    await commit(db)
    return outcomes


def duplicate(job: Job, exc: sqlite3.IntegrityError) -> SqlqError:
    """Which constraint an insert broke, from SQLite's extended error code: the jobs
    table's primary key is the id, and its one unique index is the idempotency key
    (``jobs_key``), so a unique violation that is not the primary key's is the key's."""
    if job.idempotency_key is not None and exc.sqlite_errorcode == sqlite3.SQLITE_CONSTRAINT_UNIQUE:
        return DuplicateKeyError(job.idempotency_key)
    return DuplicateJobError(job.id)


async def apply_one(db: aiosqlite.Connection, change: Change) -> None:
    if isinstance(change, Job):
        try:
            row = job_values(change)
            await db.execute(batch_sql(Q["insert_jobs"], 1, len(row)), row)
        except sqlite3.IntegrityError as exc:
            raise duplicate(change, exc) from None
        return
    row = transition_values(change)
    cursor = await db.execute(batch_sql(Q["apply_transitions"], 1, len(row)), row)
    if cursor.rowcount == 1:
        return
    jobs = await select_jobs(db, Q["get_job"], (change.job_id,))
    if not jobs:
        raise JobNotFoundError(change.job_id)
    jobs[0].check(change)  # raises the precise TransitionError
    raise IllegalTransitionError(change.job_id, "refused by the database guard")


async def prune(db: aiosqlite.Connection, cutoff: float) -> tuple[int, int]:
    await db.execute("BEGIN IMMEDIATE")
    try:
        pruned = (await db.execute(Q["prune_terminal"], (cutoff,))).rowcount
    except BaseException:
        await db.rollback()
        raise
    await commit(db)
    await db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    counted = await db.execute_fetchall(Q["count_jobs"])
    kept = int(next(iter(counted))[0])
    return pruned, kept
