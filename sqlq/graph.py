"""Workflows from Python: a graph of steps (``Task.s``), sent as one atomic batch.

    wf = sqlq.workflow()
    a = wf.add(fetch.s(url="https://example.com/1"))
    b = wf.add(fetch.s(url="https://example.com/2"))
    wf.add(merge.s(), after=[a, b])
    sent = wf.send()          # or: await wf.asend()
    sent.jobs[a].result()     # each step's JobHandle, by its ref

``chain``, ``group`` and ``chord`` make the shapes Celery users know. The server does
the rest (``docs/workflows.md``): each step starts once its parents have finished, by
its policies, released in its last parent's commit.

``SentWorkflow.append`` adds a graph to a workflow sent, after its members' handles
(``add(step, after=[sent.jobs[ref]])``). A handler fans out as it ends by returning
``spawn`` of steps or of a graph: they join its workflow in its completion's commit
(``sqlq.runtime.spawn``)::

    @sqlq.task
    def crawl(url: str) -> sqlq.Spawn:
        links = find_links(url)
        return sqlq.spawn(sqlq.chord([fetch.s(url=u) for u in links], merge.s()))
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from sqlq.common.workflow import OnParentFailure, RunIf
from sqlq.runtime.spawn import Spawn
from sqlq.runtime.task import (
    AsyncJobHandle,
    JobHandle,
    Step,
    _default_async_client,
    _default_client,
)

if TYPE_CHECKING:
    from sqlq.client import AsyncClient, Client
    from sqlq.common.wire import CancelCounts, WorkflowView


class Workflow:
    """A graph being built: ``add`` each step after its parents (by the refs ``add``
    returned), then ``send`` it."""

    def __init__(self) -> None:
        self._jobs: list[dict[str, Any]] = []
        self._steps: list[Step[Any]] = []
        self._refs: set[str] = set()
        self._made: set[str] = set()  # the refs ``add`` made up (none given)

    def add(
        self,
        step: Step[Any],
        *,
        after: Iterable[str | JobHandle[Any] | AsyncJobHandle[Any]] = (),
        ref: str | None = None,
        on_parent_failure: OnParentFailure | str = OnParentFailure.CANCEL,
        run_if: RunIf | str = RunIf.ALL_COMPLETED,
    ) -> str:
        """Add ``step`` after the steps ``after`` names (by the refs ``add`` returned, or, to
        ``append`` to a workflow sent, the handles of its members); its ref (``ref``, or
        one made)."""
        if not isinstance(step, Step):
            raise TypeError(f"add takes a step (task.s(...)), not {type(step).__name__}")
        parents: list[str] = []
        for parent in after:
            if isinstance(parent, JobHandle | AsyncJobHandle):
                parents.append(parent.id)  # a member of the workflow this is appended to
            elif parent in self._refs:
                parents.append(parent)
            else:
                raise ValueError(f"after: {parent!r} is no step of this workflow (add it first)")
        made = ref is None
        if ref is None:  # one not taken (a ref given may look like one made)
            n = len(self._jobs)
            ref = f"{step.kind}#{n}"
            while ref in self._refs:
                n += 1
                ref = f"{step.kind}#{n}"
        if ref in self._refs:
            raise ValueError(f"ref {ref!r} is taken in this workflow")
        if made:
            self._made.add(ref)
        job: dict[str, Any] = {"kind": step.kind, "args": step.args, **step.options, "ref": ref}
        if parents:
            job["depends_on"] = parents
        if on_parent_failure != OnParentFailure.CANCEL:
            job["on_parent_failure"] = str(OnParentFailure(on_parent_failure))
        if run_if != RunIf.ALL_COMPLETED:
            job["run_if"] = str(RunIf(run_if))
        self._jobs.append(job)
        self._steps.append(step)
        self._refs.add(ref)
        return ref

    @property
    def refs(self) -> list[str]:
        """Every step's ref, in the order they were added."""
        return [job["ref"] for job in self._jobs]

    def send(self, client: Client | None = None) -> SentWorkflow:
        """Submit the graph in one atomic batch (``client``, else the default one)."""
        client = client or _default_client()
        done = client.submit_workflow(self._checked())
        return SentWorkflow(client, done.workflow_id or "", self.handles(client, done.ids))

    async def asend(self, client: AsyncClient | None = None) -> AsyncSentWorkflow:
        """``send``, awaited, through an ``AsyncClient``."""
        client = client or await _default_async_client()
        done = await client.submit_workflow(self._checked())
        return AsyncSentWorkflow(
            client, done.workflow_id or "", self.async_handles(client, done.ids)
        )

    def _checked(self) -> list[dict[str, Any]]:
        if not self._jobs:
            raise ValueError("a workflow needs a step: add one")
        return self._jobs

    def spawned(self) -> list[dict[str, Any]]:
        """The steps as a spawn or an append sends them: each ref ``add`` made up made
        unique in the workflow they join (a second spawn or append would repeat it, and a
        workflow's refs are its members' names); refs given are kept."""
        token = secrets.token_hex(8)  # (64 bits: 100,000 spawns collide ~1 in 10^9)
        renamed = {ref: f"{ref}.{token}" for ref in self._made}
        jobs = []
        for job in self._checked():
            job = {**job, "ref": renamed.get(job["ref"], job["ref"])}
            if "depends_on" in job:
                job["depends_on"] = [renamed.get(p, p) for p in job["depends_on"]]
            jobs.append(job)
        return jobs

    def handles(self, client: Client, ids: Sequence[str]) -> dict[str, JobHandle[Any]]:
        """Each step's handle, its job's id ``ids``, by the ref ``add`` returned."""
        return {
            job["ref"]: JobHandle(client, job_id, step.signature)
            for job, job_id, step in zip(self._jobs, ids, self._steps, strict=True)
        }

    def async_handles(
        self, client: AsyncClient, ids: Sequence[str]
    ) -> dict[str, AsyncJobHandle[Any]]:
        """``handles``, for an ``AsyncClient``."""
        return {
            job["ref"]: AsyncJobHandle(client, job_id, step.signature)
            for job, job_id, step in zip(self._jobs, ids, self._steps, strict=True)
        }


class SentWorkflow:
    """A workflow sent: its ``id``, and each step's ``JobHandle`` by its ref (``jobs``)."""

    def __init__(self, client: Client, workflow_id: str, jobs: dict[str, JobHandle[Any]]) -> None:
        self.client = client
        self.id = workflow_id
        self.jobs = jobs

    def get(self, after: str | None = None, limit: int | None = None) -> WorkflowView:
        """The workflow as it stands: its state and counts, and a page of its members (up to
        ``limit``, 1,000 at most and by default; ``get(after=view.next)`` for the next)."""
        return self.client.workflow(self.id, after=after, limit=limit)

    def cancel(self) -> CancelCounts:
        """Cancel its members that have not started, and ask its running ones to stop."""
        return self.client.cancel_workflow(self.id)

    def retry(self) -> int:
        """Revive its dead members (with what their deaths cancelled): how many."""
        return self.client.retry_workflow(self.id)

    def append(self, more: Workflow) -> dict[str, JobHandle[Any]]:
        """Add the steps of ``more`` to this workflow, in one atomic batch: each after its
        parents in ``more`` and the members whose handles it names (``add(after=...)``);
        their handles by the refs ``add`` returned. A ref ``add`` made up is stored made
        unique in the workflow, as a spawn's is, so one graph may be appended twice."""
        done = self.client.submit_workflow(more.spawned(), workflow=self.id)
        return more.handles(self.client, done.ids)


class AsyncSentWorkflow:
    """``SentWorkflow``, awaited."""

    def __init__(
        self, client: AsyncClient, workflow_id: str, jobs: dict[str, AsyncJobHandle[Any]]
    ) -> None:
        self.client = client
        self.id = workflow_id
        self.jobs = jobs

    async def get(self, after: str | None = None, limit: int | None = None) -> WorkflowView:
        """``SentWorkflow.get``, awaited."""
        return await self.client.workflow(self.id, after=after, limit=limit)

    async def append(self, more: Workflow) -> dict[str, AsyncJobHandle[Any]]:
        """``SentWorkflow.append``, awaited."""
        done = await self.client.submit_workflow(more.spawned(), workflow=self.id)
        return more.async_handles(self.client, done.ids)

    async def cancel(self) -> CancelCounts:
        return await self.client.cancel_workflow(self.id)

    async def retry(self) -> int:
        return await self.client.retry_workflow(self.id)


def workflow() -> Workflow:
    """A new, empty graph to ``add`` steps to."""
    return Workflow()


def chain(*steps: Step[Any]) -> Workflow:
    """Each step after the one before it."""
    wf, previous = Workflow(), None
    for step in steps:
        previous = wf.add(step, after=[] if previous is None else [previous])
    return wf


def group(*steps: Step[Any]) -> Workflow:
    """Steps that run side by side, none waiting for another."""
    wf = Workflow()
    for step in steps:
        wf.add(step)
    return wf


def chord(
    header: Iterable[Step[Any]], body: Step[Any], *, run_if: RunIf | str = RunIf.ALL_COMPLETED
) -> Workflow:
    """``body`` once every step of ``header`` has finished: by default only if all
    completed (Celery's chord); ``run_if="all_finished"`` runs it however they ended."""
    wf = group(*header)
    wf.add(body, after=wf.refs, run_if=run_if)
    return wf


def spawn(steps: Workflow | Step[Any] | Iterable[Step[Any]], *, result: Any = None) -> Spawn:
    """What a handler returns to end completed with ``result`` and add ``steps`` (a step,
    steps side by side, or a graph) to its workflow, in its completion's commit: each step
    with no parent among them runs after the handler's job, so it is due at once, with the
    job's result in its ``ctx.parents``. A handler in no workflow starts a new one, whose
    first steps have no parent. A spawn the server refuses (an unknown kind, a full queue)
    fails the attempt instead."""
    if isinstance(steps, Workflow):
        graph = steps
    elif isinstance(steps, Step):
        graph = group(steps)
    else:
        graph = group(*steps)
    return Spawn(jobs=graph.spawned(), result=result)
