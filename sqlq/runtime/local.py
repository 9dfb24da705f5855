"""``LocalClaims``: the claim/outcome protocol over a queue only this process holds.

The scheduler's lanes over a store only this process opens (memory, walq,
sqlite). A job's claim (``scheduled -> running``) is committed while the work
starts, and its outcome (completed, retried or dead) is committed after the claim
is durable, in the background while the worker takes its next job. Nobody is told
of either before it is durable. A crash before the claim is durable leaves the job
``scheduled``; after, ``running`` and requeued at recovery: either way the job
runs again, which is the at-least-once delivery the durability contract promises
(and counts). A refused claim fences the outcome (counted as ``fenced``); a claim
the store failed to write records nothing (counted as ``claim_failed``). Waiting
for the claim before working cost about 1 ms of a 20 ms job (an fdatasync round
trip), measured.

A cancel and a claim of the same job can race. From the moment a worker takes a
job (its claim in flight or durable) the cancel is a request: it marks the claim's
job, waits for the claim to hold, writes the request, then tells the attempt
(``sqlq.runtime.reach``). While a cancel of a scheduled job is in flight, workers
skip the job (and it is put back if the cancel fails). So a job reported
cancelled never starts, and a running one asked to stop ends by the cancel rule.
A running job no worker holds has its outcome in flight: the cancel waits for it
and looks again (finished: refused; due again: cancelled).

Remote queues (``RuntimeConfig.is_remote``) keep their due jobs out of the scheduler,
in lanes of their own (``remote_side``, ``sqlq.runtime.remote_local``): ``due`` routes
a job by its queue (one set lookup on the hot path), and so do recovery and a cancel.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping, Sequence
from functools import partial
from typing import Any

from sqlq.common.errors import (
    IllegalTransitionError,
    JobNotFoundError,
    JobRunningError,
    StoreError,
    TransitionError,
    ValidationError,
)
from sqlq.common.fair import Policy
from sqlq.common.models import Job, State, Transition
from sqlq.common.protocol import remote_worker
from sqlq.common.store import Cascaded, Recovery
from sqlq.runtime.claims import Claim, ClaimResult, ClaimsBase, QueueInfo
from sqlq.runtime.context import AttemptFenced
from sqlq.runtime.events import Event
from sqlq.runtime.remote_local import LocalSide
from sqlq.runtime.scheduler import Scheduler
from sqlq.runtime.seen import warning

log = logging.getLogger(__name__)
_SCHEDULED = State.SCHEDULED  # (a module global: the enum's attribute costs a lookup per use)

# What an attempt interrupted by a stop became at recovery, as counted.
_AT_RECOVERY = {
    State.SCHEDULED: Event.REQUEUED_AT_RECOVERY,
    State.DEAD: Event.DEAD_AT_RECOVERY,
    State.CANCELLED: Event.CANCELLED_RUNNING,
}


class LocalClaims(ClaimsBase):
    """Claims from the scheduler's lanes in this process; outcomes through the store."""

    def _setup(self) -> None:
        self.scheduler = Scheduler(
            self._clock, gate=self._open, taken=self._taken, current=self.current
        )
        self._fair_queues = self.scheduler.fair  # (the same dict: a job's end asks it)
        self.scheduler.running = lambda queue: self._attempts.running(queue)
        self._claiming: set[str] = set()  # claims committed but not yet durable
        self._cancelling: set[str] = set()  # cancels committed but not yet durable
        self._lanes_loaded = False  # until ``start`` loads them, a released child waits for it
        self._skipped: set[str] = set()  # taken by a worker while its cancel was in flight
        config = self._config
        self._all_remote = config.every_queue_remote
        self._remote_names = config.remote_queues
        self._is_remote = config.remote_test()  # (``RuntimeConfig.is_remote``)
        self.remote_side = LocalSide(self, self.parts)
        self._remote_lanes = self.remote_side.lanes

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self, recovery: Recovery) -> None:
        self._loop = asyncio.get_running_loop()
        self._store.observe_cascade(self.cascaded)
        self._paused.update(recovery.paused_queues)
        for queue, policy in recovery.queue_policies.items():
            self._policy(queue, policy)
        live = self._live
        live.load(recovery.jobs, recovery.by_id)
        now = self._clock.time()
        found = [live.jobs[job_id] for job_id in recovery.running]
        # A remote worker's claim stays running under its lease (its outcome may come yet);
        # an in-process claim's worker died with the process: requeued.
        held = [j for j in found if remote_worker(j.holder) is not None]
        interrupted = [j for j in found if remote_worker(j.holder) is None] if held else found
        self.remote_side.recovered(held)
        moves = [
            self._after_failure(j, "interrupted: the server stopped", now) for j in interrupted
        ]
        if moves:
            await self._store.commit(moves)
        for job, t in zip(interrupted, moves, strict=True):
            # On its last attempt the policy buries it (and a cancel asked for withdraws
            # it): the view drops it and counts it so, so it is counted from ``job``.
            live.applied(job, t)
            self._events.record(_AT_RECOVERY[t.state], job)
        if live.counts[State.SCHEDULED] == len(live.jobs):  # (nothing else: the list at once)
            scheduled = list(live.jobs.values())
        else:
            scheduled = [job for job in live.jobs.values() if job.state is State.SCHEDULED]
        if self._all_remote:
            self._remote_lanes.load(scheduled)
        elif self._remote_names:
            remote = self._is_remote
            self._remote_lanes.load([job for job in scheduled if remote(job.queue)])
            self.scheduler.load([job for job in scheduled if not remote(job.queue)])
        else:
            self.scheduler.load(scheduled)
        self._lanes_loaded = True
        self.scheduler.start()

    async def stop(self) -> None:
        self.remote_side.stop()
        await self.scheduler.stop()

    async def drain(self) -> None:
        await self.settle()
        await self.remote_side.drain()

    # -- the hooks ------------------------------------------------------------------------

    async def _stood(self, claim: Claim) -> bool:
        result = await claim.claimed
        if result is ClaimResult.REFUSED:  # this run never counted
            self._events.record(Event.FENCED, claim.job)
        elif result is ClaimResult.FAILED:  # the store is down
            self._events.record(Event.CLAIM_FAILED, claim.job)
        return result is ClaimResult.CLAIMED

    def _stood_already(self, claim: Claim) -> bool:
        claimed = claim.claimed
        return (
            claimed.done()
            and not claimed.cancelled()
            and claimed.exception() is None
            and claimed.result() is ClaimResult.CLAIMED
        )

    def _write(self, t: Transition, at: float, spawned: Sequence[Job] = ()) -> Awaitable[None]:
        return self._store.commit([t, *spawned] if spawned else [t])

    def _touch(self, t: Transition) -> Awaitable[None]:
        return self._store.commit([t])

    def _touched(self, t: Transition) -> None:
        job = self._live.get(t.job_id)
        if job is not None and job.state is State.RUNNING and job.epoch == t.expect_epoch:
            self._live.applied(job, t)

    def applied(self, job: Job, t: Transition) -> Job:
        return self._live.applied(job, t)

    def due(self, job: Job) -> None:
        if self._is_remote(job.queue):
            self._remote_lanes.add(job)
        else:
            self.scheduler.add(job)

    def _discard(self, job: Job) -> None:
        """``job``'s entry in its lanes is no longer wanted (cancelled)."""
        if self._is_remote(job.queue):
            self._remote_lanes.discard(job)
        else:
            self.scheduler.discard(job)

    def _opened(self, queue: str) -> None:
        if self._is_remote(queue):
            self._remote_lanes.ring(queue, everyone=True)
        else:
            self.scheduler.poke(queue)

    # -- the service's side ---------------------------------------------------------------

    def submitted(self, jobs: Sequence[Job]) -> None:
        for job in jobs:
            if job.state is _SCHEDULED:
                self._live.add(job)
                self.due(job)
            elif job.state is State.WAITING:  # a workflow's member, waiting for its parents
                self._live.add(job)  # (one judged at birth, cancelled, was never live)

    def cascaded(self, moves: Sequence[Cascaded]) -> None:
        """What a workflow member's end (or revival) did to its children, in its commit
        (``JobStore.observe_cascade``): the view follows (a revived child joins it), and a
        released child is due."""
        live = self._live
        for before, after, *_ in moves:
            live.replaced(live.get(after.id) or before, after)
            if after.state is _SCHEDULED and self._lanes_loaded:  # (at recovery: the load's)
                self.due(after)

    def current(self, entry: Job) -> bool:
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

    async def queues(self) -> dict[str, QueueInfo]:
        return self.queues_now()

    def queues_now(self) -> dict[str, QueueInfo]:
        live = (q for q, n in self._live.queues.items() if n > 0)
        names = {*self._caps, *self._paused, *(q for q, n in self._running.items() if n > 0), *live,
                 *self._remote_names, *self._policies}  # fmt: skip
        served = self._served()
        return {q: self._info(q, served) for q in sorted(names)}

    async def queue(self, name: str) -> QueueInfo:
        return self._info(name, self._served())

    def _served(self) -> set[str] | None:
        """The queues some remote worker was seen for lately (None: no queue is remote)."""
        if not self._all_remote and not self._remote_names:
            return None
        return self.parts.seen.served(self._clock.time())

    def backlog(self) -> int:
        return len(self._live)

    def census(self) -> dict[tuple[str, str], int]:
        # kept as the view changes: no walk over the jobs
        return {(state.value, queue): n for (state, queue), n in self._live.census.items()}

    def _info(self, name: str, served: set[str] | None = None) -> QueueInfo:
        """One queue's state; a queue nobody has used is empty, uncapped and running. A remote
        one's jobs are in its own lanes, and its running ones held by remote workers."""
        if served is not None and self._is_remote(name):
            depth = self._remote_lanes.depth(name)
            unclaimed = tuple(self.parts.seen.unclaimed(name, self._clock.time())) if depth else ()
            return QueueInfo(
                depth=depth,
                running=self._live.census.get((State.RUNNING, name), 0),
                limit=self._caps.get(name),
                paused=name in self._paused,
                remote=True,
                warning=warning(depth, name in served, unclaimed),
                unclaimed=unclaimed,
            )
        return QueueInfo(
            depth=self.scheduler.depth(name),
            running=self._running[name],
            limit=self._caps.get(name),
            paused=name in self._paused,
            policy=self._policies.get(name),
        )

    def passed_over(self, job_id: str) -> bool:
        """Whether a worker passed ``job_id`` over because its cancel is in flight."""
        return job_id in self._skipped

    def passes_over(self, job_id: str) -> bool:
        """Whether a taker must pass ``job_id`` over: its cancel is in flight, and decides
        (the job is put back in its lanes if the cancel fails)."""
        if job_id in self._cancelling:
            self._skipped.add(job_id)
            return True
        return False

    def paused(self, queue: str) -> bool:
        return queue in self._paused

    async def cancel(self, job_id: str, *, force: bool = False) -> Job:
        for _ in range(3):  # a cancel that finds the job moving on looks at it again
            job = self._live.get(job_id)
            if job is not None and (self._is_remote(job.queue) or remote_worker(job.holder)):
                done = await self.remote_side.cancel(job_id, force)  # in the job's turn
                if done is not None:
                    return done
            claim = self._attempts.holding(job_id)
            if claim is not None and not _void(claim):  # the claim's job is the one to mark
                try:
                    return await self._ask(claim, force)
                except AttemptFenced:
                    continue
            job = self._live.get(job_id)
            if job is None:
                stored = await self._store.get(job_id)
                if stored is None:
                    raise JobNotFoundError(job_id)
                raise IllegalTransitionError(
                    job_id, f"only a live job can be cancelled; it is {stored.state.value}"
                )
            if job.state is State.SCHEDULED:
                return await self.cancel_scheduled(job)
            if job.state is State.WAITING:
                return await self._cancel_waiting(job)
            # Running, and no worker holds it: its outcome is being written. Once it is, the
            # job is finished, due again (cancel that), or (its write failed) still running.
            await asyncio.wait(list(self._background))  # (never cancels them: see ``settle``)
            job = self._live.get(job_id)
            if job is not None and job.state is State.RUNNING:
                if self._attempts.holding(job_id) is None:
                    return await self._request_unheld(job)
        raise IllegalTransitionError(job_id, "the job kept changing while it was cancelled")

    async def _cancel_waiting(self, job: Job) -> Job:
        """A workflow member that waits for its parents, cancelled (its own waiting children
        by their policies, in the same commit). A parent's end may have released it
        meanwhile: the view's job then leaves its lanes too."""
        t = job.cancel(self._clock.time())
        await self._store.commit([t])
        now = self._live.get(job.id) or job
        cancelled = self._live.applied(now, t)
        if now.state is State.SCHEDULED:
            self._discard(now)
        return cancelled

    async def _request_unheld(self, job: Job) -> Job:
        """Ask for the cancel of a running job no attempt here holds (its outcome failed
        to write): recorded, so recovery ends it cancelled."""
        t = job.request_cancel(self._clock.time())
        await self._store.commit([t])
        self._events.record(Event.CANCEL_REQUESTED, job)
        return self._live.applied(job, t)

    async def cancel_scheduled(self, job: Job) -> Job:
        job_id = job.id
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
                    self.due(job)
                raise
            cancelled = self._live.applied(job, t)
            if job_id not in self._skipped:  # its entry is still in the lanes: out of the depth
                self._discard(job)  # (after ``applied``: the lanes ask ``current``)
        finally:
            self._cancelling.discard(job_id)
            self._skipped.discard(job_id)
        return cancelled

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = {"lanes": self.scheduler.sizes()}
        if self._all_remote or self._remote_names:
            stats["remote_lanes"] = self._remote_lanes.sizes()
        return stats

    # -- the workers' side ------------------------------------------------------------------

    async def next(self) -> Claim:
        if len(self._background) >= self.max_outcomes:  # (inline: a call per claim costs)
            await self._make_room()
        while True:
            entry = await self.scheduler.take()
            claim = self._claim(entry)
            if claim is not None:
                return claim
            self._release(entry)  # handed out, but it will not run: give the slot back

    def _claim(self, entry: Job) -> Claim | None:
        job_id = entry.id
        job = self._live.get(job_id)
        if job is None or job.state is not State.SCHEDULED or job.epoch != entry.epoch:
            return None  # cancelled (or otherwise moved on) while it waited
        if job_id in self._claiming:
            return None
        if job_id in self._cancelling:  # (``passes_over``, inline: the hot path)
            self._skipped.add(job_id)  # the cancel decides: re-added if it fails
            return None
        t = job.start(self._clock.time())
        self._claiming.add(job_id)
        self._metrics.queue_wait.observe(max(0.0, t.updated_at - job.ready_at))  # due -> started
        running = job.apply(t)
        claimed: asyncio.Future[ClaimResult] = asyncio.get_running_loop().create_future()
        commit = asyncio.ensure_future(self._store.commit([t]))  # (a future: as it is)
        commit.add_done_callback(partial(self._committed, job, running, claimed))
        return Claim(running, claimed)

    def _committed(
        self,
        job: Job,
        running: Job,
        claimed: asyncio.Future[ClaimResult],
        commit: asyncio.Future[None],
    ) -> None:
        """The claim's commit ended: settle whether it held. A callback on the commit's
        own future, not a task that only awaits it. ``claimed`` may have been cancelled
        meanwhile (a stop): the view still follows the store."""
        self._claiming.discard(job.id)
        if commit.cancelled():
            claimed.cancel()
            return
        exc = commit.exception()
        if exc is None:
            self._live.replaced(job, running)
            result = ClaimResult.CLAIMED
        elif isinstance(exc, TransitionError):
            result = ClaimResult.REFUSED
        elif isinstance(exc, StoreError):
            log.error("could not claim job %s: %s", job.id, exc)
            result = ClaimResult.FAILED
        else:
            if not claimed.done():
                claimed.set_exception(exc)
            return
        if not claimed.done():
            claimed.set_result(result)

    def _release(self, job: Job) -> None:
        super()._release(job)
        if job.queue in self._caps:
            self.scheduler.poke(job.queue)
        if self._fair_queues and job.queue in self._fair_queues:
            self.scheduler.ended(job)  # its key's slot

    # -- fair queues (``sqlq.common.fair``) ---------------------------------------------

    def _may_have_policy(self, queue: str) -> None:
        if self._is_remote(queue):
            raise ValidationError(
                "policy", f"queue {queue!r} is served by remote workers: fair claims are not "
                "kept for a remote queue yet",
            )  # fmt: skip

    def _policy(self, queue: str, policy: Policy | None) -> None:
        super()._policy(queue, policy)
        if self._is_remote(queue):  # (recovered: a queue made remote since it was set)
            return
        # New fair lanes count the attempts this process runs now, by its worker pool
        # (``scheduler.running``): not the view's running jobs, which include ended ones
        # whose outcome is still being written (counted, they would never end) and leave
        # out claims still being made.
        self.scheduler.set_policy(queue, policy)

    def key_stats(self) -> Mapping[str, list[tuple[str | None, int, int, float]]]:
        return self.scheduler.key_stats()

    def rate_limited(self, claim: Claim, after_s: float) -> None:
        """``claim``'s handler said its upstream takes no more of its key for ``after_s``."""
        self.scheduler.pushed_back(claim.job, after_s)


def _void(claim: Claim) -> bool:
    """Whether ``claim`` turned out never to hold (a cancel won it, or the store failed):
    its worker may still run, but the job is as the store has it, not the claim."""
    claimed = claim.claimed
    return claimed.done() and claimed.result() is not ClaimResult.CLAIMED
