"""The SQL side of one group-commit batch: rows, arguments, and the two write paths.

A batch is one statement (``write_batch``: a multi-row INSERT from arrays, a
guarded UPDATE ... FROM unnest, the NOTIFY), so one round trip and one WAL flush
at ``synchronous_commit = on``. If a guard refuses a row or an insert collides,
the statement aborts as a whole and the batch is redone one caller at a time,
each in its own transaction, so the caller at fault gets its error and the rest
commit. That slow path runs only when a stale node or a bad request is in it, or
when PostgreSQL chose the batch as a deadlock's victim (a node's lease renewal
locks the rows it holds in an order of its own): nothing of it was written, and
each caller's own short transaction is written again.

Each caller's changes become rows on its own turn (``Encoded``, see
``GroupCommitter``), with the fence they must also pass given to it by name; the
writer's turn only concatenates them into columns.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg

from sqlq.common.engine.groupcommit import Pending
from sqlq.common.errors import (
    DuplicateJobError,
    DuplicateKeyError,
    JobNotFoundError,
    SqlqError,
    StaleEpochError,
    StoreUnavailableError,
    TransitionError,
    UnencodableError,
)
from sqlq.common.models import TRANSITIONS, Job, State, Transition
from sqlq.common.store import Cascaded, Change, Fence
from sqlq.engines.postgres import flows
from sqlq.engines.postgres.connections import DEADLINE_S, UNAVAILABLE, Connections
from sqlq.engines.postgres.queries import MOVE_COLUMNS, Q
from sqlq.engines.postgres.schedule_rows import Step, steps
from sqlq.engines.rows import (
    JOB_COLUMNS,
    LEASE_COLUMNS,
    job_values,
    transition_values,
)

NO_FENCE = Fence()
REFUSED = "SQ001"  # the SQLSTATE sqlq_expect raises: a guard refused a row of the batch
JOB_WIDTH = len(JOB_COLUMNS)
MOVE_WIDTH = len(MOVE_COLUMNS)
ALLOWED_AT = MOVE_COLUMNS.index("allowed")  # where a move row departs from its transition's
LEASE_AT = -len(LEASE_COLUMNS)  # where its transition's holder and lease begin

# The states a job may move into a state from, as "|a|b|" for write_batch's strpos.
ALLOWED_FROM = {
    to: "|" + "|".join(sorted(f.value for f, tos in TRANSITIONS.items() if to in tos)) + "|"
    for to in State
}


def move_values(t: Transition, fence: Fence) -> tuple[Any, ...]:
    """One guarded transition row, in ``MOVE_COLUMNS`` order (its holder and lease left
    out: the row keeps its own while it runs)."""
    row = transition_values(t)
    return (
        *row[:ALLOWED_AT],
        ALLOWED_FROM[t.state],
        *row[ALLOWED_AT:LEASE_AT],
        fence.holder,
        fence.lease_from,
        fence.lease_before,
    )


class Encoded:
    """One caller's changes as rows, made on the caller's turn (see ``GroupCommitter``),
    every transition held to ``fence`` as well as to its epoch. ``steps`` is None for
    a call of jobs and transitions only (a batch of those is one statement); a call
    that changes a schedule is applied step by step, in order (``schedules.py``)."""

    __slots__ = ("fence", "ids", "jobs", "members", "moves", "steps", "wakes")

    def __init__(self, changes: Sequence[Change], fence: Fence = NO_FENCE) -> None:
        self.fence = fence
        self.jobs = [job_values(c) for c in changes if isinstance(c, Job)]
        self.moves = [move_values(c, fence) for c in changes if isinstance(c, Transition)]
        if len(self.jobs) + len(self.moves) == len(changes):
            self.steps: list[Step] | None = None
            # Every change is a Job or a Transition here (counted above): no third test.
            self.ids = [c.id if isinstance(c, Job) else c.job_id for c in changes]  # type: ignore[union-attr]
        else:
            self.steps = steps(changes, self.jobs, self.moves)
            self.ids = [
                c.id if isinstance(c, Job) else c.job_id
                for c in changes
                if isinstance(c, Job | Transition)
            ]
        self.wakes = bool(self.jobs) or any(
            isinstance(c, Transition) and c.state is State.SCHEDULED for c in changes
        )
        # A workflow member made or moved: written one by one, with its cascade (flows.py).
        self.members = any(c.flow is not None for c in changes if isinstance(c, Job | Transition))


def columns(rows: Sequence[tuple[Any, ...]], width: int) -> list[list[Any]]:
    if not rows:
        return [[] for _ in range(width)]
    return [list(col) for col in zip(*rows, strict=True)]


def job_args(jobs: list[tuple[Any, ...]], moves: list[tuple[Any, ...]], wakes: bool) -> list[Any]:
    """write_batch's arguments: the job rows as columns, the move rows as columns, the
    number of moves that must apply, whether to wake the claimers, and what the wake says
    (``keyed_note``)."""
    cols = columns(jobs, JOB_WIDTH)
    note = keyed_note(cols[QUEUE_AT], cols[KEY_AT]) if wakes else ""
    return [*cols, *columns(moves, MOVE_WIDTH), len(moves), wakes, note]


QUEUE_AT, KEY_AT = JOB_COLUMNS.index("queue"), JOB_COLUMNS.index("key")
NOTE_MOST = 4_000  # bytes of queue names a wake carries (PostgreSQL's payload: < 8,000)


def keyed_note(queues: list[str], keys: list[str | None]) -> str:
    """The queues given jobs with a key, one a line, as the wake's payload: every node's
    claims are fair between their keys from then on (``leases.Between.heard``), not
    from their next census. Those past ``NOTE_MOST`` bytes wait for it."""
    if keys.count(None) == len(keys):  # (the usual batch, with no key: no loop in Python)
        return ""
    named = sorted({q for q, k in zip(queues, keys, strict=True) if k is not None})
    note, size = [], 0
    for queue in named:
        size += len(queue.encode()) + 1
        if size > NOTE_MOST:
            break
        note.append(queue)
    return "\n".join(note)


def fast_path_safe(encoded: Sequence[Encoded]) -> bool:
    """One statement sees one snapshot: every job at most once in the whole batch."""
    ids = [i for e in encoded for i in e.ids]
    return len(ids) == len(set(ids))


async def write_batch(conn: asyncpg.Connection, encoded: Sequence[Encoded]) -> bool:
    """The whole batch as one statement; False if it was refused (nothing of it written)."""
    jobs = [row for e in encoded for row in e.jobs]
    moves = [row for e in encoded for row in e.moves]
    try:
        await conn.fetchrow(Q["write_batch"], *job_args(jobs, moves, any(e.wakes for e in encoded)))
    except (asyncpg.UniqueViolationError, asyncpg.DataError, asyncpg.TransactionRollbackError):
        return False  # (a deadlock or a serialization failure rolled it all back: redo it)
    except asyncpg.PostgresError as exc:
        if exc.sqlstate != REFUSED:
            raise
        return False
    return True


async def write_one_by_one(
    conn: asyncpg.Connection, batch: Sequence[Pending], pool: asyncpg.Pool,
    deadline_s: float = DEADLINE_S, cascaded: list[Cascaded] | None = None,
) -> list[BaseException | None]:  # fmt: skip
    """Each caller's changes in a transaction of their own, change by change, so that
    the caller at fault hears why (read on ``pool``, taken within ``deadline_s``) and the
    others commit; what their members' ends moved is added to ``cascaded``."""
    out = [] if cascaded is None else cascaded
    return [await one_caller(conn, p, pool, deadline_s, out) for p in batch]


async def write_members(
    conn: asyncpg.Connection, batch: Sequence[Pending], db: Connections,
    others: Callable[[list[Pending]], Awaitable[list[BaseException | None]]],
    cascaded: list[Cascaded],
) -> list[BaseException | None]:  # fmt: skip
    """A batch with callers that make or move a workflow's members, which never share a job
    with another caller (each of a member's changes says so: ``Encoded.members``): the
    others written by ``others`` (as any batch), then each member's caller in a
    transaction of its own (``one_caller``), its cascade added to ``cascaded``. A lost
    connection fails the ones not yet written; each one written first hears it is durable."""
    rest = [p for p in batch if not p.encoded.members]
    ends: dict[int, BaseException | None] = dict(
        zip(map(id, rest), await others(rest) if rest else [], strict=True)
    )
    gone: StoreUnavailableError | None = None
    for p in batch:
        if not p.encoded.members:
            continue
        if gone is None:
            before = len(cascaded)
            try:
                ends[id(p)] = await one_caller(conn, p, db.pool, db.deadline_s, cascaded)
                continue
            except UNAVAILABLE as exc:
                gone = StoreUnavailableError(db.lost_writer(exc))
            except asyncpg.PostgresError as exc:  # (a statement timeout, say): this one only
                del cascaded[before:]
                ends[id(p)] = StoreUnavailableError(
                    f"PostgreSQL refused the write: {type(exc).__name__}"
                )
                continue
            del cascaded[before:]
        ends[id(p)] = gone
    return [ends[id(p)] for p in batch]


async def one_caller(
    conn: asyncpg.Connection, pending: Pending, pool: asyncpg.Pool,
    deadline_s: float = DEADLINE_S, cascaded: list[Cascaded] | None = None,
) -> BaseException | None:  # fmt: skip
    e: Encoded = pending.encoded
    jobs = [c for c in pending.changes if isinstance(c, Job)]
    moves = [c for c in pending.changes if isinstance(c, Transition)]
    out = [] if cascaded is None else cascaded
    before = len(out)
    try:
        async with conn.transaction():
            if e.members:  # its workflows' writes in turn
                await flows.lock_workflows(conn, jobs, moves)
            else:
                for job, row in zip(jobs, e.jobs, strict=True):
                    await insert_one(conn, job, row, e.wakes)
            # Moves before members: a completion's spawned jobs (``sqlq.runtime.spawn``) are
            # counted against it as completed, as every engine checks them, after its moves.
            for t, row in zip(moves, e.moves, strict=True):
                if t.flow is None:
                    await move_one(conn, t, row, e, pool, deadline_s)
                    continue
                old = await flows.locked(conn, t.job_id)
                await move_one(conn, t, row, e, pool, deadline_s)
                assert old is not None  # (it moved: it was there)

                async def move_rows(ts: list[Transition]) -> None:
                    await move_all(conn, ts, pool, deadline_s)

                await flows.moved(conn, old, t, out, t, move_rows)
            if e.members:  # then its jobs, set-wise
                await insert_all(conn, jobs, e)
                await flows.inserted(conn, jobs)
                await flows.check_members(conn, jobs)
    except SqlqError as exc:
        del out[before:]
        return exc
    except asyncpg.DataError as exc:
        del out[before:]
        return unencodable(exc)
    except asyncpg.TransactionRollbackError as exc:
        del out[before:]
        # A deadlock again, now in this caller's own transaction: rolled back, nothing of
        # it written; the caller may write it again, as after a lost connection.
        return StoreUnavailableError(f"PostgreSQL rolled the write back: {type(exc).__name__}")
    return None


def unencodable(exc: asyncpg.DataError) -> UnencodableError:
    return UnencodableError(f"a value PostgreSQL cannot store ({exc.sqlstate})")


async def insert_all(conn: asyncpg.Connection, jobs: list[Job], e: Encoded) -> None:
    """A caller's jobs in one statement, under a savepoint: if one collides, each again
    alone, so the error names it."""
    if not jobs:
        return
    try:
        async with conn.transaction():
            await conn.fetchrow(Q["write_batch"], *job_args(e.jobs, [], e.wakes))
        return
    except asyncpg.UniqueViolationError:
        pass
    for job, row in zip(jobs, e.jobs, strict=True):
        await insert_one(conn, job, row, e.wakes)


async def insert_one(conn: asyncpg.Connection, job: Job, row: tuple[Any, ...], wakes: bool) -> None:
    """One job inserted (on its own, or in its caller's transaction); a collision named."""
    try:
        await conn.fetchrow(Q["write_batch"], *job_args([row], [], wakes))
    except asyncpg.UniqueViolationError as exc:
        raise collision(exc, job) from None


def collision(exc: asyncpg.UniqueViolationError, job: Job) -> SqlqError:
    """The error of ``job``'s insert that ``exc`` refused."""
    key = job.idempotency_key
    if exc.constraint_name == "jobs_key" and key is not None:
        return DuplicateKeyError(key)
    return DuplicateJobError(job.id)


async def move_one(
    conn: asyncpg.Connection, t: Transition, row: tuple[Any, ...], e: Encoded,
    pool: asyncpg.Pool, deadline_s: float = DEADLINE_S, wakes: bool | None = None,
) -> None:  # fmt: skip
    """Apply one guarded transition, naming the guard that refused it."""
    try:
        await conn.fetchrow(Q["write_batch"], *job_args([], [row], e.wakes if wakes is None
                                                        else wakes))  # fmt: skip
    except asyncpg.PostgresError as exc:
        if exc.sqlstate != REFUSED:
            raise
        raise await why(pool, t, e.fence, deadline_s) from None


async def move_all(
    conn: asyncpg.Connection, ts: list[Transition], pool: asyncpg.Pool,
    deadline_s: float = DEADLINE_S,
) -> None:  # fmt: skip
    """A cascade's transitions between two of its reads, unfenced, as one guarded statement,
    under a savepoint: if a guard refused one, that is undone and each goes alone
    (``move_one``), which names the one refused. The claimers are woken if one was made due.
    A job moved twice (a fan-in's child at one depth) needs its moves in order: one by one."""
    e = Encoded(ts)
    if len(ts) > 1 and fast_path_safe([e]):
        try:
            async with conn.transaction():  # (a savepoint: a refusal undoes this alone)
                await conn.fetchrow(Q["write_batch"], *job_args([], e.moves, e.wakes))
            return
        except asyncpg.PostgresError as exc:
            if exc.sqlstate != REFUSED:
                raise
    for t, row in zip(ts, e.moves, strict=True):
        await move_one(conn, t, row, e, pool, deadline_s, t.state is State.SCHEDULED)


async def why(
    pool: asyncpg.Pool, t: Transition, fence: Fence, deadline_s: float = DEADLINE_S
) -> SqlqError:
    """Name the guard that refused ``t``, reading its row as it is now: the job model's
    own rule first (``Job.check``), then the fence. The pool's connection is taken within
    ``deadline_s``, like every call's (its statement is bounded by the pool's own
    ``command_timeout``): the writer waits on this, and every caller of the batch with it.
    Past it, ``TimeoutError``: the database is out of reach for the whole batch. (The
    schedules' path, ``schedules.py``, takes the default, ``DEADLINE_S``.)"""
    async with pool.acquire(timeout=deadline_s) as c:
        found = await c.fetchrow(Q["why_refused"], t.job_id)
    if found is None:
        return JobNotFoundError(t.job_id)
    values = tuple(found)
    try:
        flows.job_of(values[: flows.ROW_WIDTH]).check(t)
    except TransitionError as exc:
        return exc
    node, lease = values[flows.ROW_WIDTH :]
    refusal = fence_refusal(fence, node, lease)
    return StaleEpochError(t.job_id, refusal or "the job changed while the change was written")


def fence_refusal(fence: Fence, node: str | None, lease: float | None) -> str | None:
    """Why ``fence`` refuses a row held by ``node`` with a lease until ``lease``; None if
    it passes (write_batch's last three guards, in words)."""
    if fence.holder is not None and node != fence.holder:
        return f"the claim belongs to {node}, not {fence.holder}"
    if fence.lease_from is not None and (lease is None or lease < fence.lease_from):
        return "the lease ran out before the outcome was recorded"
    if fence.lease_before is not None and (lease is None or lease >= fence.lease_before):
        return "the lease was renewed: its node is alive"
    return None
