"""The response bodies that the server writes and the client reads.

Both sides decode and encode these same msgspec structs, so a field is named
once; ``sqlq.http.openapi`` publishes their JSON Schema, and the client reads
responses with them, so neither imports the other.
"""

from __future__ import annotations

import msgspec

from sqlq.common.fair import Policy
from sqlq.common.models import DEFAULT_MAX_ATTEMPTS, JSON, Job, State
from sqlq.common.running import AttemptError, Progress
from sqlq.common.schedule import ScheduleSpec, schedule_of
from sqlq.common.workflow import CancelReason, Flow, Overall, blocked_by, overall, retried

MAX_WAIT_S = 60  # seconds: the longest GET /jobs/{id}?wait= the server holds a request for


class ErrorBody(msgspec.Struct):
    error: str  # a stable code: invalid, bad_json, not_found, conflict, running, ...
    message: str  # for people; never more than ~200 characters of the request
    field: str | None = None  # what was wrong: a JSON path, a parameter, a header


class JobView(msgspec.Struct, frozen=True):
    """A job as the API (and the dashboard) shows it: what is stored, less ``request_hash``
    (idempotency's own detail), with ``attempts_total`` every attempt ever made
    (``Job.all_attempts``; the stored field counts only those before the last operator
    retry), ``cancel_requested``, and for a job a schedule made, which schedule and which
    tick (``sqlq.common.schedule.schedule_of`` its key; ``tick`` None for a triggered one),
    read from the key, never stored twice. Its own struct, not a ``Job``: a field the
    store keeps is not shown merely because it is kept. Made only by ``job_view``.

    The defaults are ``Job``'s, so a client reads an older server's answer too. Not
    ``kw_only``: ``job_view`` passes its fields by position, 0.4 us a job where 25
    keywords took 1.3-3 us (measured; every submit answers one)."""

    id: str
    kind: str
    args: JSON
    ready_at: float  # wall-clock seconds; not before this
    created_at: float
    updated_at: float
    state: State = State.SCHEDULED
    attempts: int = 0  # attempts started within the current budget
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    attempts_total: int = 0  # every attempt the job ever made, through every retry
    priority: int = 0
    epoch: int = 0
    started_at: float | None = None
    last_error: str | None = None
    result: JSON = None
    queue: str = "default"
    idempotency_key: str | None = None
    cancel_requested: bool = False  # a cancel was asked for while it ran
    cancel_requested_at: float | None = None
    progress: Progress | None = None  # the latest its handler reported
    checkpoint: JSON = None  # what an attempt saved for the next one; null: nothing
    snoozes: int = 0
    errors: tuple[AttemptError, ...] = ()  # the last failures, newest last
    schedule: str | None = None
    tick: int | None = None
    holder: str | None = None  # a running job's remote worker (``worker:<name>``) or node
    lease_until: float | None = None  # when that holder's lease runs out unless renewed
    cancel_forced: bool = False  # a forced cancel holds that lease: it ends cancelled then
    # A workflow member's place in its graph: its workflow, ref, parents, how many of them
    # have not settled, its two policies, and why it was cancelled (null outside workflows)
    flow: Flow | None = None
    key: str | None = None  # its fairness key (``sqlq.common.fair``), and its weight
    weight: int = 1


def job_view(job: Job, *, tracebacks: bool = True) -> JobView:
    """``job`` as every route and page shows it; by position, in ``JobView``'s order
    (tests/test_wire.py holds each field to the job's), but for the last two, a fair
    claim's key and weight: past 30 arguments msgspec's constructor takes a slower path
    (+0.3 us, measured), so a job with a key pays for them, one without never does.
    ``tracebacks=False``: its errors without them (a claim's grant: a worker reads why
    earlier attempts failed, never where, and a job's 32 KiB of tracebacks would go with
    every claim of it)."""
    errors = job.errors
    if not tracebacks and any(e.traceback is not None for e in errors):
        errors = tuple(AttemptError(attempt=e.attempt, error=e.error, at=e.at) for e in errors)
    made = schedule_of(job.idempotency_key)
    schedule, tick = (None, None) if made is None else made
    view = JobView(
        job.id, job.kind, job.args, job.ready_at, job.created_at, job.updated_at, job.state,
        job.attempts, job.max_attempts, job.all_attempts, job.priority, job.epoch,
        job.started_at, job.last_error, job.result, job.queue, job.idempotency_key,
        job.cancel_requested_at is not None, job.cancel_requested_at, job.progress,
        job.checkpoint, job.snoozes, errors, schedule, tick, job.holder, job.lease_until,
        job.cancel_forced, job.flow,
    )  # fmt: skip
    if job.key is None and job.weight == 1:  # (a 31st argument would cost a plain job 0.3 us)
        return view
    return msgspec.structs.replace(view, key=job.key, weight=job.weight)


_SHOWN = {f.name for f in msgspec.structs.fields(JobView)} - {"cancel_requested", "schedule",
                                                              "tick"}  # fmt: skip
assert _SHOWN == {f.name for f in msgspec.structs.fields(Job)} - {"request_hash"}, (
    "a stored field JobView neither shows nor leaves out on purpose"
)


class WorkflowMember(msgspec.Struct, frozen=True):
    """A workflow's member as ``GET /workflows/{id}`` shows it: its edges, and while it
    waits, the parents it waits for (``blocked_by``)."""

    id: str
    kind: str
    state: State
    ref: str | None = None
    parents: tuple[str, ...] = ()
    blocked_by: list[str] = msgspec.field(default_factory=list)
    cancel_reason: CancelReason | None = None


class WorkflowView(msgspec.Struct, frozen=True):
    """A workflow: its overall state (``sqlq.common.workflow.overall``) and its members'
    counts by state, over every member; and one page of its members, in the order they
    were stored (``next``: pass it back as ``?after=`` for the page after; null on the last).
    A page, because a workflow may hold 100,000 members: the whole list was a 20 MB
    answer, encoded on the event loop."""

    id: str
    state: Overall
    counts: dict[str, int]
    jobs: list[WorkflowMember]
    retryable: int = 0  # the dead members ``POST /workflows/{id}/retry`` would revive now
    next: str | None = None


def workflow_view(
    workflow_id: str, jobs: list[Job], page: list[Job] | None = None, next: str | None = None
) -> WorkflowView:
    """The view of a workflow from its members (as the store keeps them): its state and
    counts from all of them, and ``page`` of them listed (all when None)."""
    states = {j.id: j.state.value for j in jobs}
    state_of = states.get
    counts: dict[str, int] = {}
    for j in jobs:
        counts[j.state.value] = counts.get(j.state.value, 0) + 1
    members = []
    for j in jobs if page is None else page:
        flow = j.flow
        if flow is None:  # (every member has one)
            members.append(WorkflowMember(j.id, j.kind, j.state))
            continue
        waits = blocked_by(flow, state_of) if j.state is State.WAITING else []
        members.append(WorkflowMember(
            j.id, j.kind, j.state, flow.ref, flow.parents, waits, flow.cancel_reason
        ))  # fmt: skip
    state = overall(((j.state.value, j.flow) for j in jobs), state_of)
    again = retried(((j.id, j.state.value, j.flow) for j in jobs), state_of)
    return WorkflowView(workflow_id, state, counts, members, len(again), next)


class JobPage(msgspec.Struct):
    jobs: list[JobView]
    next: str | None  # pass back as ?after= for the next page; null on the last one


class BatchResult(msgspec.Struct):
    ids: list[str]
    created: list[bool]  # false: an idempotency key returned an existing job
    workflow_id: str | None = None  # a batch with ``workflow``: the new workflow's id


class Retried(msgspec.Struct):
    retried: int


class CancelCounts(msgspec.Struct):
    """``POST /jobs/cancel``: jobs cancelled before they ran, and running ones asked to stop
    (each ends as its attempt decides: cancelled, or completed if it finishes first)."""

    cancelled: int
    requested: int


class QueueView(msgspec.Struct):
    name: str
    depth: int
    running: int
    limit: int | None
    paused: bool
    remote: bool = False  # served by remote workers only (--remote-queue, --workers 0)
    # Set while a remote queue has jobs waiting and no worker claimed from it lately, or
    # jobs of kinds none of its workers runs.
    warning: str | None = None
    # Of a remote queue: kinds sent to it that no worker claimed since, past a while
    # (``WORKER_SEEN_S``), and that no worker seen lately says it runs.
    unclaimed_kinds: list[str] = msgspec.field(default_factory=list)
    # Its policy: per-key concurrency and rates, a queue-wide rate, fair claims between
    # keys (``sqlq.common.fair``); null: none, the plain claim.
    policy: Policy | None = None


class QueueList(msgspec.Struct):
    queues: list[QueueView]


class Health(msgspec.Struct):
    status: str
    reason: str


class Ready(msgspec.Struct):
    ready: bool
    reason: str


class JobRef(msgspec.Struct):
    id: str
    state: State | None  # None: pruned past retention


class ScheduleView(msgspec.Struct):
    """A schedule as ``GET /schedules/{name}`` shows it."""

    name: str
    spec: ScheduleSpec
    next_at: float | None  # when its next tick falls (unix seconds); None while paused
    last_tick: int | None  # the newest tick a job was enqueued for; None: none yet
    last_job: JobRef | None  # that tick's job


class ScheduleList(msgspec.Struct):
    schedules: list[ScheduleView]
