"""One claimed job in a remote worker: its token, its job, its context, and its outcome.

An ``Attempt`` lives from the claim until the server answers its outcome (or fences it):
while it runs, and after, while its outcome waits to be delivered, its token is in every
heartbeat, so a lease is never lost to a slow report. ``over`` says its outcome is
decided (built, or none because it was fenced): whatever the handler does after that
(a late return from a thread cut off, a swallowed cancel) is dropped, as the server
drops a late outcome of an attempt it cut off.

The outcome is encoded once, when it is decided (``encode``): that both checks it (a
result JSON cannot hold fails the attempt, as in the server) and measures it, so the
outbox batches by bytes without encoding twice.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import msgspec

from sqlq.common.backoff import Failure
from sqlq.common.models import Job
from sqlq.common.protocol import (
    MAX_ERROR,
    MAX_RETRY_IN_S,
    MAX_TRACEBACK,
    CompleteIn,
    FailIn,
    ReleaseIn,
    SnoozeIn,
    What,
)
from sqlq.common.running import Progress
from sqlq.common.wire import JobView
from sqlq.runtime.claim import Claim

_encode = msgspec.json.Encoder().encode
NAMES: dict[type[Any], str] = {CompleteIn: "complete", FailIn: "fail", SnoozeIn: "snooze",
                               ReleaseIn: "release"}  # fmt: skip


def job_of(view: JobView) -> Job:
    """The stored job a claim's ``JobView`` shows: what a handler's ``ctx.job`` is in the
    server (``attempts_total`` there counts only the attempts before the last retry)."""
    return Job(
        id=view.id, kind=view.kind, args=view.args, state=view.state, attempts=view.attempts,
        max_attempts=view.max_attempts, ready_at=view.ready_at, priority=view.priority,
        epoch=view.epoch, created_at=view.created_at, updated_at=view.updated_at,
        last_error=view.last_error, result=view.result, started_at=view.started_at,
        queue=view.queue, idempotency_key=view.idempotency_key,
        attempts_total=max(0, view.attempts_total - view.attempts),
        cancel_requested_at=view.cancel_requested_at, progress=view.progress,
        checkpoint=view.checkpoint, snoozes=view.snoozes, errors=view.errors,
        holder=view.holder, lease_until=view.lease_until, flow=view.flow,
    )  # fmt: skip


def failure(error: str, *, retry: bool = True) -> FailIn:
    """A failed attempt's outcome, its text cut to what the protocol takes."""
    return FailIn(error=error[:MAX_ERROR] or "failed", retry=retry)


def failed_with(f: Failure) -> FailIn:
    """A handler's failure as its outcome: the task's rules (``retry``, ``retry_in_s``),
    applied here, where the task is known; its traceback, as much as the protocol takes
    (the server cuts it to what ``errors`` keeps)."""
    delay = None if f.delay_s is None else min(f.delay_s, MAX_RETRY_IN_S)
    tb = None if f.traceback is None else f.traceback[-MAX_TRACEBACK:]
    return FailIn(error=f.error[:MAX_ERROR] or "failed", retry=f.retry, retry_in_s=delay,
                  traceback=tb)  # fmt: skip


@dataclass(eq=False, slots=True)
class Attempt:
    token: str
    job: Job
    claim: Claim  # what the runtime's context reports through (``Channel``)
    lease_end: float  # monotonic: when the lease runs out by this worker's reckoning
    over: bool = False  # its outcome is decided (``what``), or it was fenced (None)
    what: What | None = None
    body: bytes = b""  # the outcome as one item of ``/claims/outcomes``
    sent: Progress | None = None  # the latest progress a heartbeat carried
    saving: asyncio.Future[None] | None = None  # its latest checkpoint write
    alone: bool = False  # a claim carrying it was refused: only the outbox's own call sends it
    fenced_by_server: bool = False  # a heartbeat answered ``fenced`` (not a lease run out)

    def decide(self, what: What) -> None:
        """Its outcome is ``what``: encoded now (a result JSON cannot hold, or one past the
        bounds, becomes the attempt's failure here)."""
        self.over, self.claim.over = True, True
        try:
            body = _encode({"token": self.token, NAMES[type(what)]: what})
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
            what = failure(f"result is not JSON-serialisable: {exc}")
            body = _encode({"token": self.token, "fail": what})
        self.what, self.body = what, body

    def fenced(self) -> None:
        """No outcome: the attempt is no longer this worker's."""
        self.over, self.claim.over = True, True

    def new_progress(self) -> Progress | None:
        """Progress reported since the last heartbeat that carried some, if any."""
        p = self.claim.progress
        return None if p is None or p is self.sent else p


def describe_what(what: What) -> str:
    """An outcome as the log says it."""
    if isinstance(what, CompleteIn):
        return "completed"
    if isinstance(what, FailIn):
        return f"failed ({what.error})" if what.retry else f"failed, not retried ({what.error})"
    if isinstance(what, SnoozeIn):
        return f"snoozed {what.delay_s:g} s"
    return "released"
