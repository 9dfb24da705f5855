"""``SharedClaims``: the claim/outcome protocol when the queue lives in a shared database.

No node owns the queue, so nothing about it is kept in this process. What
``LocalClaims`` does with lanes and a scheduler, this does with the store:

- **Claiming.** One claimer task takes due jobs in batches sized to the
  workers that are waiting, with one statement (``SharedStore.claim``); the
  store marks them running for this node with a new epoch and a lease, so a
  claim is durable before a worker sees it and no job goes to two nodes.
- **Waking.** The claimer runs when a worker waits, when this node submits or
  requeues work, when another node's NOTIFY arrives (a hint that may be lost),
  when the earliest delayed job falls due, and at least every ``poll_s``.
- **Leases.** A renewal task extends every lease this node holds in one
  statement per ``lease_s / 4``. A rescue task requeues, through the retry
  policy, the running jobs whose lease ran out (a node killed, or cut off), with
  a new epoch; the attempt counts, and past ``max_attempts`` the job is dead.
- **Outcomes** are group-committed and fenced: they apply only while the job
  is still running at the claim's epoch, held by this node, under a lease that
  has not run out. A refused outcome is counted as ``fenced``; its job was (or
  will be) rescued and runs again. That is the at-least-once the design promises.
- **Queues.** Pauses are rows every node reads in the claim; a queue cap is
  counted against the jobs of that queue running on every node, under an
  advisory lock, so it holds across nodes.
- **A running job** may be held by another node: a cancel is asked for in the
  store (``request_cancel``), and the holder hears of it by NOTIFY (``listen``'s
  ``cancel``) or, if that was lost, in its next renewal's answer; then tells the
  attempt. Progress rides on the renewal; a checkpoint is a fenced write.

Time is the nodes' wall clocks, as for ``ready_at`` everywhere: nodes on
different machines need synchronised clocks, and a skew eats into the lease.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec

from sqlq.common import fair
from sqlq.common.errors import StoreError
from sqlq.common.lease import cut_at
from sqlq.common.models import JSON, Job, State, Transition
from sqlq.common.protocol import remote_worker
from sqlq.common.running import Progress
from sqlq.common.store import Fence, Recovery, SharedStore
from sqlq.runtime.census import CENSUS_EVERY_S, Census, CensusViews
from sqlq.runtime.claims import Claim, ClaimResult, ClaimsBase
from sqlq.runtime.context import AttemptFenced
from sqlq.runtime.events import Event
from sqlq.runtime.leases import cancel_in_store, rescue_expired, write_fenced
from sqlq.runtime.remote import lease_ran_out, note_end
from sqlq.runtime.remote_shared import SharedSide

log = logging.getLogger(__name__)

ERROR_PAUSE_S = 0.5  # at most, after a claim the store failed, before the next
WAIT_POLL_S = 0.1  # how often this node looks at the jobs a GET ?wait= here waits on
MAX_FINISHED_IDS = 1000  # job ids in one statement of that look


class SharedClaims(CensusViews, ClaimsBase):
    _store: SharedStore  # the parts' store; the composition root passes only a shared one
    key_attempts = 2  # other nodes reserve no key here: a key taken meanwhile, look again
    finish_poll_s = WAIT_POLL_S  # a job waited on here may finish on another node
    leased = True  # this node's claims last while it renews them (``expires``)

    def _setup(self) -> None:
        self.lease_s: float = self._config.lease_s
        self.poll_s: float = self._config.poll_s
        self._waiting: deque[asyncio.Future[Claim]] = deque()  # workers waiting for a claim
        self._ready: deque[Claim] = deque()  # claimed, its worker went away: the next taker's
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []  # every loop below, the claimer's too
        self._claimer: asyncio.Task[None] | None = None
        self._upkeep: list[asyncio.Task[None]] = []  # lease renewal and rescue (by_hand)
        self._held: dict[str, Claim] = {}  # claimed here, outcome not yet written: the leases
        self._progress: dict[str, Progress] = {}  # progress due, for the next renewal
        self._census = Census(self._store, self._clock)
        # When the last renewal the store granted was sent (monotonic): every lease this
        # node holds runs from there (or from its own claim, if later), ``common.lease``.
        self._renewed_at = self._clock.monotonic()
        self._next_due: float | None = None
        self._stopping = False
        self.claims = 0  # claim statements run
        self.claimed = 0  # jobs they returned
        self.claim_s = 0.0  # time spent waiting for them
        self.rescued = 0  # jobs this node requeued from expired leases
        self.renewals = 0
        self.notified = 0
        # Remote workers' side (``remote_shared``): this node claims none of their queues.
        self._all_remote = self._config.every_queue_remote
        self._besides = sorted(self._config.remote_queues)
        self.remote_side = SharedSide(self, self._store, self.parts)

    def _may_have_policy(self, queue: str) -> None:
        """Every queue may have one here: a remote worker's claim is the store's claim."""

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, recovery: Recovery) -> None:
        self._loop = asyncio.get_running_loop()
        self._paused = set(recovery.paused_queues)
        self._policies.update(recovery.queue_policies)
        now, sent = self._clock.time(), self._clock.monotonic()
        await self._store.renew(now, now + self.lease_s, [])  # this node is seen from the start
        self._renewed_at = sent
        await self._refresh()
        if self._config.listen:
            self._store.listen(self._woken, self._heard)
        self._claimer = asyncio.create_task(self._claim_loop(), name="sqlq-shared-claimer")
        self._upkeep = [
            self._every("leases", self.lease_s / 4, self.renew, "lease renewal failed"),
            self._every("rescue", self.lease_s / 4, self.rescue, "rescue of expired leases failed"),
        ]
        census = self._every("census", CENSUS_EVERY_S, self._refresh, "could not count the queue")
        self._tasks = [self._claimer, *self._upkeep, census]

    def by_hand(self) -> None:
        """Stop renewing leases and rescuing expired ones: whoever calls this does both
        (``renew``, ``rescue``) itself, as a test that drives shared mode step by step
        does, or as a node cut off from the database would fail to."""
        for task in self._upkeep:
            task.cancel()

    def _every(
        self, name: str, seconds: float, do: Callable[[], Awaitable[object]], what: str
    ) -> asyncio.Task[None]:
        """A task that calls ``do`` every ``seconds`` (on the clock) until cancelled."""

        async def loop() -> None:
            while True:
                await self._clock.sleep(seconds)
                try:
                    await do()
                except StoreError as exc:
                    log.warning("%s: %s", what, exc)
                except Exception:  # a bug (or a database error no one foresaw) must not
                    log.exception("%s", what)  # end the renewals for good: they go on

        return asyncio.create_task(loop(), name=f"sqlq-shared-{name}")

    async def stop(self) -> None:
        """Claim no more; a claim no worker took yet is given back now."""
        self._stopping = True
        self.remote_side.stop()
        self._kick.set()
        if self._claimer is not None:
            self._claimer.cancel()
            await asyncio.gather(self._claimer, return_exceptions=True)
        for waiter in self._waiting:
            waiter.cancel()
        while self._ready:
            self.given_back(self._ready.popleft())

    async def drain(self) -> None:
        """Record every outcome, then end this node's leases so others rescue what is left."""
        await self.settle()
        await self.remote_side.drain()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            left = await self._store.release(self._clock.time())
        except StoreError as exc:
            log.error("could not release this node's leases: %s", exc)
            return
        if left:
            log.warning("%d jobs were still running here; any node now rescues them", left)

    # -- waking and claiming --------------------------------------------------------------

    def _woken(self) -> None:
        self.notified += 1
        self._kick.set()
        self.remote_side.ring()

    async def next(self) -> Claim:
        if len(self._background) >= self.max_outcomes:  # (inline: a call per claim costs)
            await self._make_room()
        while True:
            while self._ready:
                claim = self._ready.popleft()
                if claim.over:  # (lost while it waited here: its renewal said so)
                    continue
                if self._clock.monotonic() <= self.expires(claim):
                    return claim
                self._lost_unstarted(claim, "it waited for a worker past its lease")
            waiter: asyncio.Future[Claim] = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            self._kick.set()
            claim = await waiter
            if not claim.over:  # (else lost between its hand-over and this worker's turn)
                return claim

    def _hungry(self) -> int:
        while self._waiting and self._waiting[0].done():
            self._waiting.popleft()
        return sum(1 for w in self._waiting if not w.done())

    async def _claim_loop(self) -> None:
        # Ends on ``_stopping`` too, not only by cancellation (in Python 3.11 a wait_for here
        # swallowed a cancel at a kick, and ``stop`` waited for ever; now a timer kicks).
        while not self._stopping:
            timeout = self.poll_s
            if self._next_due is not None:
                timeout = min(timeout, max(0.0, self._next_due - self._clock.time()))
            timer = self._clock.call_later(timeout, self._kick.set)
            try:
                await self._kick.wait()
            finally:
                timer.cancel()
            self._kick.clear()
            if self._stopping:
                return
            try:
                await self._claim_for_waiting()
            except StoreError as exc:
                log.warning("claim failed: %s", exc)
                await self._clock.sleep(min(self.poll_s, ERROR_PAUSE_S))
            except Exception:  # a bug must not stop this node claiming for good
                log.exception("the claimer failed; it goes on")
                await self._clock.sleep(min(self.poll_s, ERROR_PAUSE_S))

    async def _claim_for_waiting(self) -> None:
        if self._all_remote:
            return  # every queue is remote workers': nothing is claimed in process
        besides = self._besides
        while (n := self._hungry()) > 0:
            now, sent = self._clock.time(), self._clock.monotonic()
            t0 = time.perf_counter()
            # Only what this node has: a store need not know of remote queues or policies
            # where there are none (the call as it was before them).
            extra: dict[str, Any] = {}
            if besides:
                extra["besides"] = besides
            if self._policies:
                extra["policies"] = self._policies
            jobs = await self._store.claim(n, now, now + self.lease_s, self._caps, **extra)
            self.claim_s += time.perf_counter() - t0
            self.claims += 1
            self.claimed += len(jobs)
            for job in jobs:
                self._hand(job, now, sent)
            if len(jobs) < n:
                self._next_due = await self._store.next_due(now)
                return
        self._next_due = None

    def _hand(self, job: Job, now: float, sent: float) -> None:
        """A claimed job to the first waiting worker (or the ready list if none is left);
        ``sent``: when its claim was sent (monotonic), where its lease runs from."""
        self._running[job.queue] += 1
        self._metrics.queue_wait.observe(max(0.0, now - job.ready_at))
        done: asyncio.Future[ClaimResult] = asyncio.get_running_loop().create_future()
        done.set_result(ClaimResult.CLAIMED)
        claim = self._held[job.id] = Claim(job, done, granted_at=sent)
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(claim)
                return
        self._ready.append(claim)

    def submitted(self, jobs: Sequence[Job]) -> None:
        self._census.since += len(jobs)
        self._kick.set()
        self.remote_side.ring()

    # -- leases and rescue -------------------------------------------------------------------

    async def renew(self) -> None:
        """Extend every lease this node holds, in one statement (every ``lease_s / 4``), with
        the progress due; hear of the cancels asked for that a NOTIFY may have lost."""
        now, sent = self._clock.time(), self._clock.monotonic()
        held = self._held
        sent_held = dict(held)  # (what this renewal speaks of: a job may be claimed anew)
        progress, self._progress = self._progress, {}
        due = {job_id: p for job_id, p in progress.items() if job_id in held} or None
        renewal = await self._store.renew(now, now + self.lease_s, list(held), due)
        self._renewed_at = sent
        self.renewals += 1
        for job_id in renewal.cancel_asked:
            self._heard(job_id)
        for job_id in renewal.lost:  # not renewed: run out, or another's (rescued meanwhile)
            claim = sent_held.get(job_id)
            if claim is None or claim.over or held.get(job_id) is not claim:
                continue
            if not self._attempts.lose(claim, "lease lost: the renewal found it run out"):
                self._lost_unstarted(claim, "its renewal found it run out")

    def _lost_unstarted(self, claim: Claim, why: str) -> None:
        """A claim no worker started lost its lease: another node's to rescue. Said in the
        log as the pool says a started one's (the crash trials read both)."""
        log.warning("job %s: lease lost before it started: %s", claim.job.id, why)
        self.lost(claim)

    def _heard(self, job_id: str) -> None:
        """A cancel of ``job_id`` was asked for (on any node): if this node holds it, mark its
        claim (the outcome takes the cancel rule; a worker yet to start it ends it at once)
        and tell its attempt."""
        claim = self._held.get(job_id)
        if claim is not None and not claim.over and claim.job.cancel_requested_at is None:
            self._mark(claim, self._clock.time())  # (the store has it: nothing to write)
            self._attempts.interrupt(job_id, None)

    async def rescue(self) -> int:
        """Requeue (or dead-letter) running jobs whose lease ran out; how many this node did."""
        now = self._clock.time()
        moves = await rescue_expired(self._store, now, lambda job: self._after_failure(
            job, _expired(job), now))  # fmt: skip
        for job, t in moves:
            if remote_worker(job.holder) is not None:  # a remote worker's: counted as one
                after = self.applied(job, t)
                what = lease_ran_out(job)[1]
                self.parts.remote_counts[what] += 1
                note_end(self.parts, job, after, what)
                continue
            if t.state is State.SCHEDULED:
                self._events.record(Event.REQUEUED_EXPIRED_LEASE, job)
            else:
                self.applied(job, t)  # dead: counted so, and its waiters told
        self.rescued += len(moves)
        if moves:
            self._kick.set()
        return len(moves)

    @property
    def renewed_at(self) -> float:
        """When (monotonic) the last renewal the store granted was sent."""
        return self._renewed_at

    def expires(self, claim: Claim) -> float:
        granted = self._renewed_at
        if claim.granted_at is not None and claim.granted_at > granted:
            granted = claim.granted_at
        return cut_at(granted, self.lease_s)

    def trouble(self) -> str | None:
        silent = self._clock.monotonic() - self._renewed_at
        if silent <= self.lease_s:
            return None
        return f"no lease renewed for {silent:.1f} s: the database is out of reach"

    # -- the hooks: outcomes and waking ------------------------------------------------------

    async def _write(self, t: Transition, at: float, spawned: Sequence[Job] = ()) -> None:
        """Fenced on this node's unexpired lease; written again while the database is out
        of reach and the lease still runs (past it, the lease has run out anyway)."""
        fence = Fence(holder=self._store.node, lease_from=at)
        give_up = self._clock.time() + self.lease_s
        await write_fenced(self._store, self._clock, t, fence, lambda: self._stopping or
                           self._clock.time() > give_up, spawned)  # fmt: skip

    def _let_go(self, claim: Claim) -> None:
        self._held.pop(claim.job.id, None)  # no lease of it to renew from now on

    def _touch(self, t: Transition) -> Awaitable[None]:
        return self._write(t, self._clock.time())

    def save(self, claim: Claim, data: JSON) -> asyncio.Future[None]:
        """(Its write carries the latest progress: no renewal may write an older one after.)"""
        self._progress.pop(claim.job.id, None)
        return super().save(claim, data)

    def _send_progress(self, claim: Claim, progress: Progress) -> None:
        """With the next renewal (fenced like the lease), not a write of its own."""
        claim.job = msgspec.structs.replace(claim.job, progress=progress)
        self._progress[claim.job.id] = progress

    def rate_limited(self, claim: Claim, after_s: float) -> None:
        """The key's bucket moves for every node (``SharedStore.push_back``), by the rate this
        node knows for it, in a write of its own beside the snooze's. One the store failed
        is logged: the snooze holds this job back, only the key's others may start sooner."""
        job = claim.job
        policy = self._policies.get(job.queue)
        rate = None if policy is None else policy.rate_of(job.key)
        if rate is not None:
            self._in_background(self._push_back(job, fair.push_back(rate, 0.0, 0.0, after_s)))

    async def _push_back(self, job: Job, hold_s: float) -> None:
        try:
            await self._store.push_back(job.queue, job.key, hold_s)
        except Exception as exc:  # (a background write: nothing else would hear of it)
            log.warning("job %s: its key's bucket was not moved (%s)", job.id, exc)

    async def _write_request(self, claim: Claim, t: Transition) -> None:
        asked = await self._store.request_cancel(t.job_id, t.updated_at)
        if asked is None or asked.state is not State.RUNNING or asked.epoch != t.epoch:
            raise AttemptFenced(f"this attempt no longer holds job {t.job_id}")

    def applied(self, job: Job, t: Transition) -> Job:
        new = job.apply(t)
        if new.terminal:
            self._live.ended(new)
        return new

    def due(self, job: Job) -> None:
        self._kick.set()
        self.remote_side.ring()

    def _opened(self, queue: str) -> None:
        self._kick.set()
        self.remote_side.ring()

    async def finished(self, ids: Sequence[str]) -> list[Job]:
        at = range(0, len(ids), MAX_FINISHED_IDS)  # one statement per MAX_FINISHED_IDS ids
        return [j for i in at for j in await self._store.finished(ids[i : i + MAX_FINISHED_IDS])]

    # -- the service's side -------------------------------------------------------------------

    async def cancel(self, job_id: str, *, force: bool = False) -> Job:
        claim = self._held.get(job_id)
        if claim is not None and not claim.over:  # held here: the claim's job is the one to mark
            try:
                return await self._ask(claim, force)
            except AttemptFenced:
                pass  # rescued meanwhile: as the job is now
        grace_s = self._config.cancel_grace_s if force else None  # (a remote lease held so)
        job, t = await cancel_in_store(self._store, job_id, self._clock, grace_s)
        if t is not None:  # it was scheduled: cancelled
            return self.applied(job, t)
        self._events.record(Event.CANCEL_REQUESTED, job)  # its node hears (NOTIFY, renewal)
        self._heard(job_id)  # (if a worker here took it meanwhile)
        if force and job.cancel_forced:  # its heartbeat hears; it is cut off at the grace's
            self.remote_side.force(job)  # end (here, or by any node's rescue)
        return job

    def stats(self) -> dict[str, Any]:
        return {
            "shared": {
                "node": self._store.node,
                "lease_s": self.lease_s,
                "poll_s": self.poll_s,
                "running_here": sum(self._running.values()),
                "queue_totals": self._census.by_state(),
                "claims": self.claims,
                "claimed": self.claimed,
                "mean_claim": round(self.claimed / self.claims, 2) if self.claims else 0.0,
                "mean_claim_ms": round(1000 * self.claim_s / max(1, self.claims), 3),
                "rescued_here": self.rescued,
                "lease_renewals": self.renewals,
                "notifications": self.notified,
                "nodes": self._census.nodes,
            }
        }


def _expired(job: Job) -> str:
    """What a rescue records of a lease that ran out: a remote worker's (or a forced cancel's
    grace that ended), or a node's."""
    if remote_worker(job.holder) is not None:
        return lease_ran_out(job)[0]
    return "lease expired: its node died or was cut off"
