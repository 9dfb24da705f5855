"""``Submissions``: how a client's specs become durable, claimable jobs, under the bounds.

A spec is checked against its kind and built into a job (a remote queue's against
nothing but the bounds: its kinds run elsewhere, so any name and any JSON object of
args is accepted); the jobs of one request
are committed as one atomic change (durable on return) and only then handed to
the claims. Idempotency keys are reserved in this process for the length of the
look-up and the commit, so two concurrent requests with one key make one job.
``--max-queued`` and ``--max-queues`` hold across submissions and retries alike:
each holds its place (and its new queue names) until the commit that makes its
jobs live is over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple, TypeVar

from msgspec.structs import replace

from sqlq.common.clock import Clock
from sqlq.common.engine.cascade import MOVED
from sqlq.common.errors import (
    DuplicateKeyError,
    IdempotencyConflictError,
    IllegalTransitionError,
    QueueFullError,
    ValidationError,
)
from sqlq.common.models import DEFAULT_QUEUE, JSON, Job, Transition, new_job_id
from sqlq.common.specs import MAX_DELAY_MS, JobSpec, MemberSpec, check_args
from sqlq.common.store import JobStore
from sqlq.common.workflow import (
    MAX_EDGES,
    MAX_MEMBERS,
    Flow,
    GraphError,
    at_birth,
    plan_graph,
    recount,
)
from sqlq.runtime.claims import Claims, ClaimsView
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.events import Event, Events
from sqlq.runtime.kinds import Registry
from sqlq.runtime.names import QueueNames
from sqlq.runtime.spawn import SpawnRefused, refused, specs_of

R = TypeVar("R")

APPEND_ATTEMPTS = 3  # an append counted again because a parent moved meanwhile, at most


class Submissions:
    def __init__(
        self,
        store: JobStore,
        claims: Claims,
        view: ClaimsView,
        config: RuntimeConfig,
        kinds: Registry,
        events: Events,
        clock: Clock,
    ) -> None:
        self._store = store
        self._claims = claims
        self._view = view  # (the counts --max-queued and --max-queues bound)
        self._config = config
        self._kinds = kinds
        self._events = events
        self._clock = clock
        self._admitting = 0  # jobs in submissions not yet durable, for --max-queued
        fixed = {DEFAULT_QUEUE, *config.remote_queues, *config.queue_caps, *config.queue_policies}
        self.names = QueueNames(config.max_queues, config.principals, fixed, view.live_queues,
                                view.paused_queues)  # (--max-queues)  # fmt: skip
        self._keys: dict[str, asyncio.Future[None]] = {}  # idempotency keys being submitted
        self._is_remote = config.remote_test()  # (``RuntimeConfig.is_remote``)

    def build(
        self, spec: JobSpec, now: float, *, job_id: str | None = None, flow: Flow | None = None
    ) -> Job:
        """A new job from a client's spec (a workflow member: its id, made beforehand, and
        its ``flow``); raises ``ValidationError`` naming the field."""
        check_args(spec.args)  # HTTP checked the bytes; a spec built in Python is checked here
        kinds = self._kinds
        if self._is_remote(spec.queue) and spec.kind not in kinds:
            args = spec.args  # a remote worker's kind: any name, any JSON object (bounded)
            rules_max = None
        else:  # (a task this server imports is checked in a remote queue too)
            kind = kinds.get(spec.kind)  # (``ValidationError`` naming an unknown kind)
            args = kind.validate(spec.args)
            rules_max = kind.rules.max_attempts
        if spec.delay_ms is not None and spec.run_at is not None:
            raise ValidationError("run_at", "give delay_ms or run_at, not both")
        ready_at = now
        if spec.delay_ms is not None:
            ready_at = now + spec.delay_ms / 1000
        elif spec.run_at is not None:
            if spec.run_at > now + MAX_DELAY_MS / 1000:
                raise ValidationError("run_at", "more than a year and a day from now")
            ready_at = spec.run_at
        key = spec.idempotency_key
        return Job.new(
            kind=spec.kind,
            args=args,
            now=now,
            ready_at=ready_at,
            max_attempts=spec.max_attempts or rules_max or self._config.max_attempts,
            priority=spec.priority,
            queue=spec.queue,
            idempotency_key=key,
            request_hash=None if key is None else spec.request_hash(),
            job_id=job_id,
            flow=flow,
            key=spec.key,
            weight=spec.weight,
        )

    def _build_all(
        self, specs: Sequence[JobSpec], now: float, batch: bool, workflow: bool | str = False,
        members: Sequence[Job] = (),
    ) -> list[Job]:  # fmt: skip
        if workflow:
            return self._build_members(specs, now, workflow, members)
        jobs = []
        for i, spec in enumerate(specs):
            try:
                if type(spec) is not JobSpec:  # (a MemberSpec outside a workflow)
                    _outside(spec)
                jobs.append(self.build(spec, now))
            except ValidationError as exc:
                if not batch:
                    raise
                raise ValidationError(f"jobs[{i}].{exc.field}", exc.message) from None
        return jobs

    def _build_members(
        self, specs: Sequence[JobSpec], now: float, workflow: bool | str, members: Sequence[Job]
    ) -> list[Job]:
        jobs = []
        placed = self._members(specs, now, workflow, members)
        for i, (spec, member) in enumerate(zip(specs, placed, strict=True)):
            try:
                jobs.append(self.build(spec, now, job_id=member.job_id, flow=member.flow))
            except ValidationError as exc:
                raise ValidationError(f"jobs[{i}].{exc.field}", exc.message) from None
        return jobs

    def _members(
        self, specs: Sequence[JobSpec], now: float, workflow: bool | str, kept: Sequence[Job]
    ) -> list[_Member]:
        """Each job's place in the workflow ``specs`` make (``workflow`` True) or join (its
        id; ``kept``: its members as read): its id and ``Flow``, counted against its
        parents as read (a parent of this batch is pending). The store checks the counts
        in the commit (``cascade.check_member``): a parent that moved since fails it."""
        for i, spec in enumerate(specs):
            if spec.idempotency_key is not None:
                raise ValidationError(
                    f"jobs[{i}].idempotency_key", "a workflow's jobs take no key yet"
                )
        graph = [s if isinstance(s, MemberSpec) else MemberSpec(kind=s.kind) for s in specs]
        refs = {s.ref for s in graph if s.ref is not None}
        existing = {j.id: j.state.value for j in kept}
        taken = {j.flow.ref for j in kept if j.flow is not None and j.flow.ref is not None}
        for i, s in enumerate(graph):  # a ref names one member of the workflow, and no id
            if s.ref is not None and (s.ref in taken or s.ref in existing):
                raise ValidationError(f"jobs[{i}].ref", f"the workflow has a member {s.ref!r}")
        if sum(len(s.depends_on) for s in graph) > MAX_EDGES:  # (kept members' edges too)
            raise ValidationError("jobs", f"the graph has more than {MAX_EDGES} edges")
        outside = [[p for p in s.depends_on if p not in refs] for s in graph]  # kept members'
        for i, named in enumerate(outside):
            for p in named:
                if p not in existing:
                    also = ", nor the workflow a member with that id" if kept else ""
                    raise ValidationError(
                        f"jobs[{i}].depends_on", f"no job in this batch has the ref {p!r}{also}"
                    )
            if len(set(named)) < len(named):
                raise ValidationError(f"jobs[{i}].depends_on", "a parent is named twice")
        inside = [[p for p in s.depends_on if p in refs] for s in graph]
        try:
            parents = plan_graph([s.ref for s in graph], inside)
        except GraphError as exc:
            raise ValidationError(f"jobs[{exc.index}].{exc.field}", str(exc)) from None
        workflow_id = workflow if isinstance(workflow, str) else new_job_id(now)
        ids = [new_job_id(now) for _ in specs]
        state_of = {**existing, **dict.fromkeys(ids, "waiting")}.get
        members: list[_Member] = []
        for i, (spec, mine) in enumerate(zip(graph, parents, strict=True)):
            flow = Flow(
                workflow_id=workflow_id, ref=spec.ref,
                parents=(*(ids[p] for p in mine), *outside[i]),
                on_parent_failure=spec.on_parent_failure, run_if=spec.run_if,
            )  # fmt: skip
            counted = recount(flow, state_of)
            if counted is None:
                failed = next(p for p in outside[i] if state_of(p) in ("dead", "cancelled"))
                raise IllegalTransitionError(
                    failed, f"jobs[{i}] would never run after it: it has failed; retry it first"
                )
            members.append(_Member(ids[i], at_birth(counted)))
        return members

    async def submit(
        self, specs: Sequence[JobSpec], *, batch: bool = False, workflow: bool | str = False,
        who: str | None = None,
    ) -> tuple[list[Job], list[bool]]:  # fmt: skip
        """Validate, commit as one atomic change, then make claimable: the jobs (durable on
        return), and which are new; ``who``: the principal whose new queue names they are.

        A spec whose key a retained job already holds gets that job back (not
        new) if it asks for the same thing, and ``IdempotencyConflictError``
        otherwise.
        """
        if isinstance(workflow, str):
            return (jobs := await self._append(specs, workflow, who)), [True] * len(jobs)
        if workflow:  # (its jobs take no idempotency key yet: ``_members``)
            return (jobs := await self._submit_new(specs, batch, True, who=who)), [True] * len(jobs)
        keyed: dict[int, str] = {}
        for i, s in enumerate(specs):  # (a loop, not a comprehension: no frame a submission)
            if s.idempotency_key:
                keyed[i] = s.idempotency_key
        if not keyed:
            return (jobs := await self._submit_new(specs, batch, who=who)), [True] * len(jobs)
        seen: dict[str, int] = {}
        for i, key in keyed.items():
            if key in seen:
                raise ValidationError(f"jobs[{i}].idempotency_key", "appears twice in this batch")
            seen[key] = i
        reservation = await self._reserve(list(seen))
        try:
            attempts = self._claims.key_attempts  # see there: more than one where others insert
            for attempt in range(1, attempts + 1):
                existing: dict[int, Job] = {}
                for i, key in keyed.items():
                    job = await self._store.find_key(key)
                    if job is not None:
                        if job.request_hash != specs[i].request_hash():
                            raise IdempotencyConflictError(key, job.id)
                        existing[i] = job
                new = [s for i, s in enumerate(specs) if i not in existing]
                try:
                    made = iter(await self._submit_new(new, batch, who=who) if new else [])
                except DuplicateKeyError as exc:
                    if attempt == attempts:
                        raise IdempotencyConflictError(exc.key, "?") from exc
                    continue
                jobs = [existing[i] if i in existing else next(made) for i in range(len(specs))]
                return jobs, [i not in existing for i in range(len(specs))]
            raise AssertionError("unreachable")
        finally:
            for key in seen:
                del self._keys[key]
            reservation.set_result(None)

    async def _reserve(self, keys: list[str]) -> asyncio.Future[None]:
        """Hold ``keys`` for one submission; waits while another holds any of them."""
        while busy := [self._keys[k] for k in keys if k in self._keys]:
            await asyncio.wait(busy)
        reservation: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for k in keys:
            self._keys[k] = reservation
        return reservation

    async def _append(
        self, specs: Sequence[JobSpec], workflow_id: str, who: str | None
    ) -> list[Job]:
        """``specs`` joining the workflow ``workflow_id``, counted against its members as
        read; counted again if one of their parents moved before the commit."""
        for attempt in range(1, APPEND_ATTEMPTS + 1):
            members = await self._kept(workflow_id, len(specs))
            try:
                return await self._submit_new(specs, True, workflow_id, members, who)
            except IllegalTransitionError as exc:
                if MOVED not in str(exc) or attempt == APPEND_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    async def _kept(self, workflow_id: str, more: int) -> list[Job]:
        """The members of ``workflow_id`` as they stand, with room for ``more``."""
        members = await self._store.workflow(workflow_id)
        if not members:
            raise ValidationError("workflow", f"no workflow {workflow_id} is kept")
        if len(members) + more > MAX_MEMBERS:
            raise ValidationError(
                "workflow", f"a workflow holds at most {MAX_MEMBERS} jobs kept at once"
            )
        return members

    async def spawned(
        self,
        job: Job,
        t: Transition,
        spawn: Sequence[JSON],
        write: Callable[[list[Job]], Awaitable[R]],
        who: str | None = None,
    ) -> R:
        """``Spawner`` (``sqlq.runtime.spawn``): the jobs ``job``'s handler spawned, members
        of its workflow (of a new one if it is in none) counted against it as completed by
        ``t``, admitted like a submission's and written by ``write`` in ``t``'s commit;
        counted again if a parent of theirs moved before it, as an append is."""
        specs = specs_of(spawn)
        flow, after = job.flow, job.apply(t)
        if flow is not None:  # each with no parent in the spawn is the spawning job's child
            specs = [s if s.depends_on else replace(s, depends_on=(job.id,)) for s in specs]
        for attempt in range(1, APPEND_ATTEMPTS + 1):
            now = self._clock.time()
            try:
                if flow is None:
                    jobs = self._build_members(specs, now, True, ())
                else:
                    kept = await self._kept(flow.workflow_id, len(specs))
                    kept = [after if m.id == job.id else m for m in kept]
                    jobs = self._build_members(specs, now, flow.workflow_id, kept)
                with self.admission(jobs, True, who):
                    answer = await write(jobs)
            except ValidationError as exc:
                raise refused(exc) from None
            except QueueFullError as exc:
                raise SpawnRefused(f"spawn refused: {exc}", final=False) from None
            except IllegalTransitionError as exc:
                if exc.job_id == job.id:  # its completion was refused: fenced, not the spawn
                    raise
                moved = MOVED in str(exc)
                if moved and attempt < APPEND_ATTEMPTS:
                    continue
                raise SpawnRefused(f"spawn refused: {exc}", final=not moved) from None
            self._claims.submitted(jobs)
            for new in jobs:
                self._events.record(Event.SUBMITTED, new)
            return answer
        raise AssertionError("unreachable")

    async def _submit_new(
        self, specs: Sequence[JobSpec], batch: bool, workflow: bool | str = False,
        members: Sequence[Job] = (), who: str | None = None,
    ) -> list[Job]:  # fmt: skip
        jobs = self._build_all(specs, self._clock.time(), batch, workflow, members)
        with self.admission(jobs, batch, who):
            await self._store.commit(jobs)
        self._claims.submitted(jobs)
        for job in jobs:
            self._events.record(Event.SUBMITTED, job)
        return jobs

    def admission(self, jobs: Sequence[Job], batch: bool, who: str | None = None) -> _Admitted:
        """Admit ``jobs`` as live under ``--max-queued`` and ``--max-queues`` (their new
        names ``who``'s, ``QueueNames``), holding their place and their new names until
        the commit that makes them live is over (``with``). Submissions and retries alike:
        both add live jobs, perhaps in new queues. A plain class, not a generator's context
        manager: every submission makes one (two nested generators cost a no-op job ~2 us,
        measured)."""
        limit = self._config.max_queued
        if self._view.backlog() + self._admitting + len(jobs) > limit:
            self._events.record(Event.REFUSED_FULL, n=len(jobs))
            raise QueueFullError(limit)
        new = self._new_queues_of(jobs, batch, who)
        self._admitting += len(jobs)
        if new:
            self.names.hold(new, who)
        return _Admitted(self, len(jobs), new)

    def _let_go(self, n: int, new: list[str]) -> None:
        self._admitting -= n
        if new:
            self.names.let_go(new)

    def _new_queues_of(self, jobs: Sequence[Job], batch: bool, who: str | None) -> list[str]:
        """The queue names ``jobs`` would add (``--max-queues``); ``ValidationError`` naming
        the field of the first job past the bound."""
        names = self.names
        new: list[str] = []
        for i, job in enumerate(jobs):
            queue = job.queue
            if queue in new or names.known(queue):
                continue
            names.check_new(f"jobs[{i}].queue" if batch else "queue", who, len(new))
            new.append(queue)
        return new


def _outside(spec: JobSpec) -> None:
    """Refuse what only a workflow's member may say, naming the field."""
    field = spec.in_graph() if isinstance(spec, MemberSpec) else None
    if field is not None:
        raise ValidationError(
            field, 'only a workflow\'s job has one: submit them in a batch with "workflow": true'
        )


class _Member(NamedTuple):
    """A workflow member's id, made before its job, and its place in the graph."""

    job_id: str
    flow: Flow


class _Admitted:
    """What ``admission`` and ``holding`` hold, let go at the ``with``'s end."""

    __slots__ = ("_n", "_new", "_of")

    def __init__(self, of: Submissions, n: int, new: list[str]) -> None:
        self._of, self._n, self._new = of, n, new

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self._of._let_go(self._n, self._new)
