"""``RemoteClaims``: the claims a remote worker holds, over HTTP (holder ``worker:<name>``).

The worker pool (``sqlq.runtime.workers``) runs every attempt, in the server and in
``sqlq worker`` alike; what differs is where its claims come from and where their ends
go. In the server that is ``Claims`` over a store; here it is this class, the same verbs
(``sqlq.runtime.holding.Holding``) spoken over the pull protocol (``sqlq.common.protocol``):

- ``next``: from a buffer the claim loop (``claiming``) fills. It keeps claims out for
  the free slots (``/claims``, ``max`` up to them, long-polling ``wait_s``): one while
  the queue looks empty, up to ``MAX_CLAIMS_OUT`` while claims come back full, so a busy
  queue's claims overlap instead of waiting on each other's round trip;
- every end (``completed``, ``failed``, ``hung``, ``snoozed``, ``given_back``) is decided
  once, encoded (``sqlq.worker_attempt``) and goes to the outbox, which delivers it in
  batches until the server answers (``sqlq.worker_outbox``); a busy claim carries them;
- the lease: one heartbeat of every held claim each ``lease_s / 3`` (sooner for the
  items with new progress, at most every ``progress_every_s``) renews it from when it was
  sent; ``expires`` is when the pool's health loop must stop the attempt unrenewed
  (``sqlq.common.lease``); a heartbeat answered ``fenced`` cuts it at once (``lose``),
  and one answered ``cancel_requested`` interrupts it as the server's cancel does;
- the channel a handler's context writes through: progress rides the next heartbeat,
  a checkpoint is a ``/claims/checkpoint``, durable before it returns.

A claim is checked as it arrives, since the server cannot check a remote queue's jobs:
a kind this worker does not run is given back; arguments its kind refuses fail it, not
retried. The server unreachable (connection refused, 5xx, 429): each loop backs off on
its own (``Backoff``), the handlers go on, and every decided end is kept and sent again
until the server takes or fences it.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import random
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from sqlq.calls import ApiError, FencedError, Invalid, RateLimited, Unavailable
from sqlq.common.backoff import Failure
from sqlq.common.clock import Clock, wait_event
from sqlq.common.errors import ValidationError
from sqlq.common.lease import SKEW_MARGIN, stop_before
from sqlq.common.models import JSON
from sqlq.common.protocol import (
    DEFAULT_LEASE_S,
    FENCED,
    MAX_CLAIM,
    MAX_ITEMS,
    Beat,
    BeatItem,
    ClaimAnswer,
    CompleteIn,
    Granted,
    Outcome,
    ParentsPage,
    ProgressIn,
    ReleaseIn,
    Reported,
    SnoozeIn,
    What,
)
from sqlq.runtime.claim import Claim, ClaimResult
from sqlq.runtime.context import AttemptFenced, describe
from sqlq.runtime.kinds import Registry, Validate
from sqlq.runtime.reach import Attempts, Nobody
from sqlq.worker_attempt import Attempt, describe_what, failed_with, failure, job_of
from sqlq.worker_outbox import RETRYABLE, Backoff, Outbox

log = logging.getLogger("sqlq.worker")

PROCESS_LINGER_S = 0.05  # with processes: how long a finished outcome waits for company
MAX_CLAIMS_OUT = 4  # claims in flight at once, while they come back full
IDLE_POLL_S = 1.0  # an empty claim is not repeated sooner than this
MAX_REFUSED_CARRIES = 2  # carried claims refused in a row (each for an item) end carrying
CARRIED_WITHIN_S = 2.0  # at a stop, a claim that carries outcomes (no wait) is awaited this long
INTERRUPTED = "interrupted: the worker stopped before it finished (--grace)"
FENCED_REASON = "fenced: the server no longer holds its claim for this worker"


class PullClient(Protocol):
    """What a ``Worker`` needs of ``AsyncClient`` (tests give it a fake)."""

    async def claim(
        self,
        queues: Sequence[str],
        *,
        worker: str,
        kinds: Sequence[str] | None = None,
        max: int = 1,
        wait_s: float = 0.0,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> list[Granted]: ...

    async def report_and_claim(
        self,
        outcomes: Sequence[Outcome | msgspec.Raw],
        queues: Sequence[str],
        *,
        worker: str,
        kinds: Sequence[str] | None = None,
        max: int = 1,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> ClaimAnswer: ...

    async def heartbeat(self, items: Sequence[str | BeatItem]) -> list[Beat]: ...

    async def checkpoint(self, token: str, data: Any) -> Reported: ...

    async def parents(self, token: str, start: int = 0) -> ParentsPage: ...

    async def outcomes(self, items: Sequence[Outcome | msgspec.Raw]) -> list[Reported]: ...


class RemoteClaims:
    """``Holding`` over HTTP for the worker pool (module docstring). ``concurrency``: the
    pool's size, the claims it may hold at once; ``processes``: how many of them run in
    worker processes (claims then come in halves of the spare slots, and outcomes linger
    a moment for company)."""

    def __init__(
        self,
        client: PullClient,
        *,
        queues: Sequence[str],
        name: str,
        kinds: Sequence[str],
        registry: Registry,
        concurrency: int,
        processes: int,
        lease_s: float,
        wait_s: float,
        grace_s: float,
        progress_every_s: float,
        backoff: Backoff,
        clock: Clock,
        rng: random.Random,
    ) -> None:
        self.client = client
        self.queues = list(queues)
        self.name = name
        self.kinds = list(kinds)
        self.registry = registry
        self.concurrency = concurrency
        self._lease_s = lease_s
        self.wait_s = wait_s
        self.grace_s = grace_s
        self.progress_every_s = progress_every_s
        self._clock = clock
        self._rng = rng
        self._backoff = backoff
        self._attempts: Attempts = Nobody()
        # With processes, jobs finish one by one: claiming a slot at a time would be a
        # claim per job. So it claims once half the spare slots are free (the other half
        # keep the processes busy meanwhile), and lets outcomes gather for a moment.
        self._processes = processes
        self._refill = max(1, (concurrency - processes) // 2) if processes else 1
        self.stats: dict[str, int] = dict.fromkeys(
            ("claimed", "completed", "failed", "snoozed", "released", "fenced", "cut_off",
             "lease_lost", "claims", "outcome_calls", "heartbeats", "undelivered"), 0)  # fmt: skip
        self._outbox = Outbox(client, clock=clock, rng=rng, backoff=backoff,
                              answered=self._answered, before=self._flush,
                              linger_s=PROCESS_LINGER_S if processes else 0.0,
                              counts=self.stats)  # fmt: skip
        self._loop: asyncio.AbstractEventLoop | None = None
        # every remote claim's fate, known before the pool sees it: one future, settled once
        # and shared (awaited, never changed), not one made and settled a job
        self._held_ok: asyncio.Future[ClaimResult] | None = None
        self._held: dict[str, Attempt] = {}  # claimed, end not decided: takes a slot
        self._leased: dict[str, Attempt] = {}  # claimed, end not answered: heartbeated
        self._by_claim: dict[int, Attempt] = {}  # id(claim) -> its attempt (the pool's)
        self._ready: collections.deque[Attempt] = collections.deque()  # claimed, not taken
        self._waiters: collections.deque[asyncio.Future[Attempt]] = collections.deque()
        self._progressed: set[Attempt] = set()  # new progress, not yet in a heartbeat
        self._room = asyncio.Event()  # a slot freed, or stopping
        self._beat_now = asyncio.Event()
        self._stop = asyncio.Event()
        self._hurry = asyncio.Event()
        self._stop_at: float | None = None
        self._asked = 0  # slots the claims out now ask for
        self._draining = False  # the latest claim came back full
        self._carry = True  # claims may carry outcomes (until the server refuses that)
        self._refused_carries = 0  # carried claims refused in a row, for an item
        self._claim_after = 0.0  # monotonic: no new claim before (a backoff)
        self._claim_failures = 0
        self._saves: set[asyncio.Task[None]] = set()  # checkpoints being written
        self._checks: dict[str, Validate] = {}  # each kind's argument check, once looked up
        self._claims_out: set[asyncio.Event] = set()  # each set when its claim answers
        self.fatal: ApiError | None = None  # why the server refused this worker for good

    def attach(self, attempts: Attempts) -> None:
        """The pool whose attempts a heartbeat's answer reaches (a cancel, a fence)."""
        self._attempts = attempts

    @property
    def held(self) -> int:
        """Claims holding a slot now."""
        return len(self._held)

    @property
    def owed(self) -> int:
        """Ends decided that the server has not taken yet."""
        return len(self._outbox)

    # -- the stop ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Claim no more; what arrives from now on is given back (signal-safe)."""
        if self._stop_at is None:
            self._stop_at = self._clock.monotonic()
        self._stop.set()
        self._room.set()

    def hurry(self) -> None:
        """A claim in flight is not waited for, nor is a backoff of the outbox."""
        self.stop()
        self._hurry.set()
        for answered in self._claims_out:
            answered.set()
        self._outbox.hurry()

    def grace_left(self) -> float:
        """What is left of ``grace_s`` since the stop (0 after a hurry)."""
        if self._stop_at is None or self._hurry.is_set():
            return 0.0 if self._hurry.is_set() else self.grace_s
        return max(0.0, self._stop_at + self.grace_s - self._clock.monotonic())

    def interrupted(self) -> None:
        """The pool stopped: every attempt still held fails as interrupted (an attempt
        counted, as a server's stop counts it)."""
        for a in list(self._held.values()):
            log.warning("job %s (%s): still running at the end of the grace; interrupted",
                        a.job.id, a.job.kind)  # fmt: skip
            self._decide(a, failure(INTERRUPTED))

    async def delivered(self) -> None:
        """Wait for the server to take every outcome owed, as long as their leases last."""
        if not len(self._outbox):
            return
        owed = self._outbox.owed()
        within = max(a.lease_end for a in owed) - self._clock.monotonic()
        log.info("stopping: %d outcomes to report (for %.0f s at most)", len(owed), within)
        if not await self._outbox.drained(within):
            lost = self._outbox.owed()
            self.stats["undelivered"] += len(lost)
            log.error("stopped with %d outcomes the server never took (jobs %s); they run "
                      "again after their lease", len(lost),
                      ", ".join(a.job.id for a in lost[:10]))  # fmt: skip

    # -- the background loops ---------------------------------------------------------------

    def start(self) -> list[asyncio.Task[None]]:
        """The heartbeats and the outbox, running until cancelled."""
        self._loop = asyncio.get_running_loop()
        return [
            asyncio.create_task(self._beats(), name="sqlq-worker-beats"),
            asyncio.create_task(self._outbox.run(), name="sqlq-worker-outcomes"),
        ]

    async def claiming(self) -> None:
        """Keep claims out for the free slots until the stop (module docstring); then wait
        (within the grace) for those in flight, whose jobs are given back, and give back
        what no worker took."""
        out: set[asyncio.Task[None]] = set()
        while not self._stop.is_set():
            now = self._clock.monotonic()
            if now < self._claim_after:  # a backoff, or an empty answer that came at once
                await wait_event(self._clock, self._stop, self._claim_after - now)
                continue
            held = len(self._held)
            spare = self.concurrency - held - self._asked
            wanted = spare > 0 and (spare >= self._refill or
                                    held + self._asked < self._processes)  # fmt: skip
            if wanted and len(out) < (MAX_CLAIMS_OUT if self._draining else 1):
                n = min(spare, MAX_CLAIM)
                self._asked += n
                # a busy queue's claim carries the outcomes waiting (one call, not two)
                carried = self._outbox.carry() if self._draining and self._carry else []
                task = asyncio.create_task(self._claim_some(n, carried))
                out.add(task)
                task.add_done_callback(functools.partial(self._claimed, out))
                continue
            self._room.clear()
            await self._room.wait()
        if out:
            await asyncio.gather(*out, return_exceptions=True)
        while self._ready:
            self._decide(self._ready.popleft(), ReleaseIn())

    def _claimed(self, out: set[asyncio.Task[None]], task: asyncio.Task[None]) -> None:
        out.discard(task)
        self._room.set()  # (after the discard: the loop may send the next one)

    async def _claim_some(self, n: int, carried: list[Attempt]) -> None:
        asked = self._clock.monotonic()
        answers: Sequence[Reported] | None = None  # the carried outcomes': None, sent again
        try:
            granted, answers = await self._claim(n, carried)
        except (Unavailable, RateLimited) as exc:
            self._claim_failures += 1
            delay = self._backoff.delay(self._claim_failures, self._rng)
            log.warning("could not claim (%s); again in %.1f s", exc, delay)
            self._claim_after = self._clock.monotonic() + delay
            return
        except Invalid as exc:
            if not carried:
                log.error("the server refused this worker's claim: %s", exc)
                self.fatal = exc
                self.stop()
                return
            # what it carried, most likely (a claim alone went through before): those go
            # by the outbox's own calls, which take a refused batch one by one
            for a in carried:
                a.alone = True  # (never carried again: no claim refused twice for them)
            self._refused_carries += 1
            one_item = (exc.field or "").startswith("outcomes[")
            if one_item and self._refused_carries < MAX_REFUSED_CARRIES:
                log.warning("a claim carrying %d outcomes was refused (%s); these go alone",
                            len(carried), exc)  # fmt: skip
            else:  # the field itself, or every carried claim: an older server, say
                log.warning("a claim carrying %d outcomes was refused (%s); outcomes go "
                            "alone from now on", len(carried), exc)  # fmt: skip
                self._carry = False
            return
        except ApiError as exc:
            log.error("the server refused this worker's claim: %s", exc)
            self.fatal = exc
            self.stop()
            return
        except Exception:  # a bug (an answer it cannot read): logged, and not a spin
            self._claim_failures += 1
            log.exception("a claim failed")
            self._claim_after = self._clock.monotonic() + self._backoff.delay(
                self._claim_failures, self._rng
            )
            return
        finally:
            self._asked -= n
            if carried:
                self._outbox.settle(carried, answers)
        self._claim_failures = 0
        if carried:
            self._refused_carries = 0
        self._draining = len(granted) == n  # a full answer: there may be more
        late = self._clock.monotonic() - asked > self._lease_s * SKEW_MARGIN
        if granted:
            self._granted(granted, asked, late)
        if not granted and not carried:  # a long poll that came back at once: not a spin
            self._claim_after = max(self._claim_after, asked + IDLE_POLL_S)

    async def _claim(
        self, n: int, carried: list[Attempt]
    ) -> tuple[list[Granted], Sequence[Reported] | None]:
        """One claim (with the outcomes it carries: then it does not wait), and the
        carried outcomes' answers; after a stop, it is waited for (to give back what it
        got) until the grace runs out (one that carries outcomes ``CARRIED_WITHIN_S`` more,
        even in a hurry), then abandoned (the server gives back what a long poll claimed
        once it sees the connection gone, or the lease runs out; the outcomes go again)."""
        self.stats["claims"] += 1
        call: asyncio.Future[ClaimAnswer | list[Granted]]
        if carried:
            call = asyncio.ensure_future(self.client.report_and_claim(
                [msgspec.Raw(a.body) for a in carried], self.queues, worker=self.name,
                kinds=self.kinds, max=n, lease_s=self._lease_s))  # fmt: skip
        else:
            call = asyncio.ensure_future(self.client.claim(
                self.queues, worker=self.name, kinds=self.kinds, max=n, wait_s=self.wait_s,
                lease_s=self._lease_s))  # fmt: skip
        answered = asyncio.Event()
        call.add_done_callback(lambda _: answered.set())
        self._claims_out.add(answered)
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({call, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not call.done() and not self._hurry.is_set():
                await wait_event(self._clock, answered, self.grace_left())
            if not call.done() and carried:  # it does not wait on the server: its answer
                came = asyncio.Event()  # is moments away, and its jobs are then given back
                call.add_done_callback(lambda _: came.set())  # instead of held to a lease
                await wait_event(self._clock, came, CARRIED_WITHIN_S)
            if not call.done():  # past the grace, or a hurry: abandoned
                log.warning("a claim in flight at the stop was not waited for")
                return [], None
            got = call.result()
            if isinstance(got, ClaimAnswer):
                return got.claims, got.outcomes or []
            return got, None
        finally:
            self._claims_out.discard(answered)
            stopped.cancel()
            if not call.done():
                call.cancel()

    def _granted(self, granted: Sequence[Granted], asked: float, late: bool) -> None:
        """The jobs a claim sent at ``asked`` (monotonic) granted: each lease runs from then
        (``late``: its answer came past the lease's margin). Each is checked here, as the
        server cannot check a remote queue's jobs; then a worker's. (A claim's jobs at once:
        a busy worker takes a hundred a call, and what they share is looked up once.)"""
        claimed = self._held_ok
        if claimed is None:
            claimed = self._held_ok = asyncio.get_running_loop().create_future()
            claimed.set_result(ClaimResult.CLAIMED)
        lease_end = asked + self._lease_s
        stopping = self._stop.is_set()
        checks, registry = self._checks, self.registry
        held, leased, by_claim = self._held, self._leased, self._by_claim
        waiters, ready = self._waiters, self._ready
        self.stats["claimed"] += len(granted)
        for g in granted:
            job = job_of(g.job)
            a = Attempt(g.token, job, Claim(job, claimed), lease_end)
            if late:  # a late answer:
                self._progressed.add(a)  # renewed with the next progress beat, not a lease
                self._beat_now.set()  # third later (its lease ran from the claim's sending)
            held[a.token] = leased[a.token] = a
            by_claim[id(a.claim)] = a
            if stopping or job.cancel_requested_at is not None:
                self._decide(a, ReleaseIn())  # given back: no attempt (cancelled, if asked)
                continue
            check = checks.get(job.kind)
            if check is None:
                if job.kind not in registry:  # (not asked for: a server that ignored ``kinds``)
                    self._decide(a, ReleaseIn())
                    continue
                check = checks[job.kind] = registry.get(job.kind).validate
            try:
                check(job.args)
            except ValidationError as exc:  # arguments that can never be its handler's: final
                self._decide(a, failure(f"invalid job: {exc}", retry=False))
                continue
            except Exception as exc:  # a validator's own fault (a hint that never resolves):
                log.error("job %s (%s): its arguments could not be checked: %s", job.id,
                          job.kind, describe(exc))  # fmt: skip
                self._decide(a, failure(f"its arguments could not be checked: {describe(exc)}"))
                continue
            while waiters:
                waiter = waiters.popleft()
                if not waiter.done():
                    waiter.set_result(a)
                    break
            else:
                ready.append(a)

    # -- the pool's verbs (``sqlq.runtime.holding.Holding``) --------------------------------

    async def next(self) -> Claim:
        """The next claim granted and still held (a cancel or a fence may come first);
        after the stop, none: what no worker took by then is given back, not started."""
        while True:
            if self._ready and not self._stop.is_set():
                a = self._ready.popleft()
            else:
                waiter: asyncio.Future[Attempt] = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                try:
                    a = await waiter
                except asyncio.CancelledError:
                    if waiter.done() and not waiter.cancelled():  # it came as this stopped
                        if self._stop.is_set():
                            self._decide(waiter.result(), ReleaseIn())  # (no one takes it now)
                        else:
                            self._ready.appendleft(waiter.result())
                    raise
            if not a.over:
                return a.claim

    def _of(self, claim: Claim) -> Attempt | None:
        a = self._by_claim.get(id(claim))
        return None if a is None or a.over else a

    def completed(self, claim: Claim, result: JSON, spawn: Sequence[JSON] | None = None) -> None:
        if (a := self._of(claim)) is not None:
            self._decide(a, CompleteIn(result=result, spawn=None if spawn is None else list(spawn)))

    def failed(self, claim: Claim, failure: Failure) -> None:
        if (a := self._of(claim)) is not None:
            self._decide(a, failed_with(failure))

    def hung(self, claim: Claim, failure: Failure) -> None:
        if (a := self._of(claim)) is not None:
            self.stats["cut_off"] += 1
            self._decide(a, failed_with(failure))

    def snoozed(self, claim: Claim, delay_s: float) -> None:
        if (a := self._of(claim)) is not None:
            self._decide(a, SnoozeIn(delay_s=delay_s))

    def rate_limited(self, claim: Claim, after_s: float) -> None:
        """(A remote queue keeps no per-key rate yet: the snooze that follows is all.)"""

    def given_back(self, claim: Claim) -> None:
        if (a := self._of(claim)) is not None:
            self._decide(a, ReleaseIn())

    @property
    def leased(self) -> bool:
        return True

    @property
    def lease_s(self) -> float:
        return self._lease_s

    def expires(self, claim: Claim) -> float | None:
        a = self._of(claim)
        return None if a is None else stop_before(a.lease_end, self._lease_s)

    def lost(self, claim: Claim) -> None:
        """Its lease ran out unrenewed, or the server fenced it: nothing is reported."""
        if (a := self._of(claim)) is not None:
            self.stats["fenced" if a.fenced_by_server else "lease_lost"] += 1
            self._fence(a)

    def _decide(self, a: Attempt, what: What) -> None:
        """``a``'s end is ``what``: its slot is free, and the outbox delivers it."""
        if a.over:
            return
        a.decide(what)
        self._done(a)
        self._outbox.put(a)

    def _fence(self, a: Attempt) -> None:
        """``a`` is no longer this worker's: nothing of it is reported."""
        if a.over:
            return
        a.fenced()
        self._done(a)
        self._leased.pop(a.token, None)
        self._by_claim.pop(id(a.claim), None)

    def _done(self, a: Attempt) -> None:
        self._held.pop(a.token, None)
        self._progressed.discard(a)
        self._room.set()

    # -- the context's channel (``sqlq.runtime.context.Channel``) ---------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    def progressed(self, claim: Claim) -> None:
        a = self._of(claim)
        if a is None:
            return
        if not self._progressed:
            self._beat_now.set()
        self._progressed.add(a)

    async def parents(self, claim: Claim, start: int) -> ParentsPage:
        """``Holding.parents`` over ``POST /claims/parents``, fenced on the claim's token."""
        a = self._of(claim)
        if a is None:
            raise AttemptFenced("this attempt is over")
        try:
            return await self.client.parents(a.token, start)
        except FencedError:
            self._fenced(a)
            raise AttemptFenced("the server fenced this attempt's claim") from None

    def save(self, claim: Claim, data: Any) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        fut.add_done_callback(_retrieve)
        a = self._of(claim)
        if a is None:
            fut.set_exception(AttemptFenced("this attempt is over"))
            return fut
        before, a.saving = a.saving, fut
        task = loop.create_task(self._save(a, data, fut, before))
        self._saves.add(task)
        task.add_done_callback(self._saves.discard)
        return fut

    async def _save(self, a: Attempt, data: Any, fut: asyncio.Future[None],
                    before: asyncio.Future[None] | None) -> None:  # fmt: skip
        if before is not None:  # one attempt's checkpoints land in the order made
            await asyncio.wait({before})
        failures = 0
        while not fut.done():
            try:
                await self.client.checkpoint(a.token, data)
            except FencedError:
                fut.set_exception(AttemptFenced("the server fenced this attempt's checkpoint"))
                self._fenced(a)
            except Invalid as exc:
                fut.set_exception(ValueError(f"checkpoint refused: {exc.message or exc}"))
            except RETRYABLE as exc:
                failures += 1
                delay = self._backoff.delay(failures, self._rng)
                log.warning("could not save a checkpoint of job %s (%s); again in %.1f s",
                            a.job.id, exc, delay)  # fmt: skip
                await self._clock.sleep(delay)
            except ApiError as exc:
                fut.set_exception(AttemptFenced(f"checkpoint refused: {exc}"))
            else:
                fut.set_result(None)

    # -- heartbeats -------------------------------------------------------------------------

    async def _beats(self) -> None:
        """One heartbeat of every lease held each ``lease_s / 3``; between them, at most
        every ``progress_every_s``, one of the items with new progress."""
        period = self._lease_s / 3
        clock = self._clock
        full_at = clock.monotonic() + period
        progress_at = clock.monotonic()
        failures = 0
        while True:
            now = clock.monotonic()
            due = min(full_at, max(progress_at, now) if self._progressed else full_at)
            if due > now:
                self._beat_now.clear()
                await wait_event(clock, self._beat_now, due - now)
                continue
            full = now >= full_at
            attempts = list(self._leased.values()) if full else list(self._progressed)
            if not attempts:
                full_at, progress_at = (now + period if full else full_at), now
                continue
            try:
                await self._beat(attempts)
            except RETRYABLE as exc:
                failures += 1
                delay = min(period, self._backoff.delay(failures, self._rng))
                log.warning("could not renew %d leases (%s); again in %.1f s", len(attempts),
                            exc, delay)  # fmt: skip
                if full:
                    full_at = now + delay
                progress_at = now + delay
                continue
            except Exception as exc:  # refused (a 4xx), or an answer it cannot read
                if isinstance(exc, ApiError):
                    log.error("the server refused a heartbeat: %s", exc)
                else:
                    log.exception("a heartbeat failed")
                failures += 1
                full_at = progress_at = now + min(period, self._backoff.delay(failures, self._rng))
                continue
            failures = 0
            if full:
                full_at = now + period
            progress_at = now + self.progress_every_s

    async def _beat(self, attempts: Sequence[Attempt]) -> None:
        """One heartbeat of ``attempts``, with the progress each has not sent; its answers
        applied (a cancel asked for, a fence, the lease's new end)."""
        for chunk in range(0, len(attempts), MAX_ITEMS):
            part = attempts[chunk : chunk + MAX_ITEMS]
            items: list[BeatItem] = []
            carried: list[Attempt] = []
            for a in part:
                p = a.new_progress()
                a.claim.armed = False  # the next report arms again (``JobContext.progress``)
                if p is not None:
                    a.sent = p
                    carried.append(a)
                    self._progressed.discard(a)
                shown = None if p is None else ProgressIn(percent=p.percent, message=p.message)
                items.append(BeatItem(token=a.token, progress=shown))
            sent_at = self._clock.monotonic()
            self.stats["heartbeats"] += 1
            try:
                beats = await self.client.heartbeat(items)
            except BaseException:
                for a in carried:  # not sent after all: the next heartbeat carries it
                    a.sent = None
                    if not a.over:
                        self._progressed.add(a)
                raise
            by_token = {a.token: a for a in part}
            for beat in beats:
                held = by_token.get(beat.token)
                if held is not None:
                    self._answer(held, beat, sent_at)

    def _answer(self, a: Attempt, beat: Beat, sent_at: float) -> None:
        if beat.error == FENCED:
            if not a.over:  # (one over is the outbox's: its answer says what happened)
                self._fenced(a)
            return
        if beat.error is not None:
            log.error("job %s: the server refused its heartbeat (%s)", a.job.id, beat.error)
            return
        a.lease_end = sent_at + self._lease_s
        if beat.cancel_requested and not a.over:
            if not self._attempts.interrupt(a.job.id, None):  # not started: given back
                self._decide(a, ReleaseIn())

    def _fenced(self, a: Attempt) -> None:
        """The server fenced ``a``: its attempt is cut at once (``lose``), reporting
        nothing; one no worker took yet is just dropped."""
        a.fenced_by_server = True
        if not self._attempts.lose(a.claim, FENCED_REASON):
            self.stats["fenced"] += 1
            self._fence(a)
        log.warning("job %s (%s) fenced: its claim is no longer this worker's; dropped",
                    a.job.id, a.job.kind)  # fmt: skip

    async def _flush(self, batch: list[Attempt]) -> None:
        """Before outcomes go: the progress their attempts reported since the last beat."""
        late = [a for a in batch if a.new_progress() is not None]
        if late:
            await self._beat(late)

    # -- the outbox's answers ---------------------------------------------------------------

    def _answered(self, a: Attempt, answer: Reported | None) -> None:
        self._leased.pop(a.token, None)
        self._by_claim.pop(id(a.claim), None)
        job, what = a.job, a.what
        if answer is None:
            self.stats["undelivered"] += 1
            return
        if answer.error is not None:
            self.stats["fenced"] += 1
            log.warning("job %s (%s) %s: not recorded, %s", job.id, job.kind,
                        describe_what(what) if what else "?", answer.error)  # fmt: skip
            return
        self.stats[_COUNTED.get(type(what), "failed")] += 1
        if log.isEnabledFor(logging.DEBUG):  # (every job: its words only when asked for)
            log.debug("job %s (%s) %s -> %s", job.id, job.kind,
                      describe_what(what) if what else "?", answer.state)  # fmt: skip


_COUNTED: dict[type[Any], str] = {CompleteIn: "completed", SnoozeIn: "snoozed",
                                  ReleaseIn: "released"}  # fmt: skip


def _retrieve(fut: asyncio.Future[None]) -> None:
    """A checkpoint nobody awaited: its error is the handler's to ignore, not the loop's."""
    if not fut.cancelled():
        fut.exception()
