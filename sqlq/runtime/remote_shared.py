"""``SharedSide``: remote workers when the queue lives in a shared database (PostgreSQL).

Nothing of a remote claim is kept in the process, so any node serves any worker and
accepts a token another node issued (the signing key is a row every node reads):

- **Claim.** One statement, ``SharedStore.claim(n, now, lease_until, caps, only=queues,
  kinds=..., holder=worker:<name>)``: durable, a new epoch, the worker's name as the
  row's holder (never a node's, so no node's renewal or release touches it). The
  node's own claimer leaves the remote queues out (``besides``), or claims nothing in
  process when every queue is remote.
- **Long-poll.** A waiting claim sleeps on a bell rung by whatever wakes the node's
  claimer (a submit or requeue here, another node's NOTIFY, a resumed queue), and for
  no longer than ``poll_s`` (the backstop for a lost NOTIFY) or until the earliest
  delayed job is due (``next_due``, read at most once per ``poll_s`` for all waiters),
  or a fair queue's next token (read again after a claim a bucket may have cut short).
  An attempt's end that frees a slot of a key under a concurrency limit rings it too.
- **Heartbeats** are one ``extend`` statement for all of a call's leases, each fenced
  in it; **outcomes** read the job (``get``, gathered) and write through
  ``commit_fenced`` with ``Fence(holder=job.holder, lease_from=now)``, so a job whose
  lease ran out or that moved on is refused there, whichever node moved it.
- **Expiry** is the rescue every node already runs (``SharedClaims.rescue``): a remote
  row's lease runs out like a dead node's, through the retry policy.
- **A forced cancel** is stored with the request (``request_cancel(forced_until=...)``):
  the row's lease is cut to the grace's end and held there (``cancel_forced``, which
  ``extend`` obeys, so a heartbeat that reaches any node renews it no further). At the
  grace's end this node writes the attempt's end (cancelled, counted as cut off), fenced
  on the epoch and holder; should this node be gone by then, the rescue any node runs
  finds the lease run out and writes the same end (``lease_ran_out``).

Writes of one job from this node take turns (``Serial``); two nodes' writes of one job
are kept apart by the database's fence.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from sqlq.common.backoff import after_failure
from sqlq.common.clock import wait_event
from sqlq.common.errors import StoreError, TransitionError
from sqlq.common.fair import Policy
from sqlq.common.models import Job, State, Transition
from sqlq.common.protocol import ClaimRequest
from sqlq.common.running import Progress
from sqlq.common.store import Fence, Lease, SharedStore
from sqlq.runtime.leases import write_fenced
from sqlq.runtime.parts import Parts
from sqlq.runtime.remote import Renewed, lease_ran_out, note_end
from sqlq.runtime.serial import Serial


class SharedHost(Protocol):
    """What ``SharedSide`` asks of the claims it serves remote queues beside
    (``SharedClaims``): the caps, the poll, and the view's and the claimers' hooks."""

    @property
    def caps(self) -> Mapping[str, int]: ...
    def policies(self) -> Mapping[str, Policy]: ...
    @property
    def poll_s(self) -> float: ...
    def applied(self, job: Job, t: Transition) -> Job: ...
    def due(self, job: Job) -> None: ...


log = logging.getLogger(__name__)

# An outcome the database did not answer is written again for this long at most (and
# never past the lease): then the worker hears 503, and reports it again itself.
WRITE_FOR_S = 2.0


class SharedSide:
    knows_held = False  # a job claimed here may end through another node

    def __init__(self, claims: SharedHost, store: SharedStore, parts: Parts) -> None:
        self._claims = claims
        self._store = store
        self._clock = parts.clock
        self._parts = parts
        self.serial = Serial()
        self._bell = asyncio.Event()  # rung (and replaced) when work may have come
        self._stopping = False
        self._next_due: tuple[float, float | None] | None = None  # (read at, next due)
        self._tasks: set[asyncio.Task[None]] = set()  # forced cancels' cut-offs being written

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stop(self) -> None:
        self._stopping = True
        self.ring()

    def ring(self) -> None:
        """Work may have come (a submit, a requeue, a NOTIFY, a resume): every waiting claim
        looks again."""
        self._bell.set()
        self._bell = asyncio.Event()
        self._next_due = None

    async def take(self, req: ClaimRequest, holder: str, now: float) -> list[Job]:
        if self._stopping:
            return []
        claims = self._claims
        policies = claims.policies()
        if policies:
            jobs = await self._store.claim(req.max, now, now + req.lease_s, claims.caps,
                                           only=req.queues, kinds=req.kinds, holder=holder,
                                           policies=policies)  # fmt: skip
        else:
            jobs = await self._store.claim(req.max, now, now + req.lease_s, claims.caps,
                                           only=req.queues, kinds=req.kinds,
                                           holder=holder)  # fmt: skip
        if len(jobs) < req.max:
            # A bucket may have held one back, or a fair queue's sweep left keys unread:
            # read its token, or its "at once", before waiting (``next_due``).
            self._next_due = None
        wait = self._parts.metrics.queue_wait
        for job in jobs:
            wait.observe(max(0.0, now - job.ready_at))
        return jobs

    async def wait(self, req: ClaimRequest, within: float) -> None:
        bell, clock = self._bell, self._clock
        poll_s = self._claims.poll_s
        now = clock.time()
        cached = self._next_due
        # Read again once it is a poll old, or once the time it held has come (its claim
        # came and went: the next one is the store's to say). What the store answers is
        # ahead of now, or now itself once (a sweep's "at once": ``next_due``), so this
        # never spins on a past time.
        if cached is None or now - cached[0] > poll_s or (cached[1] or now + 1) <= now:
            try:
                due = await self._store.next_due(now, remote=True)
            except StoreError:  # out of reach for now: the poll looks again
                due = None
            cached = self._next_due = (now, due)
        timeout = min(within, poll_s)
        if cached[1] is not None:
            timeout = min(timeout, max(0.0, cached[1] - now))
        await wait_event(clock, bell, max(timeout, 0.001))

    async def current(self, ids: Sequence[str]) -> list[Job | None]:
        """The jobs as stored now, in one read however many a call names."""
        if len(ids) == 1:
            return [await self._store.get(ids[0])]
        return await self._store.get_many(ids)

    async def write(self, job: Job, t: Transition, now: float, spawned: Sequence[Job] = ()) -> Job:
        clock = self._clock
        until = min(job.lease_until if job.lease_until is not None else now, now + WRITE_FOR_S)
        fence = Fence(holder=job.holder, lease_from=now)
        await write_fenced(self._store, clock, t, fence, lambda: clock.time() > until, spawned)
        after = self._claims.applied(job, t)  # (finished: its waiters here are told)
        if after.state is State.SCHEDULED:
            self._claims.due(after)
        elif after.state is not State.RUNNING and self._frees_a_slot(after):
            self.ring()  # a key's slot came free: its waiting claims look again
        return after

    def _frees_a_slot(self, job: Job) -> bool:
        policy = self._claims.policies().get(job.queue)
        return policy is not None and policy.concurrency_of(job.key) is not None

    async def write_all(self, writes: Sequence[tuple[Job, Transition]], now: float
                        ) -> list[Job] | None:  # fmt: skip
        return None  # each write is fenced on its own job's holder and lease: one at a time

    async def extend(
        self, now: float, leases: Sequence[tuple[Job, float, Progress | None]]
    ) -> list[Renewed | None]:
        asked = [Lease(job.id, job.epoch, job.holder or "", until, progress)
                 for job, until, progress in leases]  # fmt: skip
        held = {e.job_id: e for e in await self._store.extend(now, asked)}
        out: list[Renewed | None] = []
        for job, _, _ in leases:
            e = held.get(job.id)
            out.append(None if e is None else (e.lease_until, e.cancel_asked))
        return out

    def force(self, job: Job) -> None:
        """A forced cancel of the remotely held ``job``, durable (its lease held at the
        grace's end, ``cancel_forced``): at that end, if the attempt still holds the job,
        its end is written here (cancelled, by the cancel rule), fenced on the epoch and
        the holder, without waiting for the next rescue round; the rescue is what ends it
        if this node stops first."""
        now = self._clock.time()
        at = now if job.lease_until is None else job.lease_until
        self._clock.call_later(max(0.0, at - now), lambda: self._cut_later(job))

    def _cut_later(self, job: Job) -> None:
        if self._stopping:
            return
        task = asyncio.ensure_future(self._cut(job))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _cut(self, job: Job) -> None:
        await self.serial.take(job.id)
        try:
            now = self._clock.time()
            current = await self._store.get(job.id)
            if (current is None or current.state is not State.RUNNING
                    or not current.cancel_forced or current.epoch != job.epoch
                    or current.holder != job.holder):  # fmt: skip
                return
            parts = self._parts
            why, what = lease_ran_out(current)  # (forced: the cut-off's)
            t = after_failure(current, why, now, parts.config.retry, parts.rng)
            try:
                await self._store.commit_fenced([t], Fence(holder=current.holder))
            except (TransitionError, StoreError) as exc:
                log.warning("could not cut off job %s after its forced cancel: %s", job.id, exc)
                return
            after = self._claims.applied(current, t)
            parts.remote_counts[what] += 1
            note_end(parts, current, after, what)
            if after.state is State.SCHEDULED:
                self._claims.due(after)
        finally:
            self.serial.give(job.id)

    async def drain(self) -> None:
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
