"""The pull protocol a remote worker speaks: the bodies of ``/claims`` and its answers.

A worker anywhere (``sqlq worker``, ``examples/worker.mjs``, curl) claims jobs with a
lease, renews every lease it holds in one heartbeat, and reports outcomes, one at a
time or in batches. Every claim carries a token (``sqlq.common.tokens``) that names
the job, the epoch it was claimed at and the lease's length; every heartbeat and
outcome is fenced on it: the job must still be running at that epoch, held remotely,
with its lease unexpired. Anything else is ``fenced`` (a 409 for a single outcome),
never a silent success.

Client and server both decode and encode these structs (``sqlq.Worker`` over
``AsyncClient``; the server's routes in ``sqlq.http``), so the bounds are written once,
here, and ``/openapi.json`` is made from them.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from sqlq.common.errors import ValidationError
from sqlq.common.models import State
from sqlq.common.running import MAX_CHECKPOINT_BYTES, MAX_PROGRESS_MESSAGE, MAX_SNOOZE_S
from sqlq.common.specs import CLEANED, MAX_BATCH, MAX_KIND, Queue
from sqlq.common.wire import JobView
from sqlq.common.workflow import MAX_PARENTS

MAX_CLAIM = 100  # jobs one claim may take
MAX_WAIT_CLAIM_S = 30.0  # the longest a claim long-polls
MIN_LEASE_S, MAX_LEASE_S, DEFAULT_LEASE_S = 5.0, 3600.0, 30.0
MAX_ITEMS = 1000  # tokens in one heartbeat, outcomes in one batch
MAX_CLAIM_QUEUES = 100  # queues one claim may name
MAX_CLAIM_KINDS = 100  # kinds one claim may name
MAX_TOKEN = 256  # characters of a token (a real one is about 80)
MAX_ERROR = 4096  # characters of a failure's error (``clean_error`` keeps this much)
MAX_TRACEBACK = 8192  # characters of its traceback (``clean_traceback`` cuts it to 8 KiB)
MAX_RETRY_IN_S = MAX_SNOOZE_S
# A worker's name: what it calls itself (``host-pid`` by default), shown in GET /workers
# and stored as its claims' holder. The pattern is a queue's: printable, no spaces.
WORKER_PATTERN = r"^[A-Za-z0-9_.:-]{1,64}$(?!\n)"
REMOTE_PREFIX = "worker:"  # a remote claim's holder; no node name starts with it
MAX_WORKERS_SEEN = 1000  # workers GET /workers remembers (the oldest seen is forgotten)
WORKER_SEEN_S = 60.0  # a remote queue with waiting jobs and no worker seen this long warns

Token = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_TOKEN)]
WorkerName = Annotated[str, msgspec.Meta(pattern=WORKER_PATTERN)]
Kind = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_KIND)]
Percent = Annotated[float, msgspec.Meta(ge=0, le=100)]
# What a worker says of an attempt in its own words (a handler's exception text, a progress
# message): cleaned where it is stored (``clean_error``), never refused for a NUL.
ErrorText = Annotated[str, msgspec.Meta(max_length=MAX_ERROR, extra={CLEANED: True})]
TracebackText = Annotated[str, msgspec.Meta(max_length=MAX_TRACEBACK, extra={CLEANED: True})]
ProgressText = Annotated[str, msgspec.Meta(max_length=MAX_PROGRESS_MESSAGE, extra={CLEANED: True})]


def remote_holder(worker: str) -> str:
    """The holder stored for ``worker``'s claims (``Job.holder``)."""
    return REMOTE_PREFIX + worker


def remote_worker(holder: str | None) -> str | None:
    """The remote worker a holder names; None for an in-process claim or a node's."""
    if holder is None or not holder.startswith(REMOTE_PREFIX):
        return None
    return holder[len(REMOTE_PREFIX) :]


class ClaimRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """``POST /claims``: up to ``max`` due jobs of ``queues`` (of ``kinds``, if named),
    waiting up to ``wait_s`` for the first, each held for ``lease_s`` unless renewed.

    ``outcomes``: what a worker has to report, as ``/claims/outcomes`` takes them, carried
    on the claim that takes the next jobs so a busy worker makes one call a round instead
    of two. They are written beside the claim (before it on a capped queue, whose room
    they free), and answered in ``ClaimAnswer.outcomes`` as that route answers them; a
    claim that carries any does not wait (its outcomes' answers would wait with it)."""

    queues: Annotated[list[Queue], msgspec.Meta(min_length=1, max_length=MAX_CLAIM_QUEUES)]
    worker: WorkerName
    kinds: Annotated[list[Kind], msgspec.Meta(min_length=1, max_length=MAX_CLAIM_KINDS)] | None = (
        None
    )
    max: Annotated[int, msgspec.Meta(ge=1, le=MAX_CLAIM)] = 1
    wait_s: Annotated[float, msgspec.Meta(ge=0, le=MAX_WAIT_CLAIM_S)] = 0.0
    lease_s: Annotated[float, msgspec.Meta(ge=MIN_LEASE_S, le=MAX_LEASE_S)] = DEFAULT_LEASE_S
    outcomes: Annotated[list[Outcome], msgspec.Meta(max_length=MAX_ITEMS)] | None = None


class Granted(msgspec.Struct, kw_only=True):
    """One claimed job: the token to report it with, and when its lease runs out."""

    token: str
    lease_until: float  # unix seconds
    job: JobView


class ClaimAnswer(msgspec.Struct, kw_only=True, omit_defaults=True):
    claims: list[Granted]
    outcomes: list[Reported] | None = None  # the claim's ``outcomes``' answers, in order


class ProgressIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Progress as a worker reports it; the server stamps the time."""

    percent: Percent | None = None
    message: ProgressText | None = None


class BeatItem(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    token: Token
    progress: ProgressIn | None = None


class HeartbeatRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /claims/heartbeat``: renew every lease a worker holds, in one call; each
    token named once (``check_heartbeat``)."""

    items: Annotated[list[BeatItem], msgspec.Meta(max_length=MAX_ITEMS)]


def check_heartbeat(req: HeartbeatRequest) -> HeartbeatRequest:
    """``req``, if it names each token at most once; else a ``ValidationError`` naming the
    second (a 422). A lease is renewed once a call: one token named 1,000 times was 1,000
    writes, each in its turn, seconds of one request. The route holds every decoded
    heartbeat to it; the runtime's own callers (tests, a model) may still repeat one."""
    first: dict[str, int] = {}
    for i, item in enumerate(req.items):
        at = first.setdefault(item.token, i)
        if at != i:
            raise ValidationError(f"items[{i}].token", f"the same token as items[{at}]; "
                                  "name each lease once a heartbeat")  # fmt: skip
    return req


class Beat(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One heartbeat item's answer: the lease renewed (and whether a cancel was asked for),
    or ``error`` ``fenced`` (the worker must stop: the job is no longer its)."""

    token: str
    lease_until: float | None = None
    cancel_requested: bool | None = None  # true or false in every renewed item; absent if not
    error: str | None = None


class HeartbeatAnswer(msgspec.Struct, kw_only=True):
    items: list[Beat]


class CompleteIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """A completed attempt: its result, and the jobs its handler spawned (``sqlq.spawn``),
    each what ``POST /jobs/batch`` takes, stored in the completion's commit. Sent without
    its defaults, so a completion that spawns nothing reads as it did to an older server."""

    result: Any = None
    spawn: Annotated[list[Any], msgspec.Meta(min_length=1, max_length=MAX_BATCH)] | None = None


class FailIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """A failed attempt: through the retry policy (``retry_in_s`` instead of the backoff),
    or dead-lettered at once with ``retry: false``. Sent without its defaults, so a
    failure with no traceback reads as it did to a server older than the field (one with
    a traceback needs a server that knows it: upgrade servers before workers)."""

    error: ErrorText = "failed"
    retry: bool = True
    retry_in_s: Annotated[float, msgspec.Meta(ge=0, le=MAX_RETRY_IN_S)] | None = None
    traceback: TracebackText | None = None  # where the handler failed (kept cut: ``errors``)


class SnoozeIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    delay_s: Annotated[float, msgspec.Meta(ge=0, le=MAX_SNOOZE_S)]


class CheckpointIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Saved durably for the next attempt (at most ``MAX_CHECKPOINT_BYTES`` of JSON, within
    the stored-value bounds: ``sqlq.common.running.check_checkpoint``)."""

    data: Any


class ReleaseIn(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Give the job back unstarted: due again now, no attempt counted."""


# The single forms (``POST /claims/complete`` ...): the same, with the token.
class CompleteBody(CompleteIn, kw_only=True):
    token: Token


class FailBody(FailIn, kw_only=True):
    token: Token


class SnoozeBody(SnoozeIn, kw_only=True):
    token: Token


class CheckpointBody(CheckpointIn, kw_only=True):
    token: Token


class ReleaseBody(ReleaseIn, kw_only=True):
    token: Token


What = CompleteIn | FailIn | SnoozeIn | CheckpointIn | ReleaseIn  # what an outcome says


class Outcome(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One item of ``POST /claims/outcomes``: its token and exactly one of the five
    (``what`` reads it; more or none is invalid, and fails that item alone)."""

    token: Token
    complete: CompleteIn | None = None
    fail: FailIn | None = None
    snooze: SnoozeIn | None = None
    checkpoint: CheckpointIn | None = None
    release: ReleaseIn | None = None

    def what(self) -> What:
        """The one outcome this item says; ``ValueError`` naming the fields otherwise."""
        said = [w for w in (self.complete, self.fail, self.snooze, self.checkpoint,
                            self.release) if w is not None]  # fmt: skip
        if len(said) != 1:
            raise ValueError(
                "an outcome names exactly one of complete, fail, snooze, checkpoint, release"
            )
        return said[0]


class OutcomesRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    outcomes: Annotated[list[Outcome], msgspec.Meta(min_length=1, max_length=MAX_ITEMS)]


class Reported(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One outcome's answer: the job's state after it (``checkpoint``: still running), or
    ``error``: ``fenced`` (stale: the epoch moved on, the lease ran out, the job was
    cancelled or finished), a bad value (``invalid``, with ``detail`` naming the field),
    ``forbidden`` (another queue's job), or ``unavailable`` (in a batch: this item's write
    did not land while others did; send it again).
    A single outcome answers 200 with this, 409 if fenced, 422 if invalid."""

    token: str
    state: str | None = None
    error: str | None = None
    detail: str | None = None


class OutcomesAnswer(msgspec.Struct, kw_only=True):
    outcomes: list[Reported]


class WorkerView(msgspec.Struct, kw_only=True):
    """A remote worker this server has seen (``GET /workers``)."""

    name: str  # what the worker calls itself
    principal: str  # the token's name it came with ("admin", or a --token-file line's NAME)
    role: str
    last_seen: float  # its latest claim, heartbeat or outcome, unix seconds
    held: int  # jobs it holds now, as this process knows (shared mode: 0, not counted)
    queues: list[str]  # the queues it claimed from lately
    kinds: list[str] | None = None  # the kinds it runs, as its latest claim named them (None: any)


class WorkerList(msgspec.Struct, kw_only=True):
    workers: list[WorkerView]


FENCED = "fenced"
UNAVAILABLE = "unavailable"  # a batch item the store did not take while others landed: again
CHECKPOINT_LIMIT = MAX_CHECKPOINT_BYTES  # (re-exported for the worker's own check)


class ParentsBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /claims/parents``: a page of the claimed job's parents, from the ``start``-th
    (in the order they were named; the first page's answer says where the next starts)."""

    token: Token
    start: Annotated[int, msgspec.Meta(ge=0, le=MAX_PARENTS)] = 0


class ParentView(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One parent of a workflow member, as its handler reads it (``ctx.parents``): its
    state, and its result (completed) or its last error (dead or cancelled). A parent no
    longer kept reads ``state`` None."""

    job_id: str
    ref: str | None = None
    state: State | None = None
    result: Any = None
    error: str | None = None


class ParentsPage(msgspec.Struct, kw_only=True):
    """A page of a member's parents: ``next`` is where the next page starts (None: this
    was the last), ``total`` how many it has."""

    parents: list[ParentView]
    next: int | None
    total: int
