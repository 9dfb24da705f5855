"""Workflows in the SQLite engine: a member's flow in the ``flows`` and ``edges`` tables,
and the cascade of a parent's end, run in the parent's own transaction.

Everything here runs on the connection's thread (``batch.on_thread``), inside the
transaction of the commit it serves, so it reads what that commit wrote before it. The
rule and the walk are the ones every engine runs (``Job.after_parent``,
``sqlq.common.engine.cascade``); only the reads and writes are SQLite's. A job outside
every workflow never comes here: its changes carry no flow (``Job._to``), and its reads
look in ``flows`` only once the database holds a workflow.

A child's parents are read from ``edges`` once per commit (``Flows`` keeps them: they never
change), so a parent's end costs its children's rows and not their fan-ins again.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from itertools import islice
from typing import Any

import msgspec

from sqlq.common.engine.cascade import (
    Move,
    by_parent,
    cascade,
    check_member,
    check_revival,
    counted,
    revived_alone,
)
from sqlq.common.models import Job, Transition
from sqlq.common.store import Cascaded, Change
from sqlq.common.workflow import CancelReason, Flow, OnParentFailure, RunIf
from sqlq.engines.rows import row_job
from sqlq.engines.sqlite.queries import Q

# Children's rows moved (each a different job), by the batch's guarded statement, set-wise.
Write = Callable[[list[Transition]], None]
IDS_PER_STATEMENT = 500  # ids bound in one ``get_flows`` (SQLite allows 32,766 parameters)


def flow_values(job_id: str, flow: Flow) -> tuple[object, ...]:
    """A ``flows`` row, in ``insert_flow``'s order."""
    return (
        job_id,
        flow.workflow_id,
        flow.ref,
        flow.deps_pending,
        flow.failed,
        flow.on_parent_failure.value,
        flow.run_if.value,
        None if flow.cancel_reason is None else flow.cancel_reason.value,
    )


class Flows:
    """The flows a commit (or a read) touches, on the connection's thread."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._parents: dict[str, tuple[str, ...]] = {}  # by child: never changes

    # -- reads ---------------------------------------------------------------------------

    def parents(self, job_id: str) -> tuple[str, ...]:
        found = self._parents.get(job_id)
        if found is None:
            rows = self.conn.execute(Q["parents_of"], (job_id,))
            found = self._parents[job_id] = tuple(r[0] for r in rows)
        return found

    def _read_parents(self, ids: list[str]) -> None:
        """The parents of every member of ``ids`` not read yet, in one statement a slice
        (a page of a thousand members is a statement, not a thousand)."""
        wanted = [i for i in ids if i not in self._parents]
        it = iter(wanted)
        while chunk := list(islice(it, IDS_PER_STATEMENT)):
            sql = Q["parents_of_many"].replace("{ids}", ", ".join("?" * len(chunk)))
            found: dict[str, list[str]] = {i: [] for i in chunk}
            for child, parent in self.conn.execute(sql, chunk):
                found[child].append(parent)
            self._parents.update((i, tuple(ps)) for i, ps in found.items())

    def _flow(self, row: tuple[Any, ...]) -> tuple[str, Flow]:
        job_id, workflow_id, ref, pending, failed, policy, run_if, reason = row
        flow = Flow(
            workflow_id=workflow_id,
            ref=ref,
            parents=self.parents(job_id),
            deps_pending=pending,
            failed=failed,
            on_parent_failure=OnParentFailure(policy),
            run_if=RunIf(run_if),
            cancel_reason=None if reason is None else CancelReason(reason),
        )
        return job_id, flow

    def attach(self, jobs: list[Job]) -> list[Job]:
        """``jobs`` with each member's flow (read from ``flows``, in slices of ids)."""
        flows: dict[str, Flow] = {}
        it = iter(job.id for job in jobs)
        while ids := list(islice(it, IDS_PER_STATEMENT)):
            sql = Q["get_flows"].replace("{ids}", ", ".join("?" * len(ids)))
            rows = self.conn.execute(sql, ids).fetchall()
            self._read_parents([row[0] for row in rows])
            flows.update(self._flow(row) for row in rows)
        return self.with_flows(jobs, flows)

    def live(self, jobs: list[Job]) -> list[Job]:
        """Recovery's: the live ``jobs`` with their flows (every live member's in one read)."""
        rows = self.conn.execute(Q["live_flows"]).fetchall()
        self._read_parents([row[0] for row in rows])
        flows = dict(self._flow(row) for row in rows)
        return self.with_flows(jobs, flows)

    @staticmethod
    def with_flows(jobs: list[Job], flows: dict[str, Flow]) -> list[Job]:
        if not flows:
            return jobs
        return [
            job if (flow := flows.get(job.id)) is None else msgspec.structs.replace(job, flow=flow)
            for job in jobs
        ]

    def job(self, job_id: str) -> Job | None:
        """A job as it stands in this transaction, with its flow."""
        rows = [row_job(r) for r in self.conn.execute(Q["get_job"], (job_id,))]
        return self.attach(rows)[0] if rows else None

    def children(self, parents: tuple[str, ...]) -> dict[str, list[Job]]:
        """The children of ``parents`` as they stand in this transaction, with their flows:
        by parent, each one's in their ids' order (a statement a slice of parents)."""
        found: dict[str, Job] = {}
        it = iter(parents)
        while chunk := list(islice(it, IDS_PER_STATEMENT)):
            sql = Q["children_of"].replace("{ids}", ", ".join("?" * len(chunk)))
            found.update((job.id, job) for job in map(row_job, self.conn.execute(sql, chunk)))
        return by_parent(self.attach([found[i] for i in sorted(found)]), parents)

    def states(self, ids: tuple[str, ...]) -> dict[str, str]:
        """The states of the jobs ``ids`` that are kept, by id."""
        out: dict[str, str] = {}
        it = iter(ids)
        while chunk := list(islice(it, IDS_PER_STATEMENT)):
            sql = Q["states_of"].replace("{ids}", ", ".join("?" * len(chunk)))
            out.update(self.conn.execute(sql, chunk))
        return out

    def workflow(self, workflow_id: str) -> list[Job]:
        """A workflow's members kept, in the order they were stored."""
        by_id = {
            job.id: job
            for job in (row_job(r) for r in self.conn.execute(Q["workflow_jobs"], (workflow_id,)))
        }
        order = [r[0] for r in self.conn.execute(Q["workflow_order"], (workflow_id,))]
        return self.attach([by_id[i] for i in order if i in by_id])

    # -- writes (after the job's own row, in the same transaction) -----------------------

    def inserted(self, job: Job) -> None:
        """A new member's flow and its edges."""
        self.inserted_all([job])

    def inserted_all(self, jobs: Sequence[Job]) -> None:
        """New members' flows and edges, two statements prepared once, run for each row."""
        members = [(job, job.flow) for job in jobs if job.flow is not None]
        self.conn.executemany(Q["insert_flow"], (flow_values(j.id, f) for j, f in members))
        self.conn.executemany(
            Q["insert_edge"],
            ((p, j.id, n) for j, f in members for n, p in enumerate(f.parents)),
        )
        for job, flow in members:
            self._parents[job.id] = flow.parents

    def moved(
        self,
        old: Job,
        t: Transition,
        cascaded: list[Cascaded],
        cause: Change,
        move: Write,
    ) -> None:
        """A member's move ``t`` from ``old``, its row written already: its counts, and, if
        it ended or was revived, what that does to its children, down the cone (the rows of
        the children moved between two of the walk's reads through ``move``, the batch's
        own guarded statement, set-wise; their flows likewise)."""
        new = old.apply(t)
        self._write([t])
        if new.state is old.state:
            return
        if revived_alone(old, new):
            check_revival(new, self.states(new.flow.parents if new.flow else ()).get)

        def put(moves: list[Move]) -> None:
            changes = [m.change for m in moves]
            move(changes)
            self._write(changes)
            cascaded.extend(Cascaded(m.before, m.after, m.change, cause) for m in moves)

        cascade(old, new, self.children, self.states, put)

    def check_members(self, changes: Sequence[Change]) -> None:
        """Each new member's counts against its parents as this transaction holds them
        (``cascade.check_member``), once the caller's jobs are all in."""
        members = counted(changes)
        if members:
            parents = {p for job in members if job.flow for p in job.flow.parents}
            state_of = self.states(tuple(parents)).get
            for job in members:
                check_member(job, state_of)

    def _write(self, moves: list[Transition]) -> None:
        """The flows of ``moves``: two statements prepared once (one job moved twice, a
        fan-in's child at one depth, has its moves written in their order, one by one)."""
        if len({t.job_id for t in moves}) < len(moves):
            for t in moves:
                self._write([t])
            return
        counts: list[tuple[object, ...]] = []
        reasons: list[tuple[object, ...]] = []
        for t in moves:
            change = t.flow
            if change is None:
                continue
            reason = None if change.cancel_reason is None else change.cancel_reason.value
            if change.counts:
                counts.append((change.deps_pending, change.failed, reason, t.job_id))
            else:  # (the runtime's move: its reason; the counts stay as stored)
                reasons.append((reason, t.job_id))
        if counts:
            self.conn.executemany(Q["update_flow"], counts)
        if reasons:
            self.conn.executemany(Q["update_flow_reason"], reasons)
