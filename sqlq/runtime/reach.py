"""``Reach``: how the claims reach a running attempt, and how its context reaches the store.

What travels while a job runs: progress (coalesced, at most one write per job
per ``progress_every_s``), checkpoints (durable before the handler goes on), and
a cancel asked for (durable, then told to the attempt). Each is a ``running ->
running`` transition at the claim's epoch (``Job.touch``, ``Job.request_cancel``),
so a stale attempt writes nothing.

Transitions carry whole fields, so two built from the same version would undo
each other. The rule: every change to a running job is built from ``claim.job``,
which is advanced to its result *before* the write is issued, and the writes of
one claim are issued in the order they were built (``_chain``: each waits for
the one before). The outcome (``ClaimsBase._outcome``) waits for the chain too,
and is built from ``claim.job`` with the latest progress folded in (``_carry``).
So an outcome built after a cancel request takes the cancel rule, and one built
before it is the one the request finds (``ClaimsBase`` re-reads the job then).

A job that reports no progress, saves no checkpoint and is never cancelled pays
one attribute test per outcome here, and nothing else: no task, no timer, no entry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import msgspec

from sqlq.common.clock import Clock
from sqlq.common.errors import StoreError, TransitionError
from sqlq.common.models import JSON, Job, Transition
from sqlq.common.running import Progress
from sqlq.runtime.claim import Claim, ClaimResult
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.context import AttemptFenced
from sqlq.runtime.events import Event, Events

log = logging.getLogger(__name__)

T = TypeVar("T")


class Attempts(Protocol):
    """The attempts running in this process (the worker pool), by job id."""

    def holding(self, job_id: str) -> Claim | None:
        """The claim a live worker holds on ``job_id`` now (None: none here)."""
        ...

    def interrupt(self, job_id: str, grace_s: float | None) -> bool:
        """Tell the attempt of ``job_id`` a cancel was asked for; ``grace_s``: also cut it
        off that long from now, as a timeout does. False if no worker holds it."""
        ...

    def lose(self, claim: Claim, reason: str) -> bool:
        """The holder no longer holds ``claim`` (its lease was fenced or ran out): cut that
        attempt now, reporting nothing (by the claim, not the job's id: a newer attempt of
        the same job may be running here). False if no worker holds it."""
        ...

    def running(self, queue: str) -> list[Job]:
        """The jobs of ``queue`` whose attempts run here now (a walk: a policy's count)."""
        ...


class Nobody:
    """No attempts (before a pool attaches): nothing holds any job."""

    def holding(self, job_id: str) -> Claim | None:
        return None

    def interrupt(self, job_id: str, grace_s: float | None) -> bool:
        return False

    def lose(self, claim: Claim, reason: str) -> bool:
        return False

    def running(self, queue: str) -> list[Job]:
        return []


class Reach:
    """The claims' side of a running attempt (a mixin of ``ClaimsBase``)."""

    # What ClaimsBase has (set in its __init__):
    _background: set[asyncio.Future[Any]]
    _clock: Clock
    _config: RuntimeConfig
    _events: Events
    _attempts: Attempts = Nobody()
    _loop: asyncio.AbstractEventLoop | None = None

    def attach(self, attempts: Attempts) -> None:
        """The worker pool whose attempts a cancel reaches (the service attaches its own)."""
        self._attempts = attempts

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    # -- the hooks ----------------------------------------------------------------------

    def _touch(self, t: Transition) -> Awaitable[None]:
        """Write the ``running -> running`` ``t``, fenced; durable once awaited."""
        raise NotImplementedError

    def _touched(self, t: Transition) -> None:
        """``t`` is durable: show it (local: the live view)."""

    def _send_progress(self, claim: Claim, progress: Progress) -> None:
        """Write ``progress`` (its turn came): local, a touch; shared, with the renewal."""
        t = claim.job.touch(self._clock.time(), progress=progress)
        claim.job = claim.job.apply(t)
        self._chain(claim, lambda: self._write_touch(claim, t), quiet=True)

    # -- progress -------------------------------------------------------------------------

    def progressed(self, claim: Claim) -> None:
        """``claim.progress`` is new and no write of it is due yet: make one due, now or
        ``progress_every_s`` after the last (the first: that long after the first report)."""
        if claim.over:
            return
        now = self._clock.monotonic()
        if claim.written_at is None:
            claim.written_at = now
        wait = claim.written_at + self._config.progress_every_s - now
        if wait > 0:
            self._clock.call_later(wait, lambda: self._flush(claim))
        else:
            self._flush(claim)

    def _flush(self, claim: Claim) -> None:
        claim.armed = False  # (first: a report made from now on arms another write)
        progress = claim.progress
        if claim.over or progress is None or progress is claim.job.progress:
            return
        claim.written_at = self._clock.monotonic()
        self._send_progress(claim, progress)

    # -- checkpoints ------------------------------------------------------------------------

    def save(self, claim: Claim, data: JSON) -> asyncio.Future[None]:
        """Write ``data`` as the checkpoint (with the latest progress), after the writes of
        this claim before it; the future fails with ``AttemptFenced`` if refused."""
        if claim.over:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            fut.set_exception(AttemptFenced("this attempt is over: its outcome is written"))
            return fut
        t = claim.job.touch(self._clock.time(), progress=claim.progress, checkpoint=data)
        claim.job = claim.job.apply(t)
        return self._chain(claim, lambda: self._write_touch(claim, t))

    async def _write_touch(self, claim: Claim, t: Transition) -> None:
        if await claim.claimed is not ClaimResult.CLAIMED:
            raise AttemptFenced(f"job {t.job_id}: this attempt's claim never held")
        try:
            await self._touch(t)
        except TransitionError as exc:
            raise AttemptFenced(f"this attempt no longer holds job {t.job_id}: {exc}") from None
        self._touched(t)

    # -- one claim's writes, in the order they were built ------------------------------------

    def _chain(
        self, claim: Claim, write: Callable[[], Awaitable[T]], *, quiet: bool = False
    ) -> asyncio.Task[T]:
        """Run ``write`` once every write of ``claim`` built before it is over."""
        prev = claim.last

        async def run() -> T:
            if prev is not None:
                await asyncio.wait([prev])
            return await write()

        task = asyncio.ensure_future(run())
        claim.last = task
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        if quiet:
            task.add_done_callback(_quietly)
        return task

    async def _settled(self, claim: Claim) -> None:
        """Wait until the writes of ``claim`` issued so far are over (the outcome's turn)."""
        last = claim.last
        if last is not None:
            await asyncio.wait([last])

    # -- what an outcome carries, and a cancel asked for -------------------------------------

    @staticmethod
    def _carry(claim: Claim) -> Job:
        """The attempt is over: ``claim.job`` with its latest progress, what the outcome is
        built from. Nothing more is written for it after."""
        claim.over = True
        job, progress = claim.job, claim.progress
        if progress is not None and progress is not job.progress:
            job = claim.job = msgspec.structs.replace(job, progress=progress)
        return job

    async def _ask(self, claim: Claim, force: bool) -> Job:
        """Ask the attempt of ``claim`` to stop: the request durable, then the attempt told;
        the job as it now stands (running, the cancel asked for). ``AttemptFenced`` if the
        request was refused: the attempt no longer holds the job (look at it again).

        A request asked before is awaited, not assumed: only its durable write answers
        "asked". If that write failed (the store), it is written again, from ``claim.job``,
        which carries the mark."""
        asked = claim.asked
        if asked is None or _failed(asked):
            if claim.job.cancel_requested_at is None:
                self._events.record(Event.CANCEL_REQUESTED, claim.job)
            t = self._mark(claim, self._clock.time())
            asked = claim.asked = self._chain(claim, lambda: self._write_request(claim, t))
        await asyncio.shield(asked)  # its error, if it failed, is this call's too
        self._attempts.interrupt(claim.job.id, self._config.cancel_grace_s if force else None)
        return claim.job

    def _write_request(self, claim: Claim, t: Transition) -> Awaitable[None]:
        """Write the cancel request ``t`` of the attempt of ``claim``; ``AttemptFenced`` if
        refused."""
        return self._write_touch(claim, t)

    def _mark(self, claim: Claim, now: float) -> Transition:
        """Mark the cancel on ``claim.job`` (so the outcome built from it takes the cancel
        rule), and the transition that writes the request (marked already: the same fields
        again, for a write that failed)."""
        if claim.job.cancel_requested_at is not None:
            return claim.job.touch(now)
        t = claim.job.request_cancel(now)
        claim.job = claim.job.apply(t)
        return t


def _failed(task: asyncio.Task[Any]) -> bool:
    """Whether the write ``task`` is over without landing or being refused: to write again."""
    if not task.done():
        return False
    if task.cancelled():
        return True
    exc = task.exception()
    return exc is not None and not isinstance(exc, AttemptFenced)


def _quietly(task: asyncio.Task[Any]) -> None:
    """A progress write's end: a refused one means its attempt is over; a failed one is
    logged (the next write, or the outcome, carries the progress anyway)."""
    if task.cancelled():
        return
    exc = task.exception()
    if isinstance(exc, StoreError):
        log.warning("could not write progress: %s", exc)
    elif exc is not None and not isinstance(exc, AttemptFenced):
        log.error("progress write failed", exc_info=exc)
