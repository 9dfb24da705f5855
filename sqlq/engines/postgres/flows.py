"""Workflows in the PostgreSQL engine: a member's flow on its row, its edges, and the
cascade of a parent's end in the outcome's own transaction.

A member's change never goes in the one-statement batch (``write_batch``): its caller's
changes are written one by one in a transaction of their own (``batch.one_caller``), and
there a member's move locks its row first (``locked``), is written by the batch's own
guarded statement, and is read back as written (the statement may land a move out of
running as cancelled: a cancel another node asked for). Then the walk every engine
shares (``sqlq.common.engine.cascade``) runs against the tables, awaited: each parent's
children are read and locked in id order (``children``), so two nodes completing a
fan-in's last two parents take the child in turn, and the second reads the first's
count, not the count its snapshot began with. A child's move is the same guarded
statement, with its counts merged into its flow; a child released wakes the claimers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg
import msgspec

from sqlq.common.engine.cascade import (
    Move,
    by_parent,
    cascade_async,
    check_member,
    check_revival,
    counted,
    revived_alone,
)
from sqlq.common.models import Job, Transition
from sqlq.common.store import Cascaded, Change
from sqlq.common.workflow import Flow
from sqlq.engines.postgres.queries import Q
from sqlq.engines.rows import JOB_COLUMNS, row_job

WORKFLOW_LOCKS = 0x5371  # the advisory locks' class of workflows (the other key: the id's hash)
JOB_WIDTH = len(JOB_COLUMNS)
ROW_WIDTH = JOB_WIDTH + 2  # a job's select list: its columns, its flow, its parents
_FLOW = msgspec.json.Decoder(Flow)
_encode = msgspec.json.encode


def job_of(row: Any) -> Job:
    """The job of a row of the select list (``queries.SELECT_LIST``): its columns, then a
    member's flow (jsonb, as text) and its parents (an array), both NULL for any other."""
    values = tuple(row)
    job = row_job(values[:JOB_WIDTH])
    flow = values[JOB_WIDTH]
    if flow is None:
        return job
    parents = tuple(values[JOB_WIDTH + 1] or ())
    return msgspec.structs.replace(job, flow=msgspec.structs.replace(_FLOW.decode(flow),
                                                                     parents=parents))  # fmt: skip


def flow_text(flow: Flow) -> str:
    """A flow as its row keeps it: without its parents, which are edges."""
    return _encode(msgspec.structs.replace(flow, parents=())).decode()


def change_text(t: Transition) -> str:
    """A move's new counts and reason, every key given (``merge_flow`` merges them)."""
    assert t.flow is not None
    reason = t.flow.cancel_reason
    said: dict[str, object] = {"cancel_reason": None if reason is None else reason.value}
    if t.flow.counts:  # (the runtime's own move says its reason only: the counts stay)
        said |= {"deps_pending": t.flow.deps_pending, "failed": t.flow.failed}
    return _encode(said).decode()


async def lock_workflows(
    conn: asyncpg.Connection, jobs: Sequence[Job], moves: Sequence[Transition]
) -> None:
    """Take the workflows a caller writes, in name order, until its transaction ends: one
    workflow's writes (submissions, appends, outcomes and their cascades, cancels) go
    one at a time across every node. Each locks rows of its graph in an order of its own
    (a member, then a level of children, then the next), so two at once could deadlock."""
    moved = [t.job_id for t in moves if t.flow is not None]
    made = sorted({j.flow.workflow_id for j in jobs if j.flow is not None})
    await conn.execute(Q["lock_workflows"], moved, made, WORKFLOW_LOCKS)


async def inserted(conn: asyncpg.Connection, jobs: Sequence[Job]) -> None:
    """The new members' flows, membership and edges, after their rows (same transaction),
    set-wise: two statements however many."""
    members = [j for j in jobs if j.flow is not None]
    if not members:
        return
    await conn.execute(
        Q["set_flows"],
        [j.id for j in members],
        [flow_text(j.flow) for j in members if j.flow is not None],
        [j.flow.workflow_id for j in members if j.flow is not None],
    )
    parents: list[str] = []
    children: list[str] = []
    places: list[int] = []
    for job in members:
        assert job.flow is not None
        for n, parent in enumerate(job.flow.parents):
            parents.append(parent)
            children.append(job.id)
            places.append(n)
    if parents:
        await conn.execute(Q["add_edges"], parents, children, places)


async def check_members(conn: asyncpg.Connection, jobs: list[Job]) -> None:
    """Each new member's counts against its parents (``cascade.check_member``), their rows
    held ``FOR SHARE`` until this transaction ends: a parent's outcome (which locks its row
    first, ``locked``) waits for this append, then finds its edges; or this waits for it,
    and reads the parent as it ended."""
    members = counted(jobs)
    if not members:
        return
    parents = sorted({p for job in members if job.flow for p in job.flow.parents})
    rows = await conn.fetch(Q["states_shared"], parents)
    state_of = {r[0]: r[1] for r in rows}.get
    for job in members:
        check_member(job, state_of)


async def locked(conn: asyncpg.Connection, job_id: str) -> Job | None:
    row = await conn.fetchrow(Q["locked"], job_id)
    return None if row is None else job_of(row)


async def moved(
    conn: asyncpg.Connection,
    old: Job,
    t: Transition,
    cascaded: list[Cascaded],
    cause: Change,
    move_rows: Callable[[list[Transition]], Awaitable[None]],
) -> None:
    """A member's move ``t`` from ``old`` (locked, then written by the guarded statement):
    its counts, and, if it ended or was revived, its children's moves down the cone (those
    between two of the walk's reads together: ``move_rows(ts)``, the batch's guarded
    statement for them, then their counts in one round of ``merge_flow``)."""
    await conn.execute(Q["merge_flow"], t.job_id, change_text(t))
    new = await locked(conn, t.job_id)
    assert new is not None  # (its row is locked: it is there)
    if new.state is old.state:
        return
    if revived_alone(old, new):
        check_revival(new, (await states(conn, new.flow.parents if new.flow else ())).get)

    async def children(parents: tuple[str, ...]) -> dict[str, list[Job]]:
        return by_parent([job_of(r) for r in await conn.fetch(Q["children"], list(parents))],
                         parents)  # fmt: skip

    async def put(moves: list[Move]) -> None:
        changes = [m.change for m in moves]
        await move_rows(changes)
        ids = [c.job_id for c in changes]
        if len(set(ids)) == len(ids):  # (one statement sees one snapshot: each job once)
            await conn.execute(Q["merge_flows"], ids, [change_text(c) for c in changes])
        else:  # (a fan-in's child moved twice at one depth: in order)
            await conn.executemany(Q["merge_flow"], [(c.job_id, change_text(c)) for c in changes])
        cascaded.extend(Cascaded(m.before, m.after, m.change, cause) for m in moves)

    await cascade_async(old, new, children, lambda ids: states(conn, ids), put)


async def states(conn: asyncpg.Connection, ids: tuple[str, ...] | list[str]) -> dict[str, str]:
    return {r[0]: r[1] for r in await conn.fetch(Q["states"], list(ids))}


async def workflow(conn: asyncpg.Connection, workflow_id: str) -> list[Job]:
    return [job_of(r) for r in await conn.fetch(Q["workflow"], workflow_id)]
