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

Time is the nodes' wall clocks, as for ``ready_at`` everywhere: nodes on
different machines need synchronised clocks, and a skew eats into the lease.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Collection, Sequence
from typing import Any

from sqlq.common.errors import (
    IllegalTransitionError,
    JobNotFoundError,
    JobRunningError,
    StoreError,
    StoreUnavailableError,
    TransitionError,
    UnencodableError,
)
from sqlq.common.models import Job, State, Transition
from sqlq.common.store import Fence, Recovery, SharedStore
from sqlq.runtime.claims import OUTCOME_EVENT, Claim, ClaimResult, ClaimsBase, QueueInfo

log = logging.getLogger(__name__)

RESCUE_BATCH = 500  # expired leases requeued per round
RETRY_OUTCOME_S = 0.2  # an outcome the database did not answer is written again after this


class SharedClaims(ClaimsBase):
    _store: SharedStore  # the constructor's store; Service passes only a shared one

    def _setup(self) -> None:
        self.lease_s = self._config.lease_s
        self.poll_s = self._config.poll_s
        self._waiting: deque[asyncio.Future[Claim]] = deque()  # workers waiting for a claim
        self._ready: deque[Claim] = deque()  # claimed, its worker went away: the next taker's
        self._kick = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._held: set[str] = set()  # claimed here, outcome not yet written: leases to renew
        self._census: dict[tuple[str, str], int] = {}  # (state, queue) -> jobs, on every node
        self._paused: set[str] = set()
        self._nodes: list[dict[str, Any]] = []
        self._submitted_since_census = 0
        self._next_due: float | None = None
        self._stopping = False
        self.claims = 0  # claim statements run
        self.claimed = 0  # jobs they returned
        self.claim_s = 0.0  # time spent waiting for them
        self.rescued = 0  # jobs this node requeued from expired leases
        self.renewals = 0
        self.notified = 0

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, recovery: Recovery) -> None:
        self._paused = set(recovery.paused_queues)
        now = self._clock.time()
        await self._store.renew(now, now + self.lease_s, [])  # this node is seen from the start
        await self._refresh()
        if self._config.listen:
            self._store.listen(self._woken)
        for name, loop in (
            ("claimer", self._claimer),
            ("leases", self._leases),
            ("rescue", self._rescue_loop),
            ("census", self._census_loop),
        ):
            self._tasks.append(asyncio.create_task(loop(), name=f"sqlq-shared-{name}"))

    async def stop(self) -> None:
        """Claim no more; a claim no worker took yet is given back now."""
        self._stopping = True
        self._kick.set()
        for task in self._tasks:
            if task.get_name() == "sqlq-shared-claimer":
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        for waiter in self._waiting:
            waiter.cancel()
        while self._ready:
            claim = self._ready.popleft()
            self._release(claim.job.queue)  # it never started, but it was counted as running
            self._record(claim, claim.job.retry("not started: the node stopped", claim.job.ready_at,
                                                self._clock.time()))  # fmt: skip

    async def drain(self) -> None:
        """Record every outcome, then end this node's leases so others rescue what is left."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
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

    async def next(self) -> Claim:
        if self._ready:
            return self._ready.popleft()
        waiter: asyncio.Future[Claim] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        self._kick.set()
        return await waiter

    def _hungry(self) -> int:
        while self._waiting and self._waiting[0].done():
            self._waiting.popleft()
        return sum(1 for w in self._waiting if not w.done())

    async def _claimer(self) -> None:
        # Ends on ``_stopping`` too, not only by cancellation: in Python 3.11, wait_for
        # swallows a cancel that lands as its inner wait completes (a kick at the stop), and
        # the claimer then looped on and ``stop`` waited for it for ever (the model test's
        # PostgreSQL tier hung once so).
        while not self._stopping:
            timeout = self.poll_s
            if self._next_due is not None:
                timeout = min(timeout, max(0.0, self._next_due - self._clock.time()))
            try:
                await asyncio.wait_for(self._kick.wait(), timeout)
            except TimeoutError:
                pass
            self._kick.clear()
            if self._stopping:
                return
            try:
                await self._claim_for_waiting()
            except StoreError as exc:
                log.warning("claim failed: %s", exc)
                await asyncio.sleep(min(self.poll_s, 0.5))
            except Exception:  # a bug must not stop this node claiming for good
                log.exception("the claimer failed; it goes on")
                await asyncio.sleep(min(self.poll_s, 0.5))

    async def _claim_for_waiting(self) -> None:
        while (n := self._hungry()) > 0:
            now = self._clock.time()
            t0 = time.perf_counter()
            jobs = await self._store.claim(n, now, now + self.lease_s, self._caps)
            self.claim_s += time.perf_counter() - t0
            self.claims += 1
            self.claimed += len(jobs)
            for job in jobs:
                self._hand(job, now)
            if len(jobs) < n:
                self._next_due = await self._store.next_due(now)
                return
        self._next_due = None

    def _hand(self, job: Job, now: float) -> None:
        """A claimed job to the first waiting worker (or the ready list if none is left)."""
        self._running[job.queue] += 1
        self._held.add(job.id)
        self._metrics.queue_wait.observe(max(0.0, now - job.ready_at))
        done: asyncio.Future[ClaimResult] = asyncio.get_running_loop().create_future()
        done.set_result(ClaimResult.CLAIMED)
        claim = Claim(job, done)
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(claim)
                return
        self._ready.append(claim)

    def submitted(self, jobs: Sequence[Job]) -> None:
        self._submitted_since_census += len(jobs)
        self._kick.set()

    # -- leases and rescue -------------------------------------------------------------------

    async def _leases(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 4)
            now = self._clock.time()
            try:
                await self._store.renew(now, now + self.lease_s, list(self._held))
                self.renewals += 1
            except StoreError as exc:
                log.warning("lease renewal failed: %s", exc)

    async def _rescue_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 4)
            try:
                await self.rescue()
            except StoreError as exc:
                log.warning("rescue of expired leases failed: %s", exc)

    async def rescue(self) -> int:
        """Requeue (or dead-letter) running jobs whose lease ran out; how many this node did."""
        now = self._clock.time()
        expired = await self._store.expired(now, RESCUE_BATCH)
        if not expired:
            return 0
        fence = Fence(lease_before=now)
        moves = [(job, self._after_failure(job, "lease expired: its node died or was cut off",
                                           now)) for job in expired]  # fmt: skip
        outcomes = await asyncio.gather(
            *(self._store.commit_fenced([t], fence) for _, t in moves), return_exceptions=True
        )
        done = 0
        for (job, t), outcome in zip(moves, outcomes, strict=True):
            if outcome is None:
                done += 1
                self._metrics.event("requeued" if t.state is State.SCHEDULED else "dead", job)
                if t.state is State.DEAD:
                    self._finished(job.apply(t))
            elif not isinstance(outcome, TransitionError):  # another node rescued it first
                log.warning("could not rescue job %s: %s", job.id, outcome)
        self.rescued += done
        self._live.totals["requeued_expired_lease"] += done
        if done:
            self._kick.set()
        return done

    # -- outcomes ---------------------------------------------------------------------------

    async def _commit_outcome(self, claim: Claim, t: Transition) -> None:
        try:
            await self._outcome(claim, t)
        finally:
            self._held.discard(claim.job.id)

    async def _outcome(self, claim: Claim, t: Transition) -> None:
        totals = self._live.totals
        job = claim.job
        fence = Fence(holder=self._store.node, lease_from=self._clock.time())
        try:
            try:
                await self._write_outcome(job, t, fence)
            except UnencodableError as exc:
                totals["unencodable"] += 1
                error = f"result is not JSON-serialisable: {exc.what}"
                t = self._after_failure(job, error, self._clock.time())
                await self._write_outcome(job, t, fence)
        except TransitionError:
            totals["fenced"] += 1  # its lease ran out: it was (or will be) rescued and rerun
            self._metrics.event("fenced", job)
            return
        except StoreError as exc:
            log.error("could not record the outcome of job %s: %s", job.id, exc)
            return
        self._metrics.event(OUTCOME_EVENT[t.state], job)
        if t.state is State.SCHEDULED:
            totals["retried"] += 1
            self._kick.set()
        else:
            self._finished(job.apply(t))

    async def _write_outcome(self, job: Job, t: Transition, fence: Fence) -> None:
        """Write ``t``, again while the database is out of reach and the lease still runs.

        An answer lost in a reconnect may hide a write that landed: a refusal of
        the rewrite is then checked against the row before it counts as fenced.
        """
        uncertain = False
        give_up = self._clock.time() + self.lease_s  # past it, the lease has run out anyway
        while True:
            try:
                await self._store.commit_fenced([t], fence)
                return
            except StoreUnavailableError:
                if self._stopping or self._clock.time() > give_up:
                    raise
                uncertain = True
                await asyncio.sleep(RETRY_OUTCOME_S)
            except TransitionError:
                if uncertain and await self._landed(t):
                    return
                raise

    async def _landed(self, t: Transition) -> bool:
        now = await self._store.get(t.job_id)
        return now is not None and (now.state, now.epoch, now.updated_at) == (
            t.state, t.epoch, t.updated_at,
        )  # fmt: skip

    def _finished(self, job: Job) -> None:
        self._live.totals[job.state.value] += 1
        if self._live.on_finished is not None:
            self._live.on_finished(job)

    # -- the service's side -------------------------------------------------------------------

    async def cancel(self, job_id: str) -> Job:
        job = await self._store.get(job_id)
        if job is None:
            raise JobNotFoundError(job_id)
        if job.state is not State.SCHEDULED:
            raise IllegalTransitionError(job_id, f"a {job.state.value} job cannot be cancelled")
        t = job.cancel(self._clock.time())
        try:
            await self._store.commit([t])
        except TransitionError:
            now = await self._store.get(job_id)
            if now is not None and now.state is State.RUNNING:
                raise JobRunningError(job_id, "a node claimed it and it may be running") from None
            raise
        cancelled = job.apply(t)
        self._finished(cancelled)
        return cancelled

    async def retry(self, jobs: Sequence[Job]) -> list[Job]:
        now = self._clock.time()
        revivals = [job.revive(now) for job in jobs]
        await self._store.commit(revivals)
        self._live.totals["operator_retried"] += len(jobs)
        self._kick.set()
        return [job.apply(t) for job, t in zip(jobs, revivals, strict=True)]

    async def pause(self, queue: str, paused: bool) -> None:
        await self._store.set_queue_paused(queue, paused)
        if paused:
            self._paused.add(queue)
        else:
            self._paused.discard(queue)
            self._kick.set()

    # -- what the queue holds, on every node ------------------------------------------------------

    async def _refresh(self) -> None:
        counts = await self._store.census()
        self._census = {(c.state.value, c.queue): c.jobs for c in counts}
        self._paused = set(await self._store.paused_queues())
        self._nodes = await self._store.nodes(self._clock.time())
        self._submitted_since_census = 0

    async def _census_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await self._refresh()
            except StoreError as exc:
                log.warning("could not count the queue: %s", exc)

    async def queues(self) -> dict[str, QueueInfo]:
        await self._refresh()
        return self.queues_now()

    def queues_now(self) -> dict[str, QueueInfo]:
        names = {*self._caps, *self._paused, *(q for _, q in self._census)}
        return {q: self._info(q) for q in sorted(names)}

    async def queue(self, name: str) -> QueueInfo:
        await self._refresh()
        return self._info(name)

    def _info(self, name: str) -> QueueInfo:
        return QueueInfo(
            depth=self._census.get((State.SCHEDULED.value, name), 0),
            running=self._census.get((State.RUNNING.value, name), 0),
            limit=self._caps.get(name),
            paused=name in self._paused,
        )

    def backlog(self) -> int:
        """Live jobs on every node, as of the last count, plus what this node added since."""
        return sum(self._census.values()) + self._submitted_since_census

    def census(self) -> dict[tuple[str, str], int]:
        return dict(self._census)

    def live_queues(self) -> Collection[str]:
        return {queue for _, queue in self._census}  # on every node, as of the last count

    def stats(self) -> dict[str, Any]:
        jobs: Counter[str] = Counter()
        for (state, _), n in self._census.items():
            jobs[state] += n
        return {
            "shared": {
                "node": self._store.node,
                "lease_s": self.lease_s,
                "poll_s": self.poll_s,
                "running_here": sum(self._running.values()),
                "queue_totals": {s: jobs[s] for s in (State.SCHEDULED.value, State.RUNNING.value)},
                "claims": self.claims,
                "claimed": self.claimed,
                "mean_claim": round(self.claimed / self.claims, 2) if self.claims else 0.0,
                "mean_claim_ms": round(1000 * self.claim_s / max(1, self.claims), 3),
                "rescued_here": self.rescued,
                "lease_renewals": self.renewals,
                "notifications": self.notified,
                "nodes": self._nodes,
            }
        }
