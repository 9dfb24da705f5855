"""How an acknowledged job may end, given what its clients did and were told: the crash
trials' verdict, from the offline readers' facts (``sqlq.bench.offline``) and the
ledgers (``sqlq.bench.crashload``), never from the engine's code.

Besides the mixed workload's rules (lost, unfinished, a cancel seen, attempts used up, an
epoch for every requeue), the running job's capabilities (issue 22) have theirs:

- a cancel of a running job acknowledged (202) ends it ``cancelled``, with the request
  stored, or ``completed`` by the attempt it was asked of: never requeued after it (walq's
  fold checks every step of that, ``JobFacts.breaks``), never rerun to another outcome
  after a restart;
- a checkpointing job's next attempt read (at least) the newest checkpoint an earlier
  attempt saved durably (its handler appends each to a ledger after it is durable), a
  completion clears it, and a job that did not complete still holds the newest;
- a snoozing job completes after exactly its snoozes, and they cost no attempt (a kill
  costs at most one each).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlq.bench.offline import TERMINAL, JobFacts

CANCEL_TAG = "cancel"  # long and unfailing: the operator cancels it while it runs
CHECKPOINT_TAG = "checkpoint"  # checkpoints, then fails its first attempts on purpose
SNOOZE_TAG = "snooze"  # snoozes ``snoozes`` times, then completes
FORCE = "force"  # a ledger event: the operator's cancel of a running job said ?force=1
BURY_TAG = "bury"  # a remote worker fails it with ``retry: false``: dead at its first end


@dataclass
class ClientRecord:
    """What the clients did with one job and what they were told, in order.

    ``events``: ``cancel?`` and ``retry?`` when a request was sent (it may have
    landed even if no answer came back before the kill), ``cancel`` and ``retry``
    when it was answered 200, ``cancel202`` when a running job's cancel was
    acknowledged (its attempts then in ``requested_at``).
    """

    max_attempts: int | None = None  # as asked; None: the server's default
    can_fail: bool = False  # the job was asked to fail (or hang) sometimes
    events: list[str] = field(default_factory=list)
    tag: str = ""  # what the workload made of it: "", or one of the *_TAG
    snoozes: int = 0  # a snoozing job's snoozes, as asked
    requested_at: int | None = None  # the job's attempts when a cancel was answered 202
    saved: list[int] = field(default_factory=list)  # epochs whose checkpoint was durable

    def after(self, event: str, start: int) -> bool:
        return event in self.events[start:]

    def last(self, event: str) -> int:
        """The index of the last ``event``; -1 if none."""
        return max((i for i, e in enumerate(self.events) if e == event), default=-1)


def judge(
    job: JobFacts | None, rec: ClientRecord, *, epochs_per_attempt: int = 1, deaths: int = 1,
    releases: int = 0,
) -> str | None:  # fmt: skip
    """Whether an acknowledged job's end is one the client's own story allows; why not if not.

    It must be there and finished; a job that nothing could fail, completed. A cancel
    the client saw succeed, with no retry sent after it, leaves it cancelled; it is
    cancelled only if a cancel was sent and no retry was answered after it. Dead means
    its attempts were used up. Every epoch bump is a requeue after an attempt, a snooze
    or an operator's retry (and, in shared mode, ``epochs_per_attempt=2``: a claim too).
    ``deaths``: how many times the trial killed what ran it (a rerun each, at most).
    ``releases``: how many times a remote worker gave it back unstarted (at most): an epoch
    each (and its claim's, in shared mode), no attempt. A job a remote worker buried
    (``BURY_TAG``) is dead with attempts to spare.
    """
    if job is None:
        return "missing"
    if job.state not in TERMINAL:
        return f"not finished ({job.state})"
    if job.breaks:
        return f"the cancel rule broken: {job.breaks[0]}"
    special = _running_verdict(job, rec, deaths)
    if special is not None:
        return special
    if not rec.can_fail and rec.max_attempts is None and not rec.events and not rec.tag:
        # Never asked to fail, never touched, the server's 5 attempts: a trial's few deaths
        # cannot use them up, so it completed.
        return None if job.state == "completed" else f"{job.state}, though nothing failed it"
    cancelled = rec.last("cancel")
    if cancelled >= 0 and not rec.after("retry?", cancelled) and job.state != "cancelled":
        return f"{job.state}, though the client saw it cancelled"
    if job.state == "cancelled":
        sent = rec.last("cancel?")
        if sent < 0:
            return "cancelled, though no client cancelled it"
        if rec.after("retry", sent):
            return "cancelled, though the client saw it retried after its last cancel"
    if job.state == "dead" and rec.tag != BURY_TAG:
        limit = rec.max_attempts or job.max_attempts
        if job.attempts != job.max_attempts or (rec.max_attempts and limit != job.max_attempts):
            return f"dead after {job.attempts} of {limit} attempts"
    revivals = rec.events.count("retry?")
    spent = job.attempts + job.attempts_total + job.snoozes + releases
    if job.epoch > epochs_per_attempt * spent + revivals:
        return f"epoch {job.epoch} but only {job.attempts + job.attempts_total} attempts"
    return None


def _running_verdict(job: JobFacts, rec: ClientRecord, deaths: int) -> str | None:
    """The rules of what a running job carries: a cancel acknowledged while it ran, a
    checkpoint, snoozes."""
    asked = rec.last("cancel202")
    if asked >= 0 and not rec.after("retry?", asked):
        if job.state not in ("completed", "cancelled"):
            return f"{job.state}, though a cancel was acknowledged while it ran"
        if job.state == "cancelled" and job.cancel_requested_at is None:
            return "cancelled at a request, but no cancel_requested_at is stored"
        # Ended by the attempt it was asked during; or cancelled one lower, when that claim
        # was given back before its handler started (``backoff.released``: no attempt).
        given_back = job.state == "cancelled" and job.attempts == (rec.requested_at or 0) - 1
        if rec.requested_at is not None and job.attempts != rec.requested_at and not given_back:
            return (
                f"{job.state} by attempt {job.attempts}, though a cancel was acknowledged "
                f"during attempt {rec.requested_at}: "
                + ("it ran again" if job.attempts > rec.requested_at else "an attempt is lost")
            )
    if rec.tag == CHECKPOINT_TAG:
        return _checkpoint_verdict(job, rec.saved)
    if rec.tag == SNOOZE_TAG:
        if job.state != "completed":
            return f"a snoozing job ended {job.state}"
        if job.snoozes != rec.snoozes:
            return f"completed after {job.snoozes} snoozes, not {rec.snoozes}"
        if job.attempts > 1 + deaths:
            return f"{job.attempts} attempts for {job.snoozes} snoozes: a snooze was counted"
    return None


def _epoch_of(value: Any) -> int | None:
    return value.get("epoch") if isinstance(value, dict) else None


def _checkpoint_verdict(job: JobFacts, saved: list[int]) -> str | None:
    """A checkpointing job (``sqlq.bench.crashtasks``): its checkpoint is ``{"epoch": the
    attempt's epoch, "read": the epoch of the checkpoint it started with}``, and so is its
    result; ``saved``: the epochs whose checkpoint its handler saw durable."""
    if job.state != "completed":
        newest = max(saved, default=None)
        have = _epoch_of(job.checkpoint)
        if newest is not None and (have is None or have < newest):
            return f"{job.state} holding the checkpoint of epoch {have}, not {newest}'s"
        return None
    if job.checkpoint is not None:
        return "completed, but its checkpoint was not cleared"
    epoch, read = _epoch_of(job.result), (job.result or {}).get("read")
    if epoch is None:
        return f"completed without the checkpointing handler's result: {job.result!r}"
    before = max((e for e in saved if e < epoch), default=None)
    if before is not None and (read is None or read < before):
        return f"its last attempt read the checkpoint of epoch {read}, not {before}'s"
    if read is not None and read >= epoch:
        return f"its attempt at epoch {epoch} read a checkpoint of epoch {read}"
    return None
