"""The job, its states, and the one table of legal transitions.

Every engine and the runtime consult ``TRANSITIONS``; SQLite gets a copy as a table.

A state change is a ``Transition``: the full set of fields that change, plus the
epoch the caller believes the job has. Engines never compute new values; they
check the guard (job exists, epoch matches, move is legal) and store the fields.
That keeps the fold trivial and identical in every engine.
"""

from __future__ import annotations

import random
import re
import sys
from collections.abc import Callable
from enum import StrEnum
from typing import Any

import msgspec

from sqlq.common.errors import IllegalTransitionError, StaleEpochError
from sqlq.common.running import AttemptError, Progress, clean_error, with_error
from sqlq.common.workflow import (
    UPSTREAM,
    CancelReason,
    Ended,
    Flow,
    FlowChange,
    Verdict,
    after_parent,
    recount,
    settles_failure,
)

JSON = Any  # a value msgspec.json can encode: dict, list, str, int, float, bool, None


DEFAULT_QUEUE = "default"  # the queue a job names none of; configured, never refused


class State(StrEnum):
    SCHEDULED = "scheduled"  # waiting for ready_at, or ready and waiting for a worker
    RUNNING = "running"  # a worker holds it at the current epoch
    COMPLETED = "completed"  # finished; result stored (terminal)
    DEAD = "dead"  # attempts used up, dead-lettered (terminal)
    CANCELLED = "cancelled"  # withdrawn: before it ran, or while it ran at a request (terminal)
    WAITING = "waiting"  # a workflow member whose parents have not settled: not claimable


TRANSITIONS: dict[State, frozenset[State]] = {
    State.SCHEDULED: frozenset({State.RUNNING, State.CANCELLED}),
    # running -> scheduled: failed with attempts left, its worker was declared hung, or it
    # snoozed. running -> running: what the attempt carries changed (a cancel was asked
    # for, progress, a checkpoint), at the same epoch. running -> cancelled: it ended
    # after a cancel was asked for.
    State.RUNNING: frozenset(
        {State.COMPLETED, State.SCHEDULED, State.DEAD, State.RUNNING, State.CANCELLED}
    ),
    State.COMPLETED: frozenset(),
    # dead or cancelled -> scheduled: an operator retries it, with a fresh attempt budget.
    State.DEAD: frozenset({State.SCHEDULED}),
    # cancelled -> waiting: a workflow member cancelled for its parent, revived with it.
    State.CANCELLED: frozenset({State.SCHEDULED, State.WAITING}),
    # waiting -> waiting: a parent settled, others have not (``Job.after_parent``);
    # -> scheduled: the last one did; -> cancelled: the child's policy, or a user.
    State.WAITING: frozenset({State.SCHEDULED, State.CANCELLED, State.WAITING}),
}

_RUNNING = State.RUNNING  # (a module global: the enum's attribute costs a lookup per use)

# Finished: nothing runs it again unless an operator retries it. (Not "no move out".)
TERMINAL: frozenset[State] = frozenset({State.COMPLETED, State.DEAD, State.CANCELLED})
RETRYABLE: frozenset[State] = frozenset({State.DEAD, State.CANCELLED})
LIVE: frozenset[State] = frozenset(State) - TERMINAL
DEFAULT_MAX_ATTEMPTS = 5  # a job's attempts unless it (or --max-attempts) says otherwise

# The one empty arguments dict every job with no arguments holds: an empty dict is 64 bytes,
# and a million queued no-op jobs each held their own. Never mutated: the executor hands a
# handler a fresh ``{}`` in its place (``Executor.execute``), so a handler that writes into
# its arguments can't reach another job's.
NO_ARGS: dict[str, Any] = {}


JOB_ID_LENGTH = 32  # hex digits, as ``new_job_id`` makes them
_JOB_ID = re.compile(f"[0-9a-f]{{{JOB_ID_LENGTH}}}")


def is_job_id(value: str) -> bool:
    """Whether ``value`` has the shape of a job id: anything else can name no job, so it
    needs no store lookup (the API, the listing cursor and the dashboard ask this)."""
    return _JOB_ID.fullmatch(value) is not None


def new_job_id(now: float) -> str:
    """32 hex digits: 48 bits of milliseconds since the epoch, then 80 random bits.

    Time-ordered like a UUIDv7, so jobs submitted together sit together in
    SQLite's id-clustered table and a batch rewrites a few pages instead of one
    page per row: 20-40% more sqlite transitions/s at 64 appenders, measured.

    The random bits come from a generator seeded once from ``os.urandom``, not
    from ``os.urandom`` per id: that syscall releases the GIL, and with an
    engine's I/O thread waiting for it the event loop lost it on every submit
    (10 us per call under load instead of 1, measured). Ids need to be unique,
    not unguessable.
    """
    return f"{int(now * 1000) & 0xFFFFFFFFFFFF:012x}{_ID_BITS.getrandbits(80):020x}"


_ID_BITS = random.Random()  # seeded from os.urandom


# Job and Transition are frozen msgspec Structs rather than dataclasses: about 10x
# cheaper to construct here (0.28 us vs 2.8 us for a frozen dataclass), and
# every transition on the append path constructs two or three of them.
#
# Both are ``gc=False``: the cyclic collector never tracks them. A million queued jobs
# are a million objects it would otherwise walk at every full collection (and 16 bytes
# each of its header). Safe because neither can be part of a reference cycle: frozen,
# every field set at construction to a value made before it (JSON values, strings,
# numbers, the running-job structs), and no value refers back to a job.
class Transition(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """One state change, fenced by ``expect_epoch``."""

    job_id: str = msgspec.field(name="id")
    expect_epoch: int
    state: State
    epoch: int
    attempts: int
    ready_at: float
    updated_at: float
    last_error: str | None
    result: JSON
    started_at: float | None = None
    attempts_total: int | None = None  # None: unchanged (only a retry from dead sets it)
    # What a running job carries (``sqlq.common.running``), whole, like the fields above.
    cancel_requested_at: float | None = None
    progress: Progress | None = None
    checkpoint: JSON = None
    snoozes: int = 0
    errors: tuple[AttemptError, ...] = ()
    # Who holds a running job, and until when (``Job.holder``); None once it leaves running.
    holder: str | None = None
    lease_until: float | None = None
    cancel_forced: bool = False  # ``Job.cancel_forced``; omitted when False (old records)
    flow: FlowChange | None = None  # a workflow member's new counts (``FlowChange``); None: as is

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Transition:
        return msgspec.convert(d, cls)


class Job(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A job as stored. Immutable: a change makes a new ``Job`` via ``apply``."""

    id: str
    kind: str
    args: JSON
    state: State = State.SCHEDULED
    attempts: int = 0  # attempts started so far
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    ready_at: float  # wall-clock seconds; not before this
    priority: int = 0  # among jobs that are due, higher runs first; equal ones FIFO
    epoch: int = 0  # bumped at every requeue; fences stale workers
    created_at: float
    updated_at: float
    last_error: str | None = None
    result: JSON = None
    started_at: float | None = None  # when the latest attempt started
    queue: str = DEFAULT_QUEUE  # named queues have their own concurrency cap and pause switch
    idempotency_key: str | None = None  # a client's key: one job per key while retained
    request_hash: str | None = None  # what was asked with that key, to tell a replay from a reuse
    attempts_total: int = 0  # attempts before the latest operator retry (``all_attempts``)
    cancel_requested_at: float | None = None  # a cancel was asked for while it ran
    progress: Progress | None = None  # the latest its handler reported
    checkpoint: JSON = None  # what an attempt saved for the next one; None: nothing
    snoozes: int = 0  # times it snoozed (within the current attempt budget)
    errors: tuple[AttemptError, ...] = ()  # the last MAX_ERRORS failures, newest last
    # A running job's holder and lease. Local engines set them only for a remote worker's
    # claim (``sqlq.common.protocol.remote_holder``): such a job stays running through a
    # restart while its lease holds. PostgreSQL fills them for every claim (its node, or
    # the remote worker) from its own columns, which its claim and renewal statements own.
    holder: str | None = None
    lease_until: float | None = None
    # A forced cancel holds this remote holder's lease where it put it (``force_cancel``): no
    # renewal moves it, so it runs out at the grace's end and the attempt ends cancelled,
    # counted as cut off. Stored, so a restart or another node holds it too; False once the
    # job leaves running, and in every record older than it.
    cancel_forced: bool = False
    # Fair claims (``sqlq.common.fair``): the job's key (a tenant, or any fairness key) and
    # its weight among its queue's keys; a queue's policy says what they do.
    key: str | None = None
    weight: int = 1
    # A workflow member's place in its graph (``sqlq.common.workflow``); None outside every
    # workflow, which costs such a job one pointer.
    flow: Flow | None = None

    @property
    def all_attempts(self) -> int:
        """Every attempt the job ever made, through every operator retry."""
        return self.attempts_total + self.attempts

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    # -- the fold ---------------------------------------------------------------

    def check(self, t: Transition) -> None:
        """Raise unless ``t`` may be applied to this job."""
        if t.expect_epoch != self.epoch:
            raise StaleEpochError(
                self.id, f"epoch is {self.epoch}, the change expected {t.expect_epoch}"
            )
        if t.state not in TRANSITIONS[self.state]:
            raise IllegalTransitionError(
                self.id, f"{self.state.value} -> {t.state.value} is not allowed"
            )
        if t.state is self.state is State.RUNNING and t.started_at != self.started_at:
            # running -> running keeps the attempt's start (SQLite, PostgreSQL restate it)
            raise IllegalTransitionError(self.id, "running -> running may not start an attempt")

    def apply(self, t: Transition) -> Job:
        """The job after ``t``; raises a ``TransitionError`` if ``t`` is refused."""
        self.check(t)
        job = msgspec.structs.replace(
            self,
            state=t.state,
            epoch=t.epoch,
            attempts=t.attempts,
            ready_at=t.ready_at,
            updated_at=t.updated_at,
            last_error=t.last_error,
            result=t.result,
            started_at=t.started_at,
            attempts_total=self.attempts_total if t.attempts_total is None else t.attempts_total,
            cancel_requested_at=t.cancel_requested_at,
            progress=t.progress,
            checkpoint=t.checkpoint,
            snoozes=t.snoozes,
            errors=t.errors,
        )
        if (
            t.holder is not None
            or t.lease_until is not None
            or self.holder is not None
            or self.lease_until is not None
            or t.cancel_forced
        ):  # apart, so a job nobody holds remotely (nearly all) pays nothing for the three:
            # msgspec's replace slows down past 15 keywords (0.5 us to 1.2 us, measured)
            job = msgspec.structs.replace(
                job, holder=t.holder, lease_until=t.lease_until, cancel_forced=t.cancel_forced
            )
        if t.flow is not None:
            job = msgspec.structs.replace(job, flow=t.flow.onto(job.flow))
        return job

    # -- pure constructors of transitions (the runtime's vocabulary) -------------

    def _to(self, state: State, now: float, **changes: Any) -> Transition:
        base = Transition(
            job_id=self.id,
            expect_epoch=self.epoch,
            state=state,
            epoch=self.epoch,
            attempts=self.attempts,
            ready_at=self.ready_at,
            updated_at=now,
            last_error=self.last_error,
            result=self.result,
            started_at=self.started_at,
            cancel_requested_at=self.cancel_requested_at,
            progress=self.progress,
            checkpoint=self.checkpoint,
            snoozes=self.snoozes,
            errors=self.errors,
        )
        if self.holder is not None and state is _RUNNING:  # still held (one that leaves
            # running is nobody's: the three stay at their defaults)
            held = {"holder": self.holder, "lease_until": self.lease_until}
            if self.cancel_forced:
                held["cancel_forced"] = True
            changes = {**held, **changes}
        if self.flow is not None and "flow" not in changes:  # a member's move says so (its
            # reason, not its counts, which the store keeps), so an engine that keeps the flow
            # apart knows whose end may move children without a look for every other job's
            changes = {**changes, "flow": FlowChange.reason(self.flow.cancel_reason)}
        return msgspec.structs.replace(base, **changes) if changes else base

    def start(
        self, now: float, *, holder: str | None = None, lease_until: float | None = None
    ) -> Transition:
        """scheduled -> running; counts the attempt. A remote worker's claim names its
        ``holder`` and a ``lease_until``; an in-process one neither."""
        if holder is None:  # (the in-process path: two keywords fewer, ~1 us, measured)
            return self._to(State.RUNNING, now, attempts=self.attempts + 1, started_at=now)
        return self._to(State.RUNNING, now, attempts=self.attempts + 1, started_at=now,
                        holder=holder, lease_until=lease_until)  # fmt: skip

    def renew(self, now: float, lease_until: float, progress: Progress | None = None) -> Transition:
        """running -> running, same epoch: a remote holder's lease runs until
        ``lease_until`` (never shortened; never moved at all while a forced cancel holds it,
        ``cancel_forced``), with its newest progress (None: as it was)."""
        if self.cancel_forced:
            lease_until = self.lease_until or lease_until
        return self._to(
            State.RUNNING,
            now,
            lease_until=max(lease_until, self.lease_until or lease_until),
            progress=self.progress if progress is None else progress,
        )

    def release(self, now: float, *, cancelled: bool = False) -> Transition:
        """running -> scheduled (``cancelled``: -> cancelled), a new epoch: its holder gives
        the job back before starting it, so the attempt is not counted and no error is
        added; it keeps its ``ready_at``, its place in line (``backoff.released``)."""
        return self._to(
            State.CANCELLED if cancelled else State.SCHEDULED,
            now,
            epoch=self.epoch + 1,
            attempts=max(0, self.attempts - 1),
        )

    def complete(self, result: JSON, now: float) -> Transition:
        """running -> completed; its checkpoint is spent (errors stay, as its history)."""
        return self._to(State.COMPLETED, now, result=result, last_error=None, checkpoint=None)

    def _failed(self, error: str, now: float, traceback: str | None) -> dict[str, Any]:
        """What every failed attempt changes: ``last_error``, one more in ``errors`` (numbered
        among every attempt ever, so a history goes on counting past an operator's retry),
        with its traceback if its handler raised."""
        text = clean_error(error)
        errors = with_error(self.errors, self.all_attempts, text, now, traceback)
        return {"last_error": text, "errors": errors}

    def retry(
        self, error: str, ready_at: float, now: float, traceback: str | None = None
    ) -> Transition:
        """running -> scheduled again at ``ready_at``, with a new epoch."""
        return self._to(
            State.SCHEDULED,
            now,
            epoch=self.epoch + 1,
            ready_at=ready_at,
            **self._failed(error, now, traceback),
        )

    def bury(self, error: str, now: float, traceback: str | None = None) -> Transition:
        """running -> dead: no attempts left. The epoch is bumped to fence the worker."""
        return self._to(
            State.DEAD, now, epoch=self.epoch + 1, **self._failed(error, now, traceback)
        )

    def withdraw(self, error: str, now: float, traceback: str | None = None) -> Transition:
        """running -> cancelled: the attempt ended (failed, cut off, snoozed) after a cancel
        was asked for. Never retried; a new epoch fences the worker."""
        return self._to(
            State.CANCELLED, now, epoch=self.epoch + 1, **self._failed(error, now, traceback)
        )

    def snooze(self, ready_at: float, now: float) -> Transition:
        """running -> scheduled at ``ready_at``, a new epoch: the attempt is given back (not
        counted) and a snooze counted instead (``sqlq.common.backoff.after_snooze``)."""
        return self._to(
            State.SCHEDULED,
            now,
            epoch=self.epoch + 1,
            attempts=max(0, self.attempts - 1),
            ready_at=ready_at,
            snoozes=self.snoozes + 1,
        )

    def cancel(self, now: float) -> Transition:
        """scheduled or waiting -> cancelled: it never ran (a running job is asked,
        ``request_cancel``); a workflow member's reason is ``user``."""
        if self.flow is None:
            return self._to(State.CANCELLED, now)
        return self._to(State.CANCELLED, now, flow=FlowChange.reason(CancelReason.USER))

    def after_parent(
        self, ended: Ended | None, now: float, state_of: Callable[[str], str | None]
    ) -> Transition | None:
        """What one parent's end does to this waiting child (``ended``; None: the parent
        was revived from dead or cancelled), by ``sqlq.common.workflow``'s rule: waiting
        with a new count, released (scheduled, due at the latest of its own time and now),
        or cancelled with a reason. A revived parent also revives a child its end had
        cancelled (``upstream_dead`` or ``upstream_cancelled``): waiting again, a new
        epoch, its count made afresh from its parents' states (``state_of``, by id), unless
        another parent it cannot run after still failed. None: nothing changes. The engine
        writes it in the parent's own commit (``JobIndex.stage``)."""
        flow = self.flow
        if flow is None:
            return None
        if self.state is not State.WAITING:
            if ended is None and self.state is State.CANCELLED and flow.cancel_reason in UPSTREAM:
                again = recount(flow, state_of)
                if again is not None:
                    return self._to(
                        State.WAITING, now, epoch=self.epoch + 1, flow=FlowChange.of(again)
                    )
            return None
        if ended is None:  # a revived parent: unsettle what its failure settled
            if not settles_failure(flow):
                return None
            flow = msgspec.structs.replace(
                flow, deps_pending=flow.deps_pending + 1, failed=flow.failed - 1
            )
            return self._to(State.WAITING, now, flow=FlowChange.of(flow))
        flow, verdict = after_parent(flow, ended)
        if verdict is Verdict.RELEASE:
            return self._to(
                State.SCHEDULED, now, ready_at=max(self.ready_at, now), flow=FlowChange.of(flow)
            )
        if verdict is Verdict.CANCEL:
            return self._to(State.CANCELLED, now, flow=FlowChange.of(flow))
        return None if flow is self.flow else self._to(State.WAITING, now, flow=FlowChange.of(flow))

    def request_cancel(self, now: float) -> Transition:
        """running -> running, same epoch: a cancel is asked for. Its handler is told; what
        the attempt ends in then decides (``withdraw``, or ``complete`` if it succeeds)."""
        return self._to(State.RUNNING, now, cancel_requested_at=now)

    def force_cancel(self, now: float, until: float) -> Transition:
        """running -> running, same epoch: a forced cancel of a remotely held job. The cancel
        is asked for (if it was not yet), and the lease cut to ``until`` (never lengthened)
        and held there (``cancel_forced``: ``renew`` leaves it), so the attempt ends at the
        grace's end whatever its worker says. PostgreSQL restates it (``request_cancel``)."""
        asked = now if self.cancel_requested_at is None else self.cancel_requested_at
        lease = until if self.lease_until is None else min(until, self.lease_until)
        return self._to(
            State.RUNNING, now, cancel_requested_at=asked, lease_until=lease, cancel_forced=True
        )

    def touch(
        self, now: float, *, progress: Progress | None = None, checkpoint: JSON = None
    ) -> Transition:
        """running -> running, same epoch: new progress and/or a new checkpoint (None: as it
        was), fenced by the epoch like an outcome so a stale attempt writes nothing."""
        return self._to(
            State.RUNNING,
            now,
            progress=self.progress if progress is None else progress,
            checkpoint=self.checkpoint if checkpoint is None else checkpoint,
        )

    def revive(self, now: float) -> Transition:
        """dead or cancelled -> scheduled, due now: a fresh attempt budget, a new epoch.

        The attempts used so far move into ``attempts_total``; ``last_error`` stays
        as the record of why it died until the next attempt replaces it, and ``errors``
        and the checkpoint stay. A cancel asked for before is over, and the snoozes count
        afresh with the attempts.
        """
        return self._to(
            State.SCHEDULED,
            now,
            epoch=self.epoch + 1,
            attempts=0,
            attempts_total=self.attempts_total + self.attempts,
            ready_at=now,
            result=None,
            started_at=None,
            cancel_requested_at=None,
            snoozes=0,
        )

    # -- serialisation ----------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Job:
        return msgspec.convert(d, cls)

    @classmethod
    def new(
        cls,
        *,
        kind: str,
        args: JSON,
        now: float,
        ready_at: float | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        priority: int = 0,
        job_id: str | None = None,
        queue: str = DEFAULT_QUEUE,
        idempotency_key: str | None = None,
        request_hash: str | None = None,
        flow: Flow | None = None,
        key: str | None = None,
        weight: int = 1,
    ) -> Job:
        """A new job: scheduled; a workflow member waiting while a parent is pending, or
        cancelled if it was judged at birth (``sqlq.common.workflow.at_birth``)."""
        if key is not None or weight != 1:  # (a fair claim's: plain jobs pass neither)
            job = cls.new(kind=kind, args=args, now=now, ready_at=ready_at,
                          max_attempts=max_attempts, priority=priority, job_id=job_id,
                          queue=queue, idempotency_key=idempotency_key,
                          request_hash=request_hash, flow=flow)  # fmt: skip
            return msgspec.structs.replace(job, key=key, weight=weight)
        if flow is not None:
            born = State.WAITING if flow.deps_pending else State.SCHEDULED
            return cls(
                id=job_id or new_job_id(now), kind=sys.intern(kind), args=args,
                state=State.CANCELLED if flow.cancel_reason is not None else born,
                max_attempts=max_attempts, ready_at=now if ready_at is None else ready_at,
                priority=priority, created_at=now, updated_at=now, queue=sys.intern(queue),
                idempotency_key=idempotency_key, request_hash=request_hash, flow=flow,
            )  # fmt: skip
        return cls(
            id=job_id or new_job_id(now),
            kind=sys.intern(kind),
            args=args,
            max_attempts=max_attempts,
            ready_at=now if ready_at is None else ready_at,
            priority=priority,
            created_at=now,
            updated_at=now,
            queue=sys.intern(queue),
            idempotency_key=idempotency_key,
            request_hash=request_hash,
        )

    def compact(self) -> Job:
        """This job, decoded from storage, made to share what many jobs hold alike: its kind
        and queue names (interned), and its times with other jobs' equal ones (jobs made in
        one batch share their ``created_at``, often their ``ready_at``). In place (the job
        is new and not yet shared), and empty arguments as the one ``NO_ARGS``; a million queued
        jobs keep ~150 bytes each less (~210 with no arguments). Once a
        job at recovery: the lookups are written out, not calls (~200 ns a job fewer)."""
        set_, times = msgspec.structs.force_setattr, _TIMES
        if self.args == NO_ARGS:  # (a dict's length first; anything else is unequal at once)
            set_(self, "args", NO_ARGS)
        set_(self, "kind", sys.intern(self.kind))
        set_(self, "queue", sys.intern(self.queue))
        t = self.created_at
        created = times.get(t)
        if created is None:
            created = _kept(t)
        set_(self, "created_at", created)
        t = self.updated_at
        if t == created:
            set_(self, "updated_at", created)
        else:
            shared = times.get(t)
            set_(self, "updated_at", _kept(t) if shared is None else shared)
        t = self.ready_at
        if t == created:
            set_(self, "ready_at", created)
        else:
            shared = times.get(t)
            set_(self, "ready_at", _kept(t) if shared is None else shared)
        return self


_TIMES: dict[float, float] = {}  # recent times decoded, each kept once (``Job.compact``)
_TIMES_KEPT = 4096  # then forgotten at once: jobs sharing a time are decoded together


def _kept(t: float) -> float:
    """``t``, kept for the next decoded job with an equal time (a float is 24 bytes, and two
    or three of them a job)."""
    if len(_TIMES) >= _TIMES_KEPT:
        _TIMES.clear()
    _TIMES[t] = t
    return t
