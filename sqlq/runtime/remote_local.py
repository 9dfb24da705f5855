"""``LocalSide``: remote workers over a queue only this process holds (memory, walq, SQLite).

``LocalClaims`` keeps a remote queue's due jobs in ``RemoteLanes`` instead of the
scheduler, so in-process workers never see them. A claim picks from those lanes and
commits every ``start(now, holder=worker:<name>, lease_until=now + lease_s)`` of the
call in one commit (group commit batches it with others), under each job's turn
(``Serial``); if that is refused, each goes alone and the refused one is left out.
Every later write of a remotely held job (heartbeat, outcome, cancel, expiry) takes the
same turn and is built from the live view's job at that turn, so the view is the job as
stored.

Leases: ``LeaseHeap`` on the injected clock. A lease that runs out takes its turn,
finds the lease still run out (a heartbeat may have come first) and goes through the
retry policy (``after_failure``: an attempt counted, dead past ``max_attempts``,
cancelled if a cancel was asked for), due again in the lanes. A job found running
at recovery with a remote holder stays running under its lease (pushed on the heap:
one that ran out meanwhile expires at once); only in-process claims are requeued.

A cancel of a remotely held job is a durable request the next heartbeat answers
(``cancel_requested``); ``force`` also moves the lease to now + ``cancel_grace_s``
and holds it there, in the same write (``Job.force_cancel``: the job's stored
``cancel_forced``, which ``Job.renew`` obeys, so no heartbeat renews it), so the job
expires, and ends cancelled, counted as cut off, then. Being stored, it holds through a
restart as well: recovery pushes the held lease on the heap like any other.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from sqlq.common.backoff import after_failure
from sqlq.common.errors import JobNotFoundError, StoreError, TransitionError, UnencodableError
from sqlq.common.models import Job, State, Transition
from sqlq.common.protocol import MAX_CLAIM, ClaimRequest, remote_worker
from sqlq.common.running import Progress
from sqlq.runtime.events import Event
from sqlq.runtime.leaseheap import LeaseHeap
from sqlq.runtime.parts import Parts
from sqlq.runtime.remote import Renewed, lease_ran_out, note_end
from sqlq.runtime.remote_lanes import RemoteLanes
from sqlq.runtime.serial import Serial


class LocalHost(Protocol):
    """What ``LocalSide`` asks of the claims whose process holds the queue (``LocalClaims``):
    whether a lanes entry is still the job as scheduled, the queues' caps and pauses, the
    cancels in flight, and where a job due again goes."""

    @property
    def caps(self) -> Mapping[str, int]: ...
    def paused(self, queue: str) -> bool: ...
    def current(self, entry: Job) -> bool: ...
    def passes_over(self, job_id: str) -> bool: ...
    def due(self, job: Job) -> None: ...
    async def cancel_scheduled(self, job: Job) -> Job: ...


log = logging.getLogger(__name__)

EXPIRY_RETRY_S = 1.0  # an expiry the store failed to write is tried again after this
# What a commit refuses as a value, applying none of its changes (the store contract): a
# call's claims or outcomes refused so go one by one, and only the refused one fails.
REFUSED = (TransitionError, JobNotFoundError, UnencodableError)
_RUNNING = State.RUNNING


class LocalSide:
    knows_held = True  # the one process: every end of a remote job is written here

    def __init__(self, claims: LocalHost, parts: Parts) -> None:
        self._claims = claims
        self._parts = parts
        self._store = parts.store
        self._clock = parts.clock
        self._live = parts.live
        self.serial = Serial()
        self.lanes = RemoteLanes(self._clock, claims.current)
        self.leases = LeaseHeap(self._clock, self._lease_due)
        self._starting: Counter[str] = Counter()  # claims being committed, by queue (caps)
        self._stopping = False
        self._tasks: set[asyncio.Task[Any]] = set()  # expiries being written

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stop(self) -> None:
        """Claim no more: every waiting claim answers now; no lease expires from now on
        (those held stay running, in the store, for the next start to take over)."""
        self._stopping = True
        self.lanes.ring_all()
        self.leases.stop()

    async def drain(self) -> None:
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def recovered(self, held: Sequence[Job]) -> None:
        """Jobs found running with a remote holder: they stay so, under their leases."""
        now = self._clock.time()
        seen = self._parts.seen
        for job in held:
            self.leases.push(job.id, job.lease_until if job.lease_until is not None else now)
            worker = remote_worker(job.holder)
            if worker is not None:
                seen.took(worker, 1)

    # -- claims --------------------------------------------------------------------------

    def _room(self, queue: str) -> int:
        claims = self._claims
        if claims.paused(queue):
            return 0
        cap = claims.caps.get(queue)
        if cap is None:
            return MAX_CLAIM
        running = self._live.census.get((_RUNNING, queue), 0)
        return cap - running - self._starting[queue]

    async def take(self, req: ClaimRequest, holder: str, now: float) -> list[Job]:
        if self._stopping:
            return []
        claims = self._claims
        kinds = None if req.kinds is None else frozenset(req.kinds)
        entries = self.lanes.pick(req.queues, req.max, now, kinds, self._room)
        if not entries:
            return []
        live, serial = self._live.jobs, self.serial
        jobs = []
        for entry in entries:
            job = live.get(entry.id)
            if job is None or job.state is not State.SCHEDULED or job.epoch != entry.epoch:
                continue  # cancelled (or moved on) while it waited
            if claims.passes_over(job.id):  # its cancel decides: put back if that fails
                continue
            if not serial.try_take(job.id):  # (a write of a scheduled job: not one of ours)
                self.lanes.add(job)
                continue
            jobs.append(job)
        if not jobs:
            return []
        until = now + req.lease_s
        starting = self._starting
        for job in jobs:
            starting[job.queue] += 1
        moves = [job.start(now, holder=holder, lease_until=until) for job in jobs]
        if len(jobs) == 1:
            one = await self._claim_one(jobs[0], moves[0])
            return [] if one is None else [one]
        try:
            # One commit for the call's claims: one entry in the group commit, where each
            # claim used to cost a task and a future of its own. Atomic, so one refused
            # (never expected: each job's turn is held and its state was just read) refuses
            # them all: then each goes alone, and only the refused one is left out.
            await self._store.commit(moves)
        except REFUSED:
            pass  # (the turns stay held: each one-by-one claim gives its own back)
        except BaseException as exc:  # the store failed, or a bug: no turn outlives it
            self._let_go(jobs)
            if isinstance(exc, StoreError):
                log.error("could not claim %d jobs for a remote worker: %s", len(jobs), exc)
            raise
        else:
            self._let_go(jobs)
            return [self._claimed(job, t) for job, t in zip(jobs, moves, strict=True)]
        done = await asyncio.gather(
            *(self._claim_one(job, t) for job, t in zip(jobs, moves, strict=True)),
            return_exceptions=True,
        )
        out = [j for j in done if isinstance(j, Job)]
        failed = [e for e in done if isinstance(e, BaseException)]
        if failed and not out:
            raise failed[0]
        return out

    async def _claim_one(self, job: Job, t: Transition) -> Job | None:
        """Commit one claim (its turn is held); the running job, or None if refused."""
        try:
            await self._store.commit([t])
        except REFUSED:
            return None
        except StoreError as exc:
            log.error("could not claim job %s for a remote worker: %s", job.id, exc)
            raise
        finally:
            self._let_go([job])
        return self._claimed(job, t)

    def _let_go(self, jobs: Sequence[Job]) -> None:
        """The claims of ``jobs`` are written or refused: their turns and caps' counts go."""
        starting = self._starting
        for job in jobs:
            starting[job.queue] -= 1
            if starting[job.queue] <= 0:
                del starting[job.queue]
            self.serial.give(job.id)

    def _claimed(self, job: Job, t: Transition) -> Job:
        """``job``'s claim ``t`` is durable: shown, timed and leased."""
        after = self._live.applied(job, t)
        self._parts.metrics.queue_wait.observe(max(0.0, t.updated_at - job.ready_at))
        self.leases.push(job.id, t.lease_until if t.lease_until is not None else t.updated_at)
        return after

    async def wait(self, req: ClaimRequest, within: float) -> None:
        kinds = None if req.kinds is None else frozenset(req.kinds)
        await self.lanes.wait(req.queues, kinds, within, self._room)

    # -- a held job's writes (each under its turn) ------------------------------------------

    async def current(self, ids: Sequence[str]) -> list[Job | None]:
        live = self._live.jobs
        return [live.get(job_id) for job_id in ids]

    async def write(self, job: Job, t: Transition, now: float, spawned: Sequence[Job] = ()) -> Job:
        await self._store.commit([t, *spawned] if spawned else [t])
        after = self._live.applied(job, t)
        self._moved(after)
        return after

    async def write_all(self, writes: Sequence[tuple[Job, Transition]], now: float
                        ) -> list[Job] | None:  # fmt: skip
        try:
            await self._store.commit([t for _, t in writes])
        except REFUSED:
            return None  # one of them is refused: each alone, so only that one fails
        afters = [self._live.applied(job, t) for job, t in writes]
        for after in afters:
            self._moved(after)
        return afters

    def _moved(self, after: Job) -> None:
        """``after`` is durable and shown: if it left running, it is nobody's; if due again,
        it goes back in the lanes (or the scheduler, if its queue is no longer remote)."""
        if after.state is State.RUNNING:
            return
        job_id = after.id
        self.leases.forget(job_id)
        if after.state is State.SCHEDULED:
            self._claims.due(after)
        if after.queue in self._claims.caps:
            self.lanes.ring(after.queue)  # room for one more

    async def extend(
        self, now: float, leases: Sequence[tuple[Job, float, Progress | None]]
    ) -> list[Renewed | None]:
        if len(leases) == 1:
            [(job, until, progress)] = leases
            return [await self._renew(job, job.renew(now, until, progress))]
        return list(await asyncio.gather(
            *(self._renew(job, job.renew(now, until, progress)) for job, until, progress in leases)
        ))  # fmt: skip

    async def _renew(self, job: Job, t: Transition) -> Renewed | None:
        try:
            await self._store.commit([t])
        except TransitionError:
            return None
        after = self._live.applied(job, t)
        return (after.lease_until or t.updated_at, after.cancel_requested_at is not None)

    # -- a cancel of a remote queue's job ---------------------------------------------------

    async def cancel(self, job_id: str, force: bool) -> Job | None:
        """Cancel a remote queue's scheduled job, or ask for the cancel of a remotely held
        one (``force``: its lease held to now + ``cancel_grace_s``), in the job's turn; None
        if neither (not live, or running in process): the caller's to decide."""
        claims = self._claims
        await self.serial.take(job_id)
        try:
            job = self._live.get(job_id)
            if job is None:
                return None
            if job.state is State.SCHEDULED:
                return await claims.cancel_scheduled(job)
            if job.state is not State.RUNNING or remote_worker(job.holder) is None:
                return None
            now = self._clock.time()
            first = job.cancel_requested_at is None
            if not first and not force:
                return job  # asked already: the heartbeat says so
            if force:
                t = job.force_cancel(now, now + self._parts.config.cancel_grace_s)
            else:
                t = job.request_cancel(now)
            await self._store.commit([t])
            after = self._live.applied(job, t)
            if first:
                self._parts.live.events.record(Event.CANCEL_REQUESTED, job)
            if force and t.lease_until is not None:
                self.leases.push(job_id, t.lease_until)
            return after
        finally:
            self.serial.give(job_id)

    # -- expiry -------------------------------------------------------------------------------

    def _lease_due(self, ids: list[str]) -> None:
        if self._stopping:
            return
        task = asyncio.ensure_future(self._expire(ids))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _expire(self, ids: list[str]) -> None:
        if len(ids) == 1:
            await self._expire_one(ids[0])
            return
        await asyncio.gather(*(self._expire_one(job_id) for job_id in ids))

    async def _expire_one(self, job_id: str) -> None:
        await self.serial.take(job_id)
        try:
            job = self._live.get(job_id)
            if job is None or job.state is not State.RUNNING:
                return
            if remote_worker(job.holder) is None:
                return
            now = self._clock.time()
            if job.lease_until is not None and job.lease_until > now:
                self.leases.push(job_id, job.lease_until)  # renewed meanwhile: look again then
                return
            parts = self._parts
            why, what = lease_ran_out(job)  # (a forced cancel's grace, or a silent worker)
            t = after_failure(job, why, now, parts.config.retry, parts.rng)
            try:
                await self._store.commit([t])
            except StoreError as exc:
                log.error("could not expire the lease of job %s: %s", job_id, exc)
                self.leases.push(job_id, now + EXPIRY_RETRY_S)
                return
            except TransitionError as exc:  # (its turn is held: nothing else wrote it)
                log.error("the expiry of job %s was refused: %s", job_id, exc)
                return
            after = self._live.applied(job, t)
            parts.remote_counts[what] += 1
            note_end(parts, job, after, what)
            self._moved(after)
        finally:
            self.serial.give(job_id)
