"""The worker pool and the health loop that replaces hung workers.

N worker tasks take job ids from the scheduler. While a worker holds a job its
handler heartbeats through ``JobContext.beat``. Every ``hb_timeout / 4`` the
health loop looks for a worker past one of its attempt's limits: silent longer
than the kind's heartbeat timeout, or running past the kind's timeout. That
worker is declared hung and *abandoned*: its job is requeued with a new epoch
through the retry policy, a replacement starts at once, and its task is
cancelled. An async handler stops there. A handler in a thread or a process
cannot be stopped; its task ends and the thread is counted as abandoned until
it returns (``HandlerThreads``). A handler that swallows the cancellation and
returns late has its result fenced off by the epoch (and counted). So at most
N workers are ever live (not hung), and abandoned tasks do not pile up.

A cancel asked for reaches the attempt here (``interrupt``): its context is
flagged, and an async handler's task is cancelled. That cancellation is told
apart from a stop's or a hang's by ``ctx.cancel_sent`` and the task's cancel
count (``uncancel``): only when it is the one pending does the worker record the
attempt's end (cancelled, by the cancel rule) and go on to its next job. A forced
cancel moves the attempt's deadline to the grace's end: the health loop then cuts
it off as it does a timeout.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import itertools
import logging
from dataclasses import dataclass
from typing import Any

from sqlq.common.backoff import Failure
from sqlq.common.clock import SYSTEM_CLOCK, Clock, wait_event
from sqlq.common.errors import RateLimited
from sqlq.common.lease import SKEW_MARGIN
from sqlq.common.models import Job
from sqlq.common.running import clean_error, clean_traceback
from sqlq.runtime.claim import Claim
from sqlq.runtime.context import (
    AttemptFenced,
    CutOff,
    JobContext,
    NotStarted,
    Snooze,
    describe,
    limited_for,
)
from sqlq.runtime.executor import Executor
from sqlq.runtime.holding import Holding
from sqlq.runtime.parents import Parents
from sqlq.runtime.spawn import Spawn

CANCELLED_WHILE = "cancelled: a cancel was asked for while it ran"

log = logging.getLogger(__name__)
jobs_log = logging.getLogger("sqlq.jobs")  # one line per attempt's end (``said``)


@dataclass(eq=False, slots=True)
class WorkerTask:
    wid: int
    task: asyncio.Task[None] | None = None
    ctx: JobContext | None = None
    claim: Claim | None = None
    hung: bool = False
    jobs_done: int = 0


class Limit(enum.Enum):
    """Which of an attempt's limits it ran past."""

    TIMEOUT = "timeout"
    HEARTBEAT = "heartbeat"
    LEASE = "lease"  # its holder could not renew: cut off, and nothing is reported


def overdue(
    ctx: JobContext, now: float, lease_end: float | None = None, *, judged: bool = True
) -> tuple[Limit, str] | None:
    """Which limit the attempt behind ``ctx`` ran past at ``now``, and why, or None.
    ``lease_end``: when its holder's lease runs out unrenewed (None: never); that limit
    holds even where ``judged`` is False (``--no-healthcheck``): it is not the handler's
    health but whether the job is still this holder's to run."""
    if lease_end is not None and now > lease_end:
        return Limit.LEASE, f"lease lost: not renewed for {now - lease_end:.3f} s past its end"
    if not judged:
        return None
    if ctx.deadline is not None and now > ctx.deadline:
        late = now - ctx.deadline
        if ctx.forced:
            return Limit.TIMEOUT, f"cancelled: still running {late:.3f} s past the cancel's grace"
        return Limit.TIMEOUT, f"timed out: still running {late:.3f} s past its timeout"
    if ctx.hb_timeout is not None and (silent := now - ctx.last_beat) > ctx.hb_timeout:
        return Limit.HEARTBEAT, f"worker hung: no heartbeat for {silent * 1000:.0f} ms"
    return None


def _withdrawn(w: WorkerTask) -> bool:
    """Whether the cancellation that ended this attempt was the cancel request's alone
    (not a stop's nor a hang's): then the worker records it and goes on."""
    if w.hung:
        return False
    task = asyncio.current_task()
    return task is not None and task.uncancel() == 0


def said(claim: Claim, what: str, took_s: float, failure: Failure | None = None) -> None:
    """An attempt's end, logged once, where every attempt runs (the server's workers and
    ``sqlq worker`` alike): its job, kind, attempt and run time; a failure at WARNING with
    its traceback, and what becomes of its job (by the server's ``--retries`` too)."""
    job = claim.job
    if failure is None:
        jobs_log.info("job %s (%s) attempt %d %s in %.3f s", job.id, job.kind, job.attempts,
                      what, took_s)  # fmt: skip
        return
    if job.cancel_requested_at is not None:
        verdict = "cancelled"
    elif failure.retry and job.attempts < job.max_attempts:
        verdict = "to be retried"
    else:
        verdict = "no attempts left" if failure.retry else "not to be retried"
    tb = f"\n{clean_traceback(failure.traceback).rstrip()}" if failure.traceback else ""
    jobs_log.warning("job %s (%s) attempt %d failed in %.3f s, %s: %s%s", job.id, job.kind,
                     job.attempts, took_s, verdict, clean_error(failure.error), tb)  # fmt: skip


def _settle_cancel(ctx: JobContext) -> None:
    """The attempt ended some other way after its task was cancelled for a request: take
    that cancellation off the task's count, once (a stop's stays)."""
    ctx.cancel_sent = False
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        task.uncancel()


class WorkerPool:
    def __init__(
        self,
        claims: Holding,
        executor: Executor,
        *,
        workers: int,
        hb_timeout_s: float,
        healthcheck: bool,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._claims = claims
        self._executor = executor
        self._clock = clock
        self.size = workers
        self.hb_timeout = hb_timeout_s
        self.healthcheck = healthcheck
        self.live: list[WorkerTask] = []
        self.abandoned: list[WorkerTask] = []
        self._ids = itertools.count(1)
        self._health_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._stopped = False
        self._idle = asyncio.Event()  # set when stopping and no live worker holds a job
        self.declared_hung = 0
        self.timed_out = 0
        self.replaced = 0
        self.max_live_seen = 0

    def start(self) -> None:
        for _ in range(self.size):
            self._spawn()
        # Always: without --healthcheck it still cuts off attempts whose lease ran out.
        self._health_task = asyncio.create_task(self._health(), name="sqlq-health")

    def _spawn(self) -> None:
        w = WorkerTask(next(self._ids))
        w.task = asyncio.create_task(self._work(w), name=f"sqlq-worker-{w.wid}")
        w.task.add_done_callback(lambda _: self._ended(w))
        self.live.append(w)
        self.max_live_seen = max(self.max_live_seen, len(self.live))

    def _ended(self, w: WorkerTask) -> None:
        if w.hung:
            self.abandoned.remove(w)

    async def _work(self, w: WorkerTask) -> None:
        claims, executor = self._claims, self._executor
        while not self._stopping and not w.hung:
            claim = await claims.next()
            if claim.job.cancel_requested_at is not None:  # asked for before it started here
                claims.given_back(claim)  # cancelled, and it was no attempt
                continue
            flow = claim.job.flow
            parents = None
            if flow is not None and flow.parents:  # a member's parents, before it starts
                parents = await self._parents(claims, claim)
                if parents is None:
                    continue
            ctx = executor.context(claim.job, claim, claims)
            if parents is not None:
                ctx.parents = parents
            w.ctx, w.claim = ctx, claim
            began = self._clock.monotonic()
            try:
                result = await executor.execute(claim.job, ctx)
            except NotStarted:  # a cancel, or the stop, came while it waited for a process
                if not claim.over:  # (the stop gave it back already)
                    claims.given_back(claim)
            except asyncio.CancelledError:
                if not (ctx.cancel_sent and _withdrawn(w)):
                    raise  # a stop, or a hang: not this worker's to record
                claims.failed(claim, Failure(CANCELLED_WHILE))
                said(claim, "cancelled while it ran", self._clock.monotonic() - began)
            except Snooze as s:
                claims.snoozed(claim, s.seconds)
                said(claim, f"snoozed {s.seconds:g} s", self._clock.monotonic() - began)
            except RateLimited as r:  # an upstream's 429: a snooze, and its key's bucket moves
                after = limited_for(r)
                claims.rate_limited(claim, after)  # (before the snooze frees its slot)
                claims.snoozed(claim, after)
                said(claim, f"rate limited, again in {after:g} s", self._clock.monotonic() - began)
            except Exception as exc:
                failure = executor.failure(claim.job, exc)
                claims.failed(claim, failure)
                said(claim, "", self._clock.monotonic() - began, failure)
            else:
                if type(result) is Snooze:
                    claims.snoozed(claim, result.seconds)
                    said(claim, f"snoozed {result.seconds:g} s", self._clock.monotonic() - began)
                elif type(result) is Spawn:
                    claims.completed(claim, result.result, result.jobs)
                    said(claim, f"completed, spawning {len(result.jobs)}",
                         self._clock.monotonic() - began)  # fmt: skip
                else:
                    claims.completed(claim, result)
                    if jobs_log.isEnabledFor(logging.INFO):  # (the hot path: one test)
                        said(claim, "completed", self._clock.monotonic() - began)
            if ctx.cancel_sent:  # the handler caught the cancel (or the task ended): its count
                _settle_cancel(ctx)
            w.ctx = w.claim = None
            w.jobs_done += 1
            if self._stopping and not self.busy():
                self._idle.set()
            # If it was declared hung while it worked, its job was requeued and a
            # replacement runs in its place; its late outcome above is fenced, and
            # the loop ends here.

    async def _parents(self, claims: Holding, claim: Claim) -> Parents | None:
        """A workflow member's first page of parents (``ctx.parents``), read before its
        attempt starts; None if it could not be: the claim is over (fenced), or the read
        failed, and then the claim is given back unstarted (no attempt spent on what was
        not the handler's failure)."""
        try:
            first = await claims.parents(claim, 0)
        except AttemptFenced:
            return None
        except Exception as exc:
            log.warning("job %s: its parents could not be read (%s); given back unstarted",
                        claim.job.id, describe(exc))  # fmt: skip
            claims.given_back(claim)
            return None
        load = functools.partial(claims.parents, claim)
        return Parents(first, load, loop=asyncio.get_running_loop())

    async def _health(self) -> None:
        every = self.hb_timeout / 4
        lease_s = self._claims.lease_s
        if lease_s is not None:  # a lease is cut within a twentieth of it (``common.lease``)
            every = min(every, lease_s * SKEW_MARGIN / 2)
        while True:
            await self._clock.sleep(every)
            self.check(self._clock.monotonic(), judged=self.healthcheck)

    def check(self, now: float, *, judged: bool = True) -> list[WorkerTask]:
        """Declare every worker past its attempt's lease limit hung, and (``judged``) every
        one past its heartbeat or time limit."""
        claims = self._claims
        # The walk runs every hb_timeout / 4 over every worker: only what applies is asked.
        plain = judged and not claims.leased and self._executor.processes is None
        past_limits: list[tuple[WorkerTask, tuple[Limit, str]]] = []
        for w in self.live:
            ctx = w.ctx
            if ctx is None:
                continue
            if plain:
                past = overdue(ctx, now)
            else:
                claim = w.claim
                if claim is None:
                    continue
                self._executor.observed(ctx)  # (a process's beats)
                past = overdue(ctx, now, claims.expires(claim), judged=judged)
            if past is not None:
                past_limits.append((w, past))
        for w, (limit, reason) in past_limits:
            self._cut(w, limit, reason)
        return [w for w, _ in past_limits]

    def _cut(self, w: WorkerTask, limit: Limit, reason: str) -> None:
        """Declare ``w`` hung: its attempt ends by ``limit`` (a lease lost: reported by
        nobody), its handler is told (``ctx.cancelled``; an async one's task cancelled, a
        process's flag raised; a thread is abandoned), and a replacement starts."""
        ctx, claim = w.ctx, w.claim
        assert ctx is not None  # (set together, and both still: nothing ran since)
        assert claim is not None
        w.hung = True
        self.live.remove(w)
        self.abandoned.append(w)
        self.declared_hung += 1
        if limit is Limit.TIMEOUT:
            self.timed_out += 1
        log.info("worker %d holding job %s: %s; replaced", w.wid, ctx.job.id, reason)
        ctx.cancelled = True  # a thread's handler that looks stops too
        self._executor.interrupt(ctx)
        started = claim.job.started_at
        took = 0.0 if started is None else max(0.0, self._clock.time() - started)
        if limit is Limit.LEASE:
            self._claims.lost(claim)
            said(claim, f"lost with its lease ({reason}), not reported", took)
        else:
            failure = self._executor.failure(claim.job, CutOff(reason))
            self._claims.hung(claim, failure)
            said(claim, "", took, failure)
        if w.task is not None:
            w.task.cancel()  # an async handler stops; a thread is abandoned
        if not self._stopping:
            self._spawn()
            self.replaced += 1
        elif not self.busy():
            self._idle.set()

    # -- a cancel asked for (``sqlq.runtime.reach.Attempts``) --------------------------------

    def holding(self, job_id: str) -> Claim | None:
        """The claim a live worker holds on ``job_id``: a walk over the workers, made only
        when a cancel comes, so the hot path keeps no index of them."""
        for w in self.live:
            claim = w.claim
            if claim is not None and claim.job.id == job_id:
                return claim
        return None

    def running(self, queue: str) -> list[Job]:
        """The jobs of ``queue`` live workers hold, their attempts not over."""
        return [c.job for w in self.live if (c := w.claim) is not None and not c.over
                and c.job.queue == queue]  # fmt: skip

    def interrupt(self, job_id: str, grace_s: float | None) -> bool:
        for w in self.live:
            claim, ctx = w.claim, w.ctx
            if claim is None or ctx is None or claim.job.id != job_id:
                continue
            ctx.cancelled = True
            self._executor.interrupt(ctx)  # (a process's flag)
            if grace_s is not None:
                until = self._clock.monotonic() + grace_s
                ctx.deadline = until if ctx.deadline is None else min(ctx.deadline, until)
                ctx.forced = True
            if ctx.interruptible and not ctx.cancel_sent and w.task is not None:
                ctx.cancel_sent = True
                w.task.cancel()  # an async handler stops (or catches it and cleans up)
            return True
        return False

    def lose(self, claim: Claim, reason: str) -> bool:
        """The holder no longer holds ``claim`` (its lease was fenced): cut its attempt now,
        as a lease that ran out is, reporting nothing. False if no worker holds it."""
        for w in self.live:
            if w.claim is claim and w.ctx is not None:
                self._cut(w, Limit.LEASE, reason)
                return True
        return False

    def hurry(self) -> None:
        """Cut the grace period short (a second signal). Safe from a signal handler."""
        self._idle.set()

    def busy(self) -> int:
        return sum(1 for w in self.live if w.ctx is not None)

    async def stop(self, grace_s: float) -> None:
        """Take no new jobs; give running ones ``grace_s`` to finish; cancel the rest (each
        told: ``ctx.cancelled``). What waits for a process is given back at once."""
        if self._stopped:
            return
        self._stopped = self._stopping = True
        self._executor.hold()
        for w in self.live:  # given back now, not when its task next runs: no grace may be left
            if w.ctx is not None and w.claim is not None and self._executor.waiting(w.ctx):
                self._claims.given_back(w.claim)
        if self._health_task is not None:
            self._health_task.cancel()
        if self.busy() and not await wait_event(self._clock, self._idle, grace_s):
            log.warning("grace period over: cancelling %d running jobs", self.busy())
        for w in self.live:
            if w.ctx is not None:
                w.ctx.cancelled = True  # a thread's handler that looks stops too
                self._executor.interrupt(w.ctx)
        tasks = [w.task for w in (*self.live, *self.abandoned) if w.task is not None]
        if self._health_task is not None:
            tasks.append(self._health_task)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stats(self) -> dict[str, Any]:
        return {
            "configured": self.size,
            "live": len(self.live),
            "busy": self.busy(),
            "healthy": len(self.live),
            "hung_declared": self.declared_hung,
            "timed_out": self.timed_out,
            "replaced": self.replaced,
            "abandoned_still_running": len(self.abandoned),
            "max_live_seen": self.max_live_seen,
            "healthcheck": self.healthcheck,
            "hb_timeout_ms": self.hb_timeout * 1000,
        }
