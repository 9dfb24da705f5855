"""The claim/outcome protocol: how a worker gets a job it may run, and how its end is recorded.

``Claims`` is the seam between "where the queue lives" and everything else. The
service and the worker pool speak only this protocol. It has two
implementations: ``LocalClaims`` (``sqlq.runtime.local``) keeps the queue in this
process, the scheduler's lanes over a store only this process opens (memory,
walq, sqlite); ``SharedClaims`` (``sqlq.runtime.shared``) claims in a database
many processes share (PostgreSQL). Which one a service gets is the composition
root's choice (``sqlq.runtime.modes``); the service never asks the store.

What the two do alike is written once, in ``ClaimsBase``: how an attempt ends
(the outcome's transition, through the retry policy; a result JSON cannot hold;
the fenced count; the log line; the events), and the flows of an operator's retry
and pause. They differ only in the hooks: whether a claim held (``_held``), how an
outcome is written (``_write``), what the view does with it (``applied``), and how
a job or a queue that became claimable wakes the claimers (``due``, ``_opened``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import Counter
from collections.abc import Awaitable, Collection, Coroutine, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from sqlq.common.backoff import Failure, after_failure, after_snooze, released
from sqlq.common.errors import StoreError, TransitionError, UnencodableError
from sqlq.common.fair import Policy
from sqlq.common.models import JSON, Job, State, Transition
from sqlq.common.protocol import ParentsPage
from sqlq.common.store import Recovery
from sqlq.runtime.claim import Claim as Claim  # (re-exported: where the claims speak of it)
from sqlq.runtime.claim import ClaimResult as ClaimResult
from sqlq.runtime.claim import QueueInfo as QueueInfo
from sqlq.runtime.context import AttemptFenced
from sqlq.runtime.events import Event
from sqlq.runtime.holding import Holding
from sqlq.runtime.parents import page as parents_page
from sqlq.runtime.parts import Parts
from sqlq.runtime.reach import Attempts, Reach
from sqlq.runtime.spawn import Spawner, SpawnRefused

if TYPE_CHECKING:
    from sqlq.runtime.remote import RemoteSide

log = logging.getLogger(__name__)


class Claims(Holding, Protocol):
    """``Holding``, and the rest a service does with the queue: recovery and the stop,
    submissions, cancels and an operator's verbs. What it only reads is ``ClaimsView``."""

    @property
    def remote_side(self) -> RemoteSide:
        """Where remote workers' claims and reports go (``sqlq.runtime.remote.Remote``)."""
        ...

    spawner: Spawner | None  # what makes a spawn's jobs (``sqlq.runtime.spawn``)

    @property
    def key_attempts(self) -> int:
        """How many times a submission looks its idempotency keys up: more than once where
        other processes insert keys this one does not reserve (see ``Submissions``)."""
        ...

    @property
    def finish_poll_s(self) -> float | None:
        """How often a GET ?wait= here looks for jobs finished elsewhere (``finished``);
        None: every job finishes in this process, which tells its waiters itself."""
        ...

    async def start(self, recovery: Recovery) -> None:
        """Take over what the store recovered: requeue what was running, schedule the rest."""
        ...

    async def stop(self) -> None:
        """Stop handing out claims (workers already running keep theirs)."""
        ...

    async def settle(self) -> None:
        """Wait until every outcome reported so far is recorded."""
        ...

    async def drain(self) -> None:
        """``settle``, after the workers stop; then let go of what this process holds."""
        ...

    def submitted(self, jobs: Sequence[Job]) -> None:
        """``jobs`` are durable: make them claimable."""
        ...

    async def cancel(self, job_id: str, *, force: bool = False) -> Job:
        """Cancel a scheduled job (returned ``cancelled``), or ask a running one to stop
        (returned ``running``, ``cancel_requested_at`` set; ``force``: and cut it off after
        ``cancel_grace_s``); ``IllegalTransitionError`` if finished."""
        ...

    def attach(self, attempts: Attempts) -> None:
        """The worker pool whose attempts a cancel reaches."""
        ...

    async def retry(self, jobs: Sequence[Job]) -> list[Job]:
        """Put dead or cancelled ``jobs`` back, due now, in one durable commit."""
        ...

    async def pause(self, queue: str, paused: bool) -> None:
        """Stop (or resume) starting jobs of ``queue``; durable. Running ones finish."""
        ...

    async def set_policy(self, queue: str, policy: Policy | None) -> None:
        """``queue``'s policy (``sqlq.common.fair``; None: none) from now on; durable."""
        ...

    async def finished(self, ids: Sequence[str]) -> list[Job]:
        """Those of ``ids`` that are finished, wherever they ran (see ``finish_poll_s``)."""
        ...


class ClaimsView(Protocol):
    """What the reporting surface reads of where the queue lives, beside ``Claims`` and
    changing nothing: the queues and their counts, the census, live counts, the queues in
    use and paused, what runs here, and trouble (``/readyz``)."""

    def trouble(self) -> str | None:
        """Why this node cannot serve now (its store out of reach past its lease), or None."""
        ...

    async def queues(self) -> dict[str, QueueInfo]: ...

    def queues_now(self) -> dict[str, QueueInfo]:
        """The queues now, without a store call (shared: as of the claimer's census)."""
        ...

    async def queue(self, name: str) -> QueueInfo: ...

    def backlog(self) -> int:
        """Live jobs (scheduled or running) in the queue, for ``--max-queued``."""
        ...

    def census(self) -> dict[tuple[str, str], int]:
        """Live jobs by (state, queue), for ``/metrics``."""
        ...

    def live_counts(self) -> dict[str, int]:
        """Live jobs by state (scheduled, running), for ``/stats``: all of the queue's."""
        ...

    def live_queues(self) -> Collection[str]:
        """The queues that have a live job (scheduled or running) now."""
        ...

    def paused_queues(self) -> Collection[str]:
        """The queues paused now (``--max-queues`` counts names: ``sqlq.runtime.names``)."""
        ...

    def policies(self) -> Mapping[str, Policy]:
        """Each queue's policy, as this node knows it now."""
        ...

    def key_stats(self) -> Mapping[str, list[tuple[str | None, int, int, float]]]:
        """Each fair queue's keys held here: (key, due, running, wait of its next job)."""
        ...

    def running_here(self) -> Mapping[str, int]:
        """Attempts started in this process and not yet over, by queue; no zero entries."""
        ...

    def stats(self) -> dict[str, Any]: ...


class QueueHome(Claims, ClaimsView, Protocol):
    """Where the queue lives, as the composition root makes it (``runtime.modes``): one
    object that is both the verbs and the view; the service hands each part to whoever
    needs only that part."""


ROOM_SAMPLE = 64  # past max_outcomes: the writes a claim waits on the first of

LIVE_STATES = (State.SCHEDULED, State.RUNNING, State.WAITING)


class ClaimsBase(Reach):
    """What both implementations of ``Claims`` do alike (see the module's docstring)."""

    key_attempts: ClassVar[int] = 1
    finish_poll_s: ClassVar[float | None] = None
    leased: ClassVar[bool] = False  # the queue is this process's: no lease to lose
    lease_s: float | None = None
    # Outcomes decided and not yet written, at most: past it no worker takes a new claim
    # until half of them are, so a store slower than the handlers holds the workers back
    # instead of a backlog of outcome tasks growing without bound in memory (``_make_room``).
    max_outcomes: int = 4096
    spawner: Spawner | None = None  # what makes a spawn's jobs (the service's submissions)

    def __init__(self, parts: Parts) -> None:
        self.parts = parts
        self._seen = parts.seen
        self._store = parts.store
        self._config = parts.config
        self._clock = parts.clock
        self._rng = parts.rng
        self._live = parts.live
        self._events = parts.live.events
        self._metrics = parts.metrics
        self._caps = dict(parts.config.queue_caps)
        self._paused: set[str] = set()  # paused queues
        self._policies: dict[str, Policy] = {}  # queues with a policy (``sqlq.common.fair``)
        self._running: Counter[str] = Counter()  # attempts started here and not yet over, by queue
        self._background: set[asyncio.Future[Any]] = set()  # outcomes (and touches) being written
        self._setup()

    def _setup(self) -> None:
        """A subclass's own state, made at the end of ``__init__``."""

    async def parents(self, claim: Claim, start: int) -> ParentsPage:
        """``Holding.parents``: the page, read from the store, while the claim holds."""
        if claim.over:
            raise AttemptFenced("this attempt is over")
        return await parents_page(self._store.get_many, claim.job, start)

    @property
    def caps(self) -> Mapping[str, int]:
        """``--queue NAME=N``: at most N jobs of queue NAME run at once."""
        return self._caps

    # -- the hooks -----------------------------------------------------------------------

    async def _stood(self, claim: Claim) -> bool:
        """Whether the attempt's claim held, so its outcome may be written."""
        return True

    def _write(self, t: Transition, at: float, spawned: Sequence[Job] = ()) -> Awaitable[None]:
        """Write an outcome ``t`` of an attempt that ended at ``at``, and the jobs it
        ``spawned`` in its commit; durable once awaited. (An awaitable, not a coroutine of
        its own: one frame fewer per outcome.)"""
        raise NotImplementedError

    def _let_go(self, claim: Claim) -> None:
        """The outcome of ``claim`` is written, or never will be."""

    def applied(self, job: Job, t: Transition) -> Job:
        """``job`` after the durable ``t``, told to the view (and to waiters if it ended)."""
        raise NotImplementedError

    def due(self, job: Job) -> None:
        """``job`` is scheduled again: wake whoever claims it."""
        raise NotImplementedError

    def _opened(self, queue: str) -> None:
        """``queue`` was resumed: wake whoever claims its jobs."""
        raise NotImplementedError

    # -- the service's side ----------------------------------------------------------------

    async def retry(self, jobs: Sequence[Job]) -> list[Job]:
        now = self._clock.time()
        revivals = [job.revive(now) for job in jobs]
        await self._store.commit(revivals)
        revived = [self.applied(job, t) for job, t in zip(jobs, revivals, strict=True)]
        for job in revived:
            self.due(job)
        self._events.record(Event.OPERATOR_RETRIED, n=len(revived))
        return revived

    async def pause(self, queue: str, paused: bool) -> None:
        await self._store.set_queue_paused(queue, paused)
        if paused:
            self._paused.add(queue)
        else:
            self._paused.discard(queue)
            self._opened(queue)

    async def set_policy(self, queue: str, policy: Policy | None) -> None:
        self._may_have_policy(queue)
        if policy == Policy():
            policy = None  # (the default: fair between keys, no limits)
        await self._store.set_queue_policy(queue, policy)
        self._policy(queue, policy)

    def policies(self) -> Mapping[str, Policy]:
        return self._policies

    def key_stats(self) -> Mapping[str, list[tuple[str | None, int, int, float]]]:
        return {}  # (kept where the claims keep keys: ``LocalClaims``)

    def _may_have_policy(self, queue: str) -> None:
        """``ValidationError`` naming ``policy`` if ``queue`` cannot obey one here."""

    def _policy(self, queue: str, policy: Policy | None) -> None:
        """``queue``'s policy is ``policy`` now (durable, or recovered): obey it."""
        if policy is None:
            self._policies.pop(queue, None)
        else:
            self._policies[queue] = policy

    async def finished(self, ids: Sequence[str]) -> list[Job]:
        return []  # (finish_poll_s is None: nobody asks)

    async def settle(self) -> None:
        while self._background:
            # ``wait``, not ``gather``: a cancel of this waiter must never reach the writes it
            # waits on (other jobs' outcomes, and the store's own futures).
            await asyncio.wait(list(self._background))

    def live_counts(self) -> dict[str, int]:
        counts = self._live.counts
        return {state.value: counts[state] for state in LIVE_STATES}

    def live_queues(self) -> Collection[str]:
        return self._live.queues  # (no zero entries)

    def paused_queues(self) -> Collection[str]:
        return self._paused

    def running_here(self) -> Mapping[str, int]:
        return self._running

    # -- the workers' side: how an attempt ends ---------------------------------------------

    def completed(self, claim: Claim, result: JSON, spawn: Sequence[JSON] | None = None) -> None:
        if self._over(claim):
            return
        t = self._carry(claim).complete(result, self._clock.time())
        if spawn is None:
            self._record(claim, t)
        else:  # (its own way: the spawned jobs are built, then written with it)
            self._in_background(self._outcome(claim, t, None, True, spawn=spawn))

    def failed(self, claim: Claim, failure: Failure) -> None:
        if self._over(claim):
            return
        job, now = self._carry(claim), self._clock.time()
        t = after_failure(job, failure.error, now, self._config.retry, self._rng,
                          delay_s=failure.delay_s, retry=failure.retry,
                          traceback=failure.traceback)  # fmt: skip
        self._record(claim, t)

    def hung(self, claim: Claim, failure: Failure) -> None:
        if self._over(claim):
            return
        job, now = self._carry(claim), self._clock.time()
        t = after_failure(job, failure.error, now, self._config.retry, self._rng,
                          delay_s=failure.delay_s, retry=failure.retry)  # fmt: skip
        self._record(claim, t, again=Event.REQUEUED_HUNG)

    def snoozed(self, claim: Claim, delay_s: float) -> None:
        if self._over(claim):
            return
        job, now = self._carry(claim), self._clock.time()
        self._record(claim, after_snooze(job, delay_s, now, self._config.max_snoozes),
                     again=Event.SNOOZED, retried=False)  # fmt: skip

    def rate_limited(self, claim: Claim, after_s: float) -> None:
        """(Kept only where the claims keep per-key rates: ``LocalClaims``.)"""

    def given_back(self, claim: Claim) -> None:
        if claim.over:  # (a late give-back is fenced as a late end is; no run time to see)
            self._events.record(Event.FENCED, claim.job)
            return
        self._release(claim.job)
        self._record(claim, released(self._carry(claim), self._clock.time()), retried=False)

    def expires(self, claim: Claim) -> float | None:
        return None

    def trouble(self) -> str | None:
        return None

    def lost(self, claim: Claim) -> None:
        if self._over(claim):
            return
        claim.over = True
        self._let_go(claim)
        self._events.record(Event.LEASE_LOST, claim.job)

    def _over(self, claim: Claim) -> bool:
        """The attempt ended: its queue has room for one more. True if it had ended already
        (cut off as hung, say, and its handler returned late): nothing is written and the
        running count is not taken down again; the late end is counted as fenced."""
        if claim.over:
            self._events.record(Event.FENCED, claim.job)
            return True
        started = claim.job.started_at
        if started is not None:
            self._metrics.run.observe(max(0.0, self._clock.time() - started))
        self._release(claim.job)
        return False

    def _release(self, job: Job) -> None:
        """``job``'s attempt here is over (or never started): its queue has room again."""
        queue = job.queue
        running = self._running
        running[queue] -= 1
        if running[queue] <= 0:
            del running[queue]  # a queue that ran a job once costs nothing after

    def _after_failure(self, job: Job, error: str, now: float) -> Transition:
        return after_failure(job, error, now, self._config.retry, self._rng)

    def _record(
        self, claim: Claim, t: Transition, *, again: Event | None = None, retried: bool = True
    ) -> None:
        """Write the outcome ``t`` in the background, while the worker takes its next job.
        ``again``: what to count if it is due again, besides ``retried`` (unless ``retried``
        is False: a snooze, a claim given back).

        The usual end (nothing of the attempt waits to be written before it) runs on
        callbacks: once the claim is known to have held, the write starts, and the
        write's future, settled, finishes it (``_wrote``). Anything else, and any write
        that failed, goes through ``_outcome``, the one place each case is handled. A
        task per outcome did nothing but wait, which callbacks do for less."""
        claimed = claim.claimed
        if claim.last is None and not claimed.done():  # (durable: its sync is under way)
            self._background.add(claimed)  # (an outcome in flight, for settle and the bound)
            claimed.add_done_callback(partial(self._then_write, claim, t, again, retried))
            return
        self._write_outcome(claim, t, again, retried)

    def _then_write(
        self, claim: Claim, t: Transition, again: Event | None, retried: bool, _: Any
    ) -> None:
        try:
            self._write_outcome(claim, t, again, retried)
        finally:  # (after: ``_background`` never empties between; and whatever happened)
            self._background.discard(claim.claimed)

    def _write_outcome(
        self, claim: Claim, t: Transition, again: Event | None, retried: bool
    ) -> None:
        if claim.last is not None or not self._stood_already(claim):
            self._in_background(self._outcome(claim, t, again, retried))
            return
        at = self._clock.time()
        write = asyncio.ensure_future(self._write(t, at))  # (a future: as it is)
        self._background.add(write)
        write.add_done_callback(partial(self._wrote, claim, t, again, retried, at))

    def _wrote(
        self,
        claim: Claim,
        t: Transition,
        again: Event | None,
        retried: bool,
        at: float,
        write: asyncio.Future[Any],
    ) -> None:
        try:
            if write.cancelled() or write.exception() is not None:
                self._in_background(self._outcome(claim, t, again, retried, (write, at)))
            else:
                self._let_go(claim)
                self._landed(claim.job, t, again, retried)
        finally:  # (a bug above must not leave it in flight for good: ``settle`` would spin)
            self._background.discard(write)

    def _in_background(self, outcome: Coroutine[Any, Any, None]) -> None:
        """Run ``outcome`` (``_outcome``) as a task, in flight until it ends."""
        task = asyncio.create_task(outcome)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _spawned(self, job: Job, t: Transition, at: float, spawn: Sequence[JSON]) -> None:
        """Write ``t`` with the jobs its handler spawned (``sqlq.runtime.spawn``)."""
        if self.spawner is None:
            raise SpawnRefused("spawn refused: this server makes no jobs from an outcome")
        await self.spawner(job, t, spawn, partial(self._write, t, at))

    def _stood_already(self, claim: Claim) -> bool:
        """Whether ``claim`` is known, now, to have held (False: not known yet, or it did
        not; ``_stood`` waits, and says which)."""
        return False

    async def _make_room(self) -> None:
        """Before a claim, with ``max_outcomes`` outcomes being written: wait until half of
        them are. Only then: on the hot path the check is one ``len`` (in ``next``)."""
        background = self._background
        while len(background) > self.max_outcomes // 2:
            # The first of a few to end, not of all each time one ends (a walk of thousands,
            # thousands of times), nor of one alone (a slow write would hold it up).
            some = set(itertools.islice(background, ROOM_SAMPLE))
            if any(t.done() for t in some):
                await asyncio.sleep(0)  # (their discards are a callback away)
            else:
                await asyncio.wait(some, return_when=asyncio.FIRST_COMPLETED)

    def outcomes_in_flight(self) -> int:
        """Outcomes (and touches) being written now: at most about ``max_outcomes``."""
        return len(self._background)

    async def _outcome(
        self,
        claim: Claim,
        t: Transition,
        again: Event | None,
        retried: bool,
        written: tuple[asyncio.Future[Any], float] | None = None,
        *,
        spawn: Sequence[JSON] | None = None,
    ) -> None:
        """The outcome's whole way, or (``written``: a write started, and failed) the rest
        of it from there; ``spawn``: the jobs its handler spawned, written with it."""
        events, job = self._events, claim.job
        try:
            if written is None:
                if not await self._stood(claim):
                    return
                if claim.last is not None:  # its progress, checkpoint or cancel first
                    await self._settled(claim)
                at = self._clock.time()
                write: Awaitable[None] = (
                    self._write(t, at) if spawn is None else self._spawned(job, t, at, spawn)
                )
            else:
                write, at = written
            try:
                try:
                    await write
                except UnencodableError as exc:
                    # The handler returned something JSON cannot hold: that attempt
                    # failed, like any other failure; the store is untouched.
                    events.record(Event.UNENCODABLE, job)
                    error = f"result is not JSON-serialisable: {exc.what}"
                    t = self._after_failure(job, error, self._clock.time())
                    await self._write(t, at)
                except SpawnRefused as exc:  # the same: the attempt failed, nothing stored
                    events.record(Event.SPAWN_REFUSED, job)
                    t = after_failure(job, str(exc), self._clock.time(), self._config.retry,
                                      self._rng, retry=not exc.final)  # fmt: skip
                    await self._write(t, at)
            except TransitionError:
                # A stale attempt: the job was requeued meanwhile (a hang declared, a
                # lease run out); its rerun's outcome is the one that counts.
                events.record(Event.FENCED, job)
                return
            except StoreError as exc:
                log.error("could not record the outcome of job %s: %s", job.id, exc)
                return
        finally:
            self._let_go(claim)
        self._landed(job, t, again, retried)

    def _landed(self, job: Job, t: Transition, again: Event | None, retried: bool) -> None:
        """The outcome ``t`` of ``job``'s attempt is durable: the view, the counts, and the
        lanes if it is due again."""
        events = self._events
        after = self.applied(job, t)
        if after.state is State.SCHEDULED:
            if retried:
                events.record(Event.RETRIED, job)
            if again is not None:
                events.record(again, job)
            self.due(after)
        elif after.state is State.CANCELLED:
            events.record(Event.CANCELLED_RUNNING, job)
