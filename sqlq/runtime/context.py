"""``JobContext``: what a running handler may touch, and the exceptions it speaks in.

A handler reaches its running job through the context alone: a heartbeat
(``beat``), progress (``progress``), a checkpoint (``checkpoint``, read back by
the next attempt as ``checkpoint_data``), whether a cancel was asked for
(``cancelled``, ``raise_if_cancelled``), and ``Snooze`` to give its attempt back.
How each is used is in ``sqlq.runtime.kinds``' docstring.

The context writes nothing itself: it hands progress and checkpoints to the
claims that hold its attempt (``Channel``), which write them fenced by the
attempt's epoch. A context made without one (a test's, a handler called by hand)
keeps its progress and refuses a checkpoint. A job that never reports progress
and is never cancelled costs nothing here beyond the slots of this object.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import sysconfig
import traceback
from collections.abc import Awaitable, Generator
from typing import TYPE_CHECKING, Any, Protocol

from sqlq.common.clock import SYSTEM_CLOCK, Clock
from sqlq.common.models import JSON, Job
from sqlq.common.running import (
    MAX_SNOOZE_S,
    Progress,
    check_checkpoint,
    check_progress,
    check_snooze,
)
from sqlq.runtime.parents import NO_PARENTS, Parents
from sqlq.runtime.threads import HandlerThreads

if TYPE_CHECKING:
    from sqlq.runtime.claim import Claim


class JobFailed(Exception):
    """A handler's way to fail an attempt with a message."""


class Cancelled(Exception):
    """Raised by ``ctx.raise_if_cancelled()``: a cancel of this job was asked for. Let it
    escape and the job ends ``cancelled`` (a cancel asked for turns any failure into that)."""


class AttemptFenced(Exception):
    """This attempt no longer holds its job (it was cut off, its lease ran out, or its
    claim never held): what it writes now is refused, so it should stop."""


class NotStarted(Exception):
    """The attempt never started: a cancel, or its holder's stop, came while it waited for
    a worker process. Its claim is given back (``Holding.given_back``), no attempt counted."""


class Snooze(Exception):
    """``raise Snooze(seconds)`` (or ``return snooze(seconds)``): run this job again after
    ``seconds``, without counting this attempt. A snooze counts instead: past
    ``--max-snoozes`` the job is dead-lettered. ``ValueError`` unless 0 to a year."""

    def __init__(self, seconds: float) -> None:
        self.seconds = check_snooze(seconds)
        super().__init__(f"snooze for {self.seconds:g} s")


def limited_for(limited: Any) -> float:
    """How long a handler's ``sqlq.RateLimited`` snoozes its job: its ``retry_after``, held
    to a snooze's bounds (an upstream's header may say anything)."""
    after = getattr(limited, "retry_after", 1.0)
    if isinstance(after, bool) or not isinstance(after, int | float) or after != after:
        return 1.0
    return float(min(max(after, 0.0), MAX_SNOOZE_S))


def snooze(seconds: float) -> Snooze:
    """A ``Snooze`` to return from a handler instead of raising it."""
    return Snooze(seconds)


class UnstorableResult(Exception):
    """A handler's result is past a bound of ``sqlq.common.shape``; its attempt fails."""


class Described(Exception):
    """A failure whose text is already the attempt's error (a handler's exception described
    where it ran: a worker process), so ``describe`` passes it on unwrapped, with the
    traceback from there and whether the task's rules retry it (``TaskRetry.retries``)."""

    def __init__(self, text: str, traceback: str | None = None, retry: bool = True) -> None:
        super().__init__(text)
        self.traceback, self.retry = traceback, retry


class CutOff(TimeoutError):
    """An attempt cut off by its holder (past its timeout, silent past its heartbeat
    timeout): what it failed with, so a task's ``retry_on=(TimeoutError,)`` or
    ``no_retry_on`` rules it as they would a timeout it raised. Its text is the reason."""


def format_traceback(exc: BaseException) -> str:
    """``exc``'s traceback as Python prints it (its causes too), from the handler's own
    frames: the runtime's and the standard library's frames that lead to it (the worker
    loop, the executor, a thread pool) are left out, as where the attempt ran, not where
    it failed. A file is named from its ``sys.path`` entry (``myapp/tasks.py``), never by
    its absolute path, which is the server's to know (``sqlq.common.redact``). What
    ``errors`` keeps of it is bounded by ``sqlq.common.running.clean_traceback``. A
    ``CutOff`` raised nothing: none."""
    if isinstance(exc, Described):
        return exc.traceback or ""
    if isinstance(exc, CutOff):
        return ""
    te = traceback.TracebackException.from_exception(exc)
    for one in _chain(te):
        frames = list(one.stack)
        first = next((i for i, f in enumerate(frames) if not _runtime(f.filename)), 0)
        for f in frames[first:]:
            f.filename = _relative(f.filename)
        one.stack = traceback.StackSummary.from_list(frames[first:])
    return "".join(te.format())


def _chain(te: traceback.TracebackException) -> list[traceback.TracebackException]:
    out, seen = [], set()
    todo: list[traceback.TracebackException | None] = [te]
    while todo:
        one = todo.pop()
        if one is None or id(one) in seen:
            continue
        seen.add(id(one))
        out.append(one)
        todo += [one.__cause__, one.__context__]
    return out


_SQLQ = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package's folder
_STDLIB = tuple(
    os.path.abspath(p) for p in {sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")}
)


def _runtime(filename: str) -> bool:
    """A frame of sqlq's runtime or the standard library (or frozen: ``<frozen ...>``)."""
    if filename.startswith("<"):
        return True
    path = os.path.abspath(filename)
    return path.startswith(_SQLQ + os.sep) or (
        path.startswith(_STDLIB) and "site-packages" not in path
    )


def _relative(filename: str) -> str:
    """``filename`` from the longest ``sys.path`` entry it is under, else its base name."""
    if filename.startswith("<") or not os.path.isabs(filename):
        return filename
    best = ""
    for entry in sys.path:
        root = os.path.abspath(entry or ".") + os.sep
        if filename.startswith(root) and len(root) > len(best):
            best = root
    return filename[len(best) :] if best else os.path.basename(filename)


def describe(exc: BaseException) -> str:
    """An exception as ``last_error`` text (``clean_error`` bounds and cleans it)."""
    text = str(exc)
    if isinstance(exc, Described | CutOff):
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Channel(Protocol):
    """What the claims holding an attempt offer its context (``ClaimsBase``)."""

    def progressed(self, claim: Claim) -> None:
        """``claim.progress`` is new: write it when its turn comes (on the loop only)."""
        ...

    def save(self, claim: Claim, data: JSON) -> asyncio.Future[None]:
        """Write ``data`` as the job's checkpoint, fenced; done once durable (on the loop)."""
        ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop the claims run on (None before they start)."""
        ...


class Done:
    """An awaitable that is already done: a checkpoint a thread (or a worker process's
    handler) waited for."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # pragma: no cover (makes this a generator)


class JobContext:
    """What a running handler may touch: its job, a heartbeat, progress, a checkpoint, the
    cancel flag and an RNG.

    ``hb_timeout`` and ``deadline`` (monotonic seconds) are the limits the
    health loop applies to this attempt; ``None`` means no such limit.
    ``interruptible``: a cancel request cancels the handler's task (async handlers);
    otherwise (a handler in a thread) it only sets ``cancelled``.
    """

    __slots__ = (
        "_channel",
        "_claim",
        "_clock",
        "_progress",
        "cancel_sent",
        "cancelled",
        "deadline",
        "forced",
        "hb_timeout",
        "interruptible",
        "job",
        "last_beat",
        "parents",
        "rng",
        "threads",
    )

    def __init__(
        self,
        job: Job,
        rng: random.Random,
        *,
        clock: Clock = SYSTEM_CLOCK,
        threads: HandlerThreads | None = None,
        hb_timeout: float | None = None,
        timeout: float | None = None,
        claim: Claim | None = None,
        channel: Channel | None = None,
        interruptible: bool = True,
    ) -> None:
        self.job = job
        self.rng = rng
        self.threads = threads
        self._clock = clock
        self.last_beat = clock.monotonic()
        self.hb_timeout = hb_timeout
        self.deadline = None if timeout is None else self.last_beat + timeout
        self._claim = claim
        self._channel = channel
        self._progress: Progress | None = None  # without a claim: the latest, kept here
        self.interruptible = interruptible
        self.cancelled = False  # a cancel of this job was asked for (the handler reads it)
        self.cancel_sent = False  # its task was cancelled for it (not for a stop or a hang)
        self.forced = False  # the cancel was forced: ``deadline`` is the grace's end
        # A workflow member's parents, by ref: their states, results and errors (the worker
        # pool loads the first page before the handler starts; ``sqlq.runtime.parents``).
        self.parents: Parents = NO_PARENTS

    @property
    def clock(self) -> Clock:
        """The server's clock: a handler that waits a policy's time waits on it."""
        return self._clock

    def beat(self) -> None:
        """I am alive and working. Safe to call from any thread."""
        self.last_beat = self._clock.monotonic()

    # -- progress ----------------------------------------------------------------------

    def progress(self, percent: float | None = None, message: str | None = None) -> None:
        """Report how far the attempt got (``percent`` 0 to 100, a short ``message``).

        Never blocks, from any thread; ``ValueError`` for a bad value. Only the latest
        counts: it is written at most once per ``progress_every_s`` and always with the
        attempt's outcome, and shows on the job once written.
        """
        p = check_progress(percent, message, self._clock.time())
        claim, channel = self._claim, self._channel
        if claim is None or channel is None:
            self._progress = p
            return
        claim.progress = p
        if claim.armed or claim.over:
            return  # a write is due already (it takes the latest), or none will be
        claim.armed = True
        loop = channel.loop
        if loop is None:
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            channel.progressed(claim)
            return
        try:
            loop.call_soon_threadsafe(channel.progressed, claim)
        except RuntimeError:  # the loop is closed: an abandoned thread reports to nobody
            pass

    @property
    def latest_progress(self) -> Progress | None:
        """The latest progress this attempt reported (written or not)."""
        return self._claim.progress if self._claim is not None else self._progress

    # -- checkpoints ---------------------------------------------------------------------

    @property
    def checkpoint_data(self) -> JSON:
        """The job's checkpoint when this attempt started (None: there was none)."""
        return self.job.checkpoint

    def checkpoint(self, data: JSON) -> Awaitable[None]:
        """Save ``data`` (JSON, at most 64 KiB) for the job's next attempt, durably.

        In a thread (a plain handler) it blocks until durable; on the event loop (an
        async handler) it returns an awaitable, done once durable (the write goes
        ahead unawaited too). ``ValueError`` for a bad value; ``AttemptFenced`` if
        this attempt no longer holds the job.
        """
        value = check_checkpoint(data)
        claim, channel = self._claim, self._channel
        loop = None if channel is None else channel.loop
        if claim is None or channel is None or loop is None:
            raise AttemptFenced("this context holds no claim: there is nowhere to save to")
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            return channel.save(claim, value)

        async def save() -> None:
            await channel.save(claim, value)

        coro = save()
        try:
            done = asyncio.run_coroutine_threadsafe(coro, loop)
        except RuntimeError:  # the loop is closed: the server is gone
            coro.close()
            raise AttemptFenced("the server stopped: there is nowhere to save to") from None
        done.result()
        return Done()

    # -- cancellation --------------------------------------------------------------------

    def raise_if_cancelled(self) -> None:
        """Raise ``Cancelled`` if a cancel of this job was asked for."""
        if self.cancelled:
            raise Cancelled("a cancel of this job was asked for")
