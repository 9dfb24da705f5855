"""The claim/outcome protocol: how a worker gets a job it may run, and how its end is recorded.

``Claims`` is the seam between "where the queue lives" and everything else. The
service and the worker pool speak only this protocol. It has two
implementations: ``LocalClaims`` (here) keeps the queue in this process, the
scheduler's lanes over a store only this process opens (memory, walq, sqlite);
a shared engine (PostgreSQL) claims in the database instead, so that many
processes can share one queue.

Local claims. A job's claim (``scheduled -> running``) is committed while the
work starts, and its outcome (completed, retried or dead) is committed after
the claim is durable, in the background while the worker takes its next job.
Nobody is told of either before it is durable. A crash before the claim is
durable leaves the job ``scheduled``; after, ``running`` and requeued at
recovery: either way the job runs again, which is the at-least-once delivery
the durability contract promises (and counts). A refused claim fences the
outcome (counted as ``fenced``); a claim the store failed to write records
nothing (counted as ``claim_failed``). Waiting for the claim before working cost
about 1 ms of a 20 ms job (an fdatasync round trip), measured.

A cancel and a claim of the same job can race. While a claim is in flight the
job may already be running, so a cancel then answers 409 ``running``; while a
cancel is in flight, workers skip the job (and it is put back if the cancel
fails). So a job reported cancelled never starts.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from sqlq.common.backoff import after_failure
from sqlq.common.clock import Clock
from sqlq.common.errors import (
    IllegalTransitionError,
    JobNotFoundError,
    JobRunningError,
    StoreError,
    TransitionError,
    UnencodableError,
)
from sqlq.common.models import JSON, Job, State, Transition
from sqlq.common.store import JobStore, Recovery
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.live import LiveJobs
from sqlq.runtime.metrics import Metrics
from sqlq.runtime.scheduler import Scheduler

log = logging.getLogger(__name__)


OUTCOME_EVENT = {State.COMPLETED: "completed", State.SCHEDULED: "retried", State.DEAD: "dead"}


class ClaimResult(StrEnum):
    CLAIMED = "claimed"  # durable: the attempt counts, and so will its outcome
    REFUSED = "refused"  # a guard refused it (a cancel won): the outcome is fenced
    FAILED = "failed"  # the store failed: nothing of this attempt is recorded


@dataclass(slots=True, eq=False)
class Claim:
    """A job a worker may run: its running version, and the claim's fate."""

    job: Job  # as running (attempts and started_at updated)
    claimed: asyncio.Future[ClaimResult]


class Claims(Protocol):
    async def start(self, recovery: Recovery) -> None:
        """Take over what the store recovered: requeue what was running, schedule the rest."""
        ...

    async def stop(self) -> None:
        """Stop handing out claims (workers already running keep theirs)."""
        ...

    async def drain(self) -> None:
        """Wait until every outcome reported so far is recorded (after the workers stop)."""
        ...

    def submitted(self, jobs: Sequence[Job]) -> None:
        """``jobs`` are durable: make them claimable."""
        ...

    async def cancel(self, job_id: str) -> Job:
        """Cancel a scheduled job; ``JobRunningError`` if a claim may have won."""
        ...

    async def retry(self, jobs: Sequence[Job]) -> list[Job]:
        """Put dead or cancelled ``jobs`` back, due now, in one durable commit."""
        ...

    async def next(self) -> Claim:
        """The next due job, claimed for the caller; waits until there is one."""
        ...

    def completed(self, claim: Claim, result: JSON) -> None: ...

    def failed(self, claim: Claim, error: str) -> None:
        """The attempt failed: retry with backoff, or dead-letter."""
        ...

    def hung(self, claim: Claim, reason: str) -> None:
        """The attempt was cut off (silent or past its timeout): like a failure."""
        ...

    async def pause(self, queue: str, paused: bool) -> None:
        """Stop (or resume) starting jobs of ``queue``; durable. Running ones finish."""
        ...

    async def queues(self) -> dict[str, QueueInfo]: ...

    def queues_now(self) -> dict[str, QueueInfo]:
        """The queues as this node knows them now, without a store call: in shared mode,
        as of the census the claimer takes every second (the dashboard's overview)."""
        ...

    async def queue(self, name: str) -> QueueInfo: ...

    def backlog(self) -> int:
        """Live jobs (scheduled or running) in the queue, for ``--max-queued``."""
        ...

    def census(self) -> dict[tuple[str, str], int]:
        """Live jobs by (state, queue), for ``/metrics``."""
        ...

    def live_queues(self) -> Collection[str]:
        """The queues that have a live job (scheduled or running) now."""
        ...

    def in_use(self, queue: str) -> bool:
        """Whether ``queue`` counts already for ``--max-queues`` (live jobs, or paused)."""
        ...

    def queues_used(self) -> int:
        """Distinct queues with live jobs or paused: what ``--max-queues`` bounds."""
        ...

    def stats(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class QueueInfo:
    depth: int  # jobs waiting (due or delayed)
    running: int
    limit: int | None  # None: no cap beyond the worker pool
    paused: bool


class ClaimsBase:
    """What both implementations of ``Claims`` do alike: how an attempt ends.

    The outcome's transition is built here (completed, or through the retry policy),
    counted, and written in the background by the subclass's ``_commit_outcome``.
    """

    _paused: set[str]  # paused queues (each subclass's ``_setup`` makes it)

    def __init__(
        self,
        store: JobStore,
        live: LiveJobs,
        config: RuntimeConfig,
        *,
        clock: Clock,
        rng: random.Random,
        metrics: Metrics | None = None,
    ) -> None:
        self._metrics = metrics or Metrics()
        self._store = store
        self._live = live
        self._config = config
        self._clock = clock
        self._rng = rng
        self._caps = dict(config.queue_caps)
        self._running: Counter[str] = Counter()  # attempts started here and not yet over, by queue
        self._background: set[asyncio.Task[None]] = set()  # outcomes being written
        self._setup()

    def _setup(self) -> None:
        """A subclass's own state, made at the end of ``__init__`` (so that the
        constructor's signature is written once, here)."""

    def completed(self, claim: Claim, result: JSON) -> None:
        self._over(claim)
        self._record(claim, claim.job.complete(result, self._clock.time()))

    def failed(self, claim: Claim, error: str) -> None:
        self._over(claim)
        self._record(claim, self._after_failure(claim.job, error, self._clock.time()))

    def hung(self, claim: Claim, reason: str) -> None:
        self._live.totals["requeued_hung"] += 1
        self._metrics.event("requeued", claim.job)
        self.failed(claim, reason)

    def live_queues(self) -> Collection[str]:
        return self._live.queues  # (no zero entries)

    def in_use(self, queue: str) -> bool:
        return queue in self._paused or queue in self.live_queues()

    def queues_used(self) -> int:
        live = self.live_queues()
        return len(live) + sum(1 for q in self._paused if q not in live)

    def _over(self, claim: Claim) -> None:
        """The attempt ended: its queue has room for one more."""
        started = claim.job.started_at
        if started is not None:
            self._metrics.run.observe(max(0.0, self._clock.time() - started))
        self._release(claim.job.queue)

    def _release(self, queue: str) -> None:
        running = self._running
        running[queue] -= 1
        if running[queue] <= 0:
            del running[queue]  # a queue that ran a job once costs nothing after

    def _after_failure(self, job: Job, error: str, now: float) -> Transition:
        return after_failure(job, error, now, self._config.retry, self._rng)

    def _record(self, claim: Claim, t: Transition) -> None:
        task = asyncio.create_task(self._commit_outcome(claim, t))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _commit_outcome(self, claim: Claim, t: Transition) -> None:
        raise NotImplementedError


class LocalClaims(ClaimsBase):
    """Claims from the scheduler's lanes in this process; outcomes through the store."""

    def _setup(self) -> None:
        self.scheduler = Scheduler(
            self._clock, gate=self._open, taken=self._taken, current=self._current
        )
        self._paused: set[str] = set()
        self._claiming: set[str] = set()  # claims committed but not yet durable
        self._cancelling: set[str] = set()  # cancels committed but not yet durable
        self._skipped: set[str] = set()  # taken by a worker while its cancel was in flight

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self, recovery: Recovery) -> None:
        self._paused = set(recovery.paused_queues)
        live = self._live
        live.load(recovery.jobs)
        now = self._clock.time()
        interrupted = [live.jobs[job_id] for job_id in recovery.running]
        moves = [
            self._after_failure(j, "interrupted: the server stopped", now) for j in interrupted
        ]
        if moves:
            await self._store.commit(moves)
        for job, t in zip(interrupted, moves, strict=True):
            # On its last attempt the policy buries it: the view drops it (and counts it
            # dead), so it is counted from ``job``, never looked up again.
            live.applied(job, t)
            event = "requeued" if t.state is State.SCHEDULED else "dead"
            live.totals[f"{event}_at_recovery"] += 1
            self._metrics.event(event, job)
        self.scheduler.load([job for job in live.jobs.values() if job.state is State.SCHEDULED])
        self.scheduler.start()

    async def stop(self) -> None:
        await self.scheduler.stop()

    async def drain(self) -> None:
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # -- the service's side ---------------------------------------------------------------

    def submitted(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            self._live.add(job)
            self._schedule(job)

    def _schedule(self, job: Job) -> None:
        self.scheduler.add(job)

    def _current(self, entry: Job) -> bool:
        """Is the scheduler's ``entry`` still this job as scheduled? (Not once cancelled,
        nor once a retry scheduled it again with a new epoch.)"""
        job = self._live.jobs.get(entry.id)
        return job is not None and job.state is State.SCHEDULED and job.epoch == entry.epoch

    def _open(self, queue: str) -> bool:
        """The scheduler's gate: may a job of ``queue`` start now?"""
        if queue in self._paused:
            return False
        cap = self._caps.get(queue)
        return cap is None or self._running[queue] < cap

    def _taken(self, queue: str) -> None:
        self._running[queue] += 1  # until the attempt ends, or the claim turns out void

    async def pause(self, queue: str, paused: bool) -> None:
        await self._store.set_queue_paused(queue, paused)
        if paused:
            self._paused.add(queue)
        else:
            self._paused.discard(queue)
            self.scheduler.poke(queue)

    async def queues(self) -> dict[str, QueueInfo]:
        return self.queues_now()

    def queues_now(self) -> dict[str, QueueInfo]:
        live = (q for q, n in self._live.queues.items() if n > 0)
        names = {*self._caps, *self._paused, *(q for q, n in self._running.items() if n > 0), *live}
        return {q: self.queue_now(q) for q in sorted(names)}

    async def queue(self, name: str) -> QueueInfo:
        return self.queue_now(name)

    def backlog(self) -> int:
        return len(self._live)

    def census(self) -> dict[tuple[str, str], int]:
        return dict(self._live.census)  # kept as the view changes: no walk over the jobs

    def queue_now(self, name: str) -> QueueInfo:
        """One queue's state; a queue nobody has used is empty, uncapped and running."""
        return QueueInfo(
            depth=self.scheduler.depth(name),
            running=self._running[name],
            limit=self._caps.get(name),
            paused=name in self._paused,
        )

    async def cancel(self, job_id: str) -> Job:
        job = self._live.get(job_id)
        if job is None:
            if await self._store.get(job_id) is None:
                raise JobNotFoundError(job_id)
            raise IllegalTransitionError(job_id, "only a scheduled job can be cancelled")
        if job.state is not State.SCHEDULED:
            raise IllegalTransitionError(job_id, f"a {job.state.value} job cannot be cancelled")
        if job_id in self._claiming:
            raise JobRunningError(job_id, "a worker has claimed it and it may be running")
        if job_id in self._cancelling:
            raise IllegalTransitionError(job_id, "a cancel of this job is already in flight")
        t = job.cancel(self._clock.time())
        self._cancelling.add(job_id)
        try:
            try:
                await self._store.commit([t])
            except BaseException:
                if job_id in self._skipped:  # a worker passed it over meanwhile: put it back
                    self._schedule(job)
                raise
            cancelled = self._live.applied(job, t)
            if job_id not in self._skipped:  # its entry is still in the lanes: out of the depth
                self.scheduler.discard(job)  # (after ``applied``: the lanes ask ``_current``)
        finally:
            self._cancelling.discard(job_id)
            self._skipped.discard(job_id)
        return cancelled

    async def retry(self, jobs: Sequence[Job]) -> list[Job]:
        now = self._clock.time()
        revivals = [job.revive(now) for job in jobs]
        await self._store.commit(revivals)
        revived = [self._live.applied(job, t) for job, t in zip(jobs, revivals, strict=True)]
        for job in revived:
            self._schedule(job)
        self._live.totals["operator_retried"] += len(revived)
        return revived

    def stats(self) -> dict[str, Any]:
        return {"lanes": self.scheduler.sizes()}

    # -- the workers' side ------------------------------------------------------------------

    async def next(self) -> Claim:
        while True:
            entry = await self.scheduler.take()
            claim = self._claim(entry)
            if claim is not None:
                return claim
            self._release(entry.queue)  # handed out, but it will not run: give the slot back

    def _claim(self, entry: Job) -> Claim | None:
        job_id = entry.id
        job = self._live.get(job_id)
        if job is None or job.state is not State.SCHEDULED or job.epoch != entry.epoch:
            return None  # cancelled (or otherwise moved on) while it waited
        if job_id in self._claiming:
            return None
        if job_id in self._cancelling:
            self._skipped.add(job_id)  # the cancel decides: re-added if it fails
            return None
        t = job.start(self._clock.time())
        self._claiming.add(job_id)
        self._metrics.queue_wait.observe(max(0.0, t.updated_at - job.ready_at))  # due -> started
        claimed = asyncio.ensure_future(self._commit_claim(job, t))
        return Claim(job.apply(t), claimed)

    async def _commit_claim(self, job: Job, t: Transition) -> ClaimResult:
        try:
            await self._store.commit([t])
        except TransitionError:
            return ClaimResult.REFUSED
        except StoreError as exc:
            log.error("could not claim job %s: %s", job.id, exc)
            return ClaimResult.FAILED
        finally:
            self._claiming.discard(job.id)
        self._live.applied(job, t)
        return ClaimResult.CLAIMED

    def _release(self, queue: str) -> None:
        super()._release(queue)
        if queue in self._caps:
            self.scheduler.poke(queue)

    # -- outcomes, in the background ----------------------------------------------------------

    async def _commit_outcome(self, claim: Claim, t: Transition) -> None:
        totals = self._live.totals
        result = await claim.claimed
        if result is not ClaimResult.CLAIMED:
            # Refused: this run never counted (fenced). Failed: the store is down.
            totals["fenced" if result is ClaimResult.REFUSED else "claim_failed"] += 1
            if result is ClaimResult.REFUSED:
                self._metrics.event("fenced", claim.job)
            return
        job = claim.job
        try:
            try:
                await self._store.commit([t])
            except UnencodableError as exc:
                # The handler returned something JSON cannot hold: that attempt
                # failed, like any other failure; the store is untouched.
                totals["unencodable"] += 1
                error = f"result is not JSON-serialisable: {exc.what}"
                t = self._after_failure(job, error, self._clock.time())
                await self._store.commit([t])
        except TransitionError:
            totals["fenced"] += 1  # a stale worker: the job was requeued meanwhile
            self._metrics.event("fenced", job)
            return
        except StoreError as exc:
            log.error("could not record the outcome of job %s: %s", job.id, exc)
            return
        after = self._live.applied(job, t)
        self._metrics.event(OUTCOME_EVENT[t.state], job)
        if t.state is State.SCHEDULED:
            totals["retried"] += 1
            self._schedule(after)
