"""The SQL side of one group-commit batch: rows, statements, and the two write paths.

Coroutines over an ``aiosqlite.Connection``. Every aiosqlite call is one hop to the
connection's own thread (aiosqlite queues each to it), and a hop costs the event loop a
wake-up and the thread a GIL retake; a durable submit waits for every hop of its batch.
So a batch is one hop (``write_batch``, through ``on_thread``, the one place that reaches
past aiosqlite's public API) and few statements, set-wise (``plan``): its new jobs one
INSERT, its moves one UPDATE ... FROM VALUES under the guards, which must change one row
each (``Statement.expect``), in one transaction; a batch of one statement that applies
whole or not at all (inserts alone, or one move) runs alone, its own transaction. A batch
that changes one job twice (made and moved, or moved twice) needs its rows in order: each
goes through the TEMP view ``batch_changes``, whose INSTEAD OF triggers apply it
(queries.sql; dearer per row: each statement's rows are written to an ephemeral table
first). ``plan`` builds the statements on the event loop's thread (the Python work).
``write_one_by_one`` is the slow path that finds the caller at fault under savepoints, a
hop per statement, and runs only when a guard refused a row or an insert collided.

A schedule change is a statement of its own (schedules.py): a batch that holds one (a
tick, a put: rare, a few a minute) is ``steps``, its changes in order as several
statements in one transaction.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Sequence
from functools import partial
from operator import itemgetter
from typing import Any, TypeVar, cast

import aiosqlite

from sqlq.common.engine.sql import batch_sql
from sqlq.common.errors import (
    DuplicateJobError,
    DuplicateKeyError,
    IllegalTransitionError,
    JobNotFoundError,
    SqlqError,
)
from sqlq.common.models import Job, Transition
from sqlq.common.store import Cascaded, Change
from sqlq.engines.rows import (
    JOB_COLUMNS,
    TRANSITION_COLUMNS,
    job_values,
    row_job,
    transition_values,
)
from sqlq.engines.sqlite.flows import Flows
from sqlq.engines.sqlite.queries import Q, Statement
from sqlq.engines.sqlite.schedules import schedule_refused, schedule_statement

# Run at every open: the view and its triggers are TEMP, the connection's own.
BATCH_OBJECTS = (Q["changes_view"], Q["insert_change"], Q["move_change"])

# A row of batch_changes: op, JOB_COLUMNS, expect_epoch. A move fills the slots of its
# TRANSITION_COLUMNS and leaves the rest NULL: each slot after the op picks its value out of
# the transition's values with a None appended (``_NULL``), in one C call (itemgetter),
# where a Python loop over the slots cost a move ~1 us more.
ROW_COLUMNS = (*JOB_COLUMNS, "expect_epoch")
ROW_WIDTH = 1 + len(ROW_COLUMNS)
_NULL = len(TRANSITION_COLUMNS)
_MOVE_PICK = itemgetter(
    *(TRANSITION_COLUMNS.index(col) if col in TRANSITION_COLUMNS else _NULL for col in ROW_COLUMNS)
)


INSERT, MOVE = "insert", "move"
T = TypeVar("T")

# A move's progress is stored padded with spaces (valid JSON still: every reader, ours and a
# plain ``json.loads``, takes trailing whitespace) to a multiple of this many bytes. SQLite
# stores a row as one record: an UPDATE that changes the record's size writes all of it
# again, a job's 64 KiB checkpoint in its overflow pages too (~140 KB of WAL a progress
# write, measured), where one that keeps the size overwrites it in place and writes only
# the pages whose bytes changed (the leaf page that holds the progress: 4 KiB). Progress
# that moves on ("37 %", "report 120") mostly stays in its slot; a longer message moves to
# the next slot once. Write what changed, in the engine's terms.
PROGRESS_SLOT = 64
_PROGRESS = TRANSITION_COLUMNS.index("progress")


def _slotted(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """A move's values with its progress padded to its slot (``PROGRESS_SLOT``)."""
    text: str | None = values[_PROGRESS]
    if text is None:
        return values
    size = len(text) if text.isascii() else len(text.encode())
    pad = " " * (-size % PROGRESS_SLOT)
    return (*values[:_PROGRESS], text + pad, *values[_PROGRESS + 1 :])


def change_row(change: Change) -> tuple[str, tuple[Any, ...]] | Statement:
    """One change as its op and values (a new job's ``JOB_COLUMNS``, a move's
    ``TRANSITION_COLUMNS``, its progress in its slot); a schedule change as its own
    statement."""
    if isinstance(change, Job):
        return (INSERT, job_values(change))
    if not isinstance(change, Transition):
        return schedule_statement(change)
    return move_row(change)


def move_row(t: Transition) -> tuple[str, tuple[Any, ...]]:
    """A move's op and values, its progress in its slot."""
    values = transition_values(t)
    return (MOVE, values if values[_PROGRESS] is None else _slotted(values))  # (most: none)


def view_row(op: str, values: tuple[Any, ...]) -> tuple[Any, ...]:
    """An op and its values as a row of ``batch_changes`` (op, ``JOB_COLUMNS``,
    expect_epoch)."""
    if op == INSERT:
        return (INSERT, *values, None)
    return (MOVE, *_MOVE_PICK((*values, None)))


Row = tuple[str, tuple[Any, ...]] | Statement


class Steps(list[Row]):
    """A caller's rows that hold a schedule change: its batch is written as ``steps``."""


class Members(list[Row]):
    """A caller's rows that make or move a workflow member: its batch is written change by
    change (``one_by_one``), where each member's end moves its children (flows.py)."""


def encode_rows(changes: Sequence[Change]) -> list[Row]:
    """One caller's changes as rows, on its own turn (see ``GroupCommitter``). A loop, not
    comprehensions: a claim's or an outcome's call is one change, and their frames cost it
    more than its row."""
    rows: list[Row] = []
    plain = True
    member = False
    for change in changes:
        row = change_row(change)
        if type(row) is tuple:
            member = member or change.flow is not None  # type: ignore[union-attr]  # a job's
        else:
            plain = False
        rows.append(row)
    if member:
        return Members(rows)
    return rows if plain else Steps(rows)


# Rows per statement: SQLite allows 32,766 parameters in one statement.
CHUNK_ROWS = 1000
# Prepared statements kept per connection (sqlite3's default is 128): there is one
# batch statement per batch size, and sizes up to ~100 are common under load.
STATEMENT_CACHE = 256


def plan(rows: list[tuple[str, tuple[Any, ...]]]) -> list[Statement]:
    """The batch set-wise: its new jobs as one INSERT, its moves as one UPDATE ... FROM
    VALUES (each as few as SQLite's parameter limit allows: one, up to ``CHUNK_ROWS``).
    A batch that moves a job twice, or moves a job it makes, needs its rows applied in
    order: then every row goes through the view ``batch_changes`` (``in_order``)."""
    inserts = [values for op, values in rows if op == INSERT]
    moves = [values for op, values in rows if op == MOVE]
    moved = {values[0] for values in moves}
    if len(moved) != len(moves) or any(values[0] in moved for values in inserts):
        return in_order(rows)
    return [
        *_chunked(Q["insert_jobs"], inserts, len(JOB_COLUMNS), counted=False),
        *_chunked(Q["move_jobs"], moves, len(TRANSITION_COLUMNS), counted=True),
    ]


def _chunked(
    template: str, rows: list[tuple[Any, ...]], width: int, *, counted: bool
) -> list[Statement]:
    return [
        Statement(
            batch_sql(template, len(chunk), width),
            [v for row in chunk for v in row],
            expect=len(chunk) if counted else None,
        )
        for chunk in (rows[i : i + CHUNK_ROWS] for i in range(0, len(rows), CHUNK_ROWS))
    ]


def in_order(rows: list[tuple[str, tuple[Any, ...]]]) -> list[Statement]:
    """Every row through ``batch_changes``, in order: a guard refused aborts the
    statement (an ``IntegrityError``, as a duplicate insert's)."""
    return _chunked(Q["apply_changes"], [view_row(op, v) for op, v in rows], ROW_WIDTH,
                    counted=False)  # fmt: skip


def steps(rows: list[Row]) -> list[Statement]:
    """A batch that holds schedule changes, in order: each run of job rows between them as
    ``plan`` makes it, each schedule change as its own guarded statement."""
    out: list[Statement] = []
    run: list[tuple[str, tuple[Any, ...]]] = []
    for row in rows:
        if isinstance(row, Statement):
            out.extend(plan(run))
            out.append(row)
            run = []
        else:
            run.append(row)
    out.extend(plan(run))
    return out


def decode_row(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> Job:
    """A cursor's ``row_factory``: sqlite3 calls it as it fetches, so on the connection's
    thread, off the event loop and on that thread's shallow stack, not a request's."""
    return row_job(row)


async def write_batch(db: aiosqlite.Connection, plan: list[Statement]) -> bool:
    """The whole batch in one transaction, in one hop to the connection's thread
    (``on_thread``); False (nothing written) if a guard refused a move or a schedule
    change, or an insert collided: the caller then redoes it one caller at a time."""
    return await on_thread(db, apply_plan, plan)


async def on_thread(db: aiosqlite.Connection, fn: Callable[..., T], *args: Any) -> T:
    """``fn(connection, *args)`` on the connection's own thread, as one hop.

    aiosqlite's public API is a hop a statement: a batch's BEGIN, INSERT, UPDATE and
    COMMIT were four loop wake-ups and four GIL handoffs, and a durable submit waits
    for all of them (experiment D: SQLite's submit phase 1.56x memory's, walq's, one hop
    a batch, 1.28x). This is the one place that reaches past it, to the queue every
    aiosqlite call goes through (``Connection._execute``) and the thread's own
    ``sqlite3.Connection`` (``_conn``); every commit runs through it, so an aiosqlite
    that changed either fails every engine test at once, never quietly."""
    conn: sqlite3.Connection = db._conn
    return cast(T, await db._execute(fn, conn, *args))  # type: ignore[no-untyped-call]


def apply_plan(conn: sqlite3.Connection, plan: list[Statement]) -> bool:
    """``write_batch`` on the connection's thread.

    A batch of one statement that applies whole or not at all runs without BEGIN and
    COMMIT: a single statement is its own transaction. (A statement that must change one
    row and was refused changed nothing: there is nothing to roll back. One that must
    change more may have changed some.) A COMMIT that fails is rolled back (SQLite may
    leave the transaction open after an I/O error), so no later read on this connection
    sees the batch that was never durable."""
    if len(plan) == 1 and plan[0].expect in (None, 1):
        try:
            cursor = conn.execute(plan[0].sql, plan[0].params)
        except sqlite3.IntegrityError:
            return False
        return plan[0].expect is None or cursor.rowcount == 1
    conn.execute("BEGIN IMMEDIATE")
    try:
        for st in plan:
            cursor = conn.execute(st.sql, st.params)
            if st.expect is not None and cursor.rowcount != st.expect:
                conn.rollback()
                return False
    except sqlite3.IntegrityError:
        conn.rollback()
        return False
    except BaseException:
        conn.rollback()  # after the statement: a no-op if none
        raise
    _commit(conn)
    return True


def fetch_jobs(conn: sqlite3.Connection, sql: str, params: Any, members: bool) -> list[Job]:
    """On the connection's thread: the jobs ``sql`` selects, each with its flow if the
    database holds workflows (``members``), decoded there, off the event loop."""
    jobs = [row_job(row) for row in conn.execute(sql, params)]
    return Flows(conn).attach(jobs) if members and jobs else jobs


def one_by_one(
    conn: sqlite3.Connection, batch: list[Sequence[Change]]
) -> tuple[list[BaseException | None], list[Cascaded]]:
    """On the connection's thread, one transaction: each caller's changes one by one under a
    savepoint, so only the guilty caller rolls back, with what each member's end moved
    (``Flows.moved``). The slow path of a plain batch a guard refused, and the path of
    every batch that makes or moves a workflow member."""
    outcomes: list[BaseException | None] = []
    cascaded: list[Cascaded] = []
    flows = Flows(conn)
    conn.execute("BEGIN IMMEDIATE")
    try:
        for changes in batch:
            conn.execute("SAVEPOINT caller")
            before = len(cascaded)
            try:
                if not inserted_setwise(conn, changes, flows):  # (a submission: most members)
                    for change in changes:
                        apply_one(conn, change, flows, cascaded)
                flows.check_members(changes)
            except SqlqError as exc:
                conn.execute("ROLLBACK TO caller")
                del cascaded[before:]
                outcomes.append(exc)
            else:
                outcomes.append(None)
            conn.execute("RELEASE caller")
    except BaseException:
        conn.rollback()
        raise
    _commit(conn)
    return outcomes, cascaded


def inserted_setwise(conn: sqlite3.Connection, changes: Sequence[Change], flows: Flows) -> bool:
    """A caller's new jobs only (a submission, a workflow's or an append): inserted as
    ``plan`` makes them, a statement per thousand, and their flows and edges likewise,
    under the caller's savepoint. False, having changed nothing, if the caller holds
    anything else or an insert collided: then it goes change by change, which names the
    job at fault."""
    if not all(type(c) is Job for c in changes):
        return False
    jobs = cast(Sequence[Job], changes)
    conn.execute("SAVEPOINT setwise")
    try:
        for st in plan([(INSERT, job_values(job)) for job in jobs]):
            conn.execute(st.sql, st.params)
    except sqlite3.IntegrityError:
        conn.execute("ROLLBACK TO setwise")
        conn.execute("RELEASE setwise")
        return False
    conn.execute("RELEASE setwise")
    flows.inserted_all([job for job in jobs if job.flow is not None])
    return True


def _commit(conn: sqlite3.Connection) -> None:
    """COMMIT; if it fails, roll back (SQLite may leave the transaction open after an I/O
    error), so no later read on this connection sees the batch that was never durable."""
    try:
        conn.commit()
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.rollback()
        raise


async def commit(db: aiosqlite.Connection) -> None:
    """``_commit`` through aiosqlite."""
    await on_thread(db, _commit)


def duplicate(job: Job, exc: sqlite3.IntegrityError) -> SqlqError:
    """Which constraint an insert broke, from SQLite's extended error code: the jobs
    table's primary key is the id, and its one unique index is the idempotency key
    (``jobs_key``), so a unique violation that is not the primary key's is the key's."""
    if job.idempotency_key is not None and exc.sqlite_errorcode == sqlite3.SQLITE_CONSTRAINT_UNIQUE:
        return DuplicateKeyError(job.idempotency_key)
    return DuplicateJobError(job.id)


def apply_one(
    conn: sqlite3.Connection, change: Change, flows: Flows, cascaded: list[Cascaded]
) -> None:
    """One change, through the same statement as the batch; its error, precisely. A
    member's flow is written after its row, and its end moves its children."""
    if not isinstance(change, Job | Transition):
        st = schedule_statement(change)
        if conn.execute(st.sql, st.params).rowcount != 1 and st.expect is not None:
            schedule_refused(conn, change)
        return
    if isinstance(change, Job):
        try:
            conn.execute(
                batch_sql(Q["apply_changes"], 1, ROW_WIDTH), view_row(INSERT, job_values(change))
            )
        except sqlite3.IntegrityError as exc:
            raise duplicate(change, exc) from None
        if change.flow is not None:
            flows.inserted(change)
        return
    if change.flow is None:
        move(conn, change)
        return
    old = flows.job(change.job_id)
    move(conn, change)
    assert old is not None  # (moved: so it was there)
    flows.moved(old, change, cascaded, change, partial(move_all, conn))


def move(conn: sqlite3.Connection, t: Transition) -> None:
    """One transition through the batch's guarded statement; refused: the precise error."""
    try:
        conn.execute(batch_sql(Q["apply_changes"], 1, ROW_WIDTH), view_row(*move_row(t)))
    except sqlite3.IntegrityError:
        refused(conn, t)


def move_all(conn: sqlite3.Connection, ts: list[Transition]) -> None:
    """A cascade's transitions between two of its reads set-wise, as a batch's are (``plan``:
    a statement per thousand, not one through the view each; a job moved twice, in order
    through the view), under a savepoint: if a guard refused one, that is undone and each
    goes alone (``move``), which names the one refused."""
    if len(ts) == 1:
        move(conn, ts[0])
        return
    conn.execute("SAVEPOINT moves")
    try:
        for st in plan([move_row(t) for t in ts]):
            if conn.execute(st.sql, st.params).rowcount != st.expect and st.expect is not None:
                break
        else:
            conn.execute("RELEASE moves")
            return
    except sqlite3.IntegrityError:  # (a plan through the view: its guard aborts it)
        pass
    conn.execute("ROLLBACK TO moves")
    conn.execute("RELEASE moves")
    for t in ts:
        move(conn, t)


def refused(conn: sqlite3.Connection, move: Transition) -> None:
    """Why the guard refused ``move``: the job is missing, or ``Job.check`` says why."""
    jobs = fetch_jobs(conn, Q["get_job"], (move.job_id,), False)
    if not jobs:
        raise JobNotFoundError(move.job_id)
    jobs[0].check(move)  # raises the precise TransitionError
    raise IllegalTransitionError(move.job_id, "refused by the database guard")


async def prune(db: aiosqlite.Connection, cutoff: float) -> tuple[int, int]:
    await db.execute("BEGIN IMMEDIATE")
    try:
        pruned = (await db.execute(Q["prune_terminal"], (cutoff,))).rowcount
        if pruned:  # a workflow goes whole (prune_terminal): its flows and edges with it
            await db.execute(Q["prune_flows"])
            await db.execute(Q["prune_edges"])
    except BaseException:
        await db.rollback()
        raise
    await commit(db)
    await db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    counted = await db.execute_fetchall(Q["count_jobs"])
    kept = int(next(iter(counted))[0])
    return pruned, kept
