"""``sqlq.Worker``: the server's ``@task`` handlers, run out of its process, over HTTP.

    import asyncio
    from sqlq import AsyncClient, Worker
    import tasks  # registers its @task handlers

    async def main() -> None:
        async with AsyncClient("http://sqlq:8080", token=TOKEN, retries=0) as client:
            worker = Worker(client, ["images"], concurrency=16)
            await worker.run()  # until worker.stop() (``sqlq worker``: SIGTERM)

    asyncio.run(main())

The pull protocol (``sqlq.common.protocol``): it claims jobs of remote queues in
batches (``/claims``, ``max`` up to its free slots, long-polling ``wait_s``), renews the
lease of everything it holds in one heartbeat every ``lease_s / 3`` (sooner for the
items with new progress, at most every ``progress_every_s``), and reports outcomes in
batches (``/claims/outcomes``: ``sqlq.worker_outbox``).

A handler runs as it does in the server, through the runtime's own ``Executor`` and
``JobContext``: async handlers on this loop, plain ones in threads (or, with
``processes``, in worker processes: ``sqlq.runtime.processes``); the kind's ``timeout`` and
``hb_timeout`` cut an attempt off (it fails, through the server's retry policy); its
result is held to the stored-value bounds; ``Snooze`` and ``snooze()`` snooze;
``ctx.progress`` goes in the next heartbeat; ``ctx.checkpoint`` is a
``/claims/checkpoint``, durable before it returns (``ctx.checkpoint_data`` is the
claimed job's); a heartbeat that answers ``cancel_requested`` cancels an async
handler's task and sets ``ctx.cancelled`` for a plain one; one that answers ``fenced``
stops the attempt (its task cancelled, ``ctx.cancelled`` set) and nothing of it is
reported. An attempt cut off here for any reason also sets ``ctx.cancelled``: the only
way to tell a thread its work is no longer wanted.

The server unreachable (connection refused, 5xx, 429): each loop backs off on its own
(``Backoff``), the handlers go on, and every decided outcome is kept and sent again
until the server accepts it or fences it. ``stop()`` (``sqlq worker``: SIGTERM,
SIGINT): no more claims; what is claimed and not started (waiting for a process, or
claimed by a long poll that answered after the stop) is released (``/claims/release``,
no attempt counted); running attempts get ``grace_s`` to finish, and the rest fail as
interrupted (an attempt counted, as a server's stop counts it); then it waits for the
server to take every outcome, as long as their leases last. ``hurry()`` (a second
signal) cuts both waits short.

Every loop's waits are on the injected ``clock``, so the tests drive it with the fake one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import re
import socket
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from sqlq.calls import ApiError, FencedError, Invalid, RateLimited, Unavailable
from sqlq.common.clock import SYSTEM_CLOCK, Clock, wait_event
from sqlq.common.errors import ValidationError
from sqlq.common.lease import SKEW_MARGIN, stop_before
from sqlq.common.protocol import (
    DEFAULT_LEASE_S,
    FENCED,
    MAX_CLAIM,
    MAX_CLAIM_KINDS,
    MAX_ITEMS,
    Beat,
    BeatItem,
    ClaimAnswer,
    CompleteIn,
    Granted,
    Outcome,
    ProgressIn,
    ReleaseIn,
    Reported,
    SnoozeIn,
    What,
)
from sqlq.runtime.claim import Claim, ClaimResult
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.context import AttemptFenced, Snooze, describe
from sqlq.runtime.cpu import CpuPool
from sqlq.runtime.executor import Executor, build_registry
from sqlq.runtime.kinds import REGISTRY, Registry
from sqlq.runtime.processes import ChildFailed, ProcessHandlers
from sqlq.runtime.workers import Limit, overdue
from sqlq.worker_attempt import Attempt, describe_what, failure, job_of
from sqlq.worker_outbox import RETRYABLE, Backoff, Outbox

log = logging.getLogger("sqlq.worker")

DEFAULT_WAIT_S = 5.0  # a claim's long poll (an idle worker stops within it)
PROCESS_LINGER_S = 0.05  # with processes: how long a finished outcome waits for company
MAX_CLAIMS_OUT = 4  # claims in flight at once, while they come back full
IDLE_POLL_S = 1.0  # an empty claim is not repeated sooner than this
MAX_REFUSED_CARRIES = 2  # carried claims refused in a row (each for an item) end carrying
CARRIED_WITHIN_S = 2.0  # at a stop, a claim that carries outcomes (no wait) is awaited this long
HEALTH_EVERY_S = 1.0  # how often timeouts are looked for (sooner for an ``hb_timeout``)
CANCELLED_WHILE = "cancelled: a cancel was asked for while it ran"
INTERRUPTED = "interrupted: the worker stopped before it finished (--grace)"


class WorkerError(Exception):
    """The server refused this worker for good (its token, its queues): it stopped."""


class Remote(Protocol):
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

    async def outcomes(self, items: Sequence[Outcome | msgspec.Raw]) -> list[Reported]: ...


def default_name() -> str:
    """``host-pid``, in the characters a worker's name may have."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}"


class Worker:
    """Runs the registered handlers on jobs claimed from ``queues`` (module docstring).

    ``kinds``: claim only these (default: every kind this worker runs, ``@task``'s and the
    built-in ``sleep`` and ``cpu``). ``concurrency``: attempts at once (claimed ones
    waiting for a process included). ``processes``: run plain handlers in that many
    worker processes, each of which imports ``imports`` (0: in threads). ``lease_s``:
    each claim's lease (5 to 3600). ``registry``: the kinds, if not ``@task``'s (worker
    processes always run ``@task``'s)."""

    def __init__(
        self,
        client: Remote,
        queues: Sequence[str] = ("default",),
        *,
        name: str | None = None,
        kinds: Sequence[str] | None = None,
        registry: Registry | None = None,
        imports: Sequence[str] = (),
        concurrency: int = 10,
        processes: int = 0,
        lease_s: float = DEFAULT_LEASE_S,
        grace_s: float = 10.0,
        wait_s: float = DEFAULT_WAIT_S,
        progress_every_s: float = 1.0,
        hb_timeout_s: float = RuntimeConfig.hb_timeout_s,
        fault_injection: bool = False,
        backoff: Backoff | None = None,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
    ) -> None:
        if not queues:
            raise ValueError("queues: name at least one")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if processes < 0 or processes > concurrency:
            raise ValueError(f"processes must be 0 to concurrency ({concurrency})")
        self.client = client
        self.queues = list(queues)
        self.name = name or default_name()
        self.concurrency = concurrency
        self.lease_s = lease_s
        self.grace_s = grace_s
        # A lease counts from when its claim was sent (``common.lease``): a long poll that
        # answers late leaves less of it, so it waits at most half a lease.
        self.wait_s = min(wait_s, lease_s / 2)
        self.progress_every_s = progress_every_s
        self._clock = clock
        self._rng = rng or random.Random()
        self._backoff = backoff or Backoff()
        self._cpu = CpuPool(processes or None)
        self.registry = build_registry(registry or REGISTRY, fault_injection=fault_injection,
                                       cpu=self._cpu)  # fmt: skip
        runs = self.registry.names()
        if kinds is not None:
            unknown = [k for k in kinds if k not in self.registry]
            if unknown:
                raise ValueError(f"kinds: no handler for {', '.join(unknown)}; known: "
                                 f"{', '.join(runs)}")  # fmt: skip
        self.kinds = list(kinds) if kinds else runs
        if len(self.kinds) > MAX_CLAIM_KINDS:
            raise ValueError(f"kinds: a claim names at most {MAX_CLAIM_KINDS}; name them")
        config = RuntimeConfig(workers=concurrency, hb_timeout_s=hb_timeout_s)
        self._executor = Executor(self.registry, config, rng=self._rng, clock=clock)
        self._procs = ProcessHandlers(processes, imports) if processes else None
        # With processes, jobs finish one by one: claiming a slot at a time would be a
        # claim per job. So it claims once half the spare slots are free (the other half
        # keep the processes busy meanwhile), and lets outcomes gather for a moment.
        self._processes = processes
        self._refill = max(1, (concurrency - processes) // 2) if processes else 1
        self._outbox = Outbox(client, clock=clock, rng=self._rng, backoff=self._backoff,
                              answered=self._answered, before=self._flush,
                              linger_s=PROCESS_LINGER_S if processes else 0.0)  # fmt: skip
        self._loop: asyncio.AbstractEventLoop | None = None
        self._held: dict[str, Attempt] = {}  # claimed, outcome not decided: takes a slot
        self._leased: dict[str, Attempt] = {}  # claimed, outcome not answered: heartbeated
        self._by_claim: dict[int, Attempt] = {}  # id(claim) -> its attempt (the channel's)
        self._running: set[Attempt] = set()  # started (a context made), not over
        self._progressed: set[Attempt] = set()  # new progress, not yet in a heartbeat
        self._room = asyncio.Event()  # a slot freed, or stopping
        self._beat_now = asyncio.Event()
        self._busy = asyncio.Event()  # something runs: the health loop looks
        self._idle = asyncio.Event()  # nothing holds a slot
        self._stop = asyncio.Event()
        self._hurry = asyncio.Event()
        self._stop_at: float | None = None
        self._asked = 0  # slots the claims out now ask for
        self._draining = False  # the latest claim came back full
        self._carry = True  # claims may carry outcomes (until the server refuses that)
        self._refused_carries = 0  # carried claims refused for an item, in a row
        self._claim_after = 0.0  # monotonic: no new claim before (a backoff)
        self._claim_failures = 0
        self._saves: set[asyncio.Task[None]] = set()  # checkpoints being written
        self._claims_out: set[asyncio.Event] = set()  # each set when its claim answers
        self._fatal: ApiError | None = None
        self.stats: dict[str, int] = dict.fromkeys(
            ("claimed", "completed", "failed", "snoozed", "released", "fenced", "cut_off",
             "lease_lost", "claims", "heartbeats", "undelivered"), 0)  # fmt: skip

    # -- lifecycle --------------------------------------------------------------------------

    def stop(self) -> None:
        """Claim no more; finish within ``grace_s``; release the rest (signal-safe). A
        claim long-polling at the stop is waited for (its jobs are released), within the
        grace: an idle worker stops within ``min(wait_s, grace_s)``."""
        if self._stop_at is None:
            self._stop_at = self._clock.monotonic()
        self._stop.set()
        self._room.set()

    def hurry(self) -> None:
        """Cut the grace and the wait for outcomes short (a second signal)."""
        self.stop()
        self._hurry.set()
        for answered in self._claims_out:  # a claim in flight is not waited for
            answered.set()
        self._outbox.hurry()

    @property
    def held(self) -> int:
        """Claims holding a slot now."""
        return len(self._held)

    def pids(self) -> list[int]:
        """The worker processes' ids (``processes``), this one's if none."""
        return self._procs.pids() if self._procs is not None else [os.getpid()]

    async def run(self) -> None:
        """Claim and run until ``stop()``; then wind down. ``WorkerError`` if the server
        refused this worker (a bad token, a queue that is not remote)."""
        self._loop = asyncio.get_running_loop()
        background: list[asyncio.Task[None]] = []
        try:
            if self._procs is not None:
                await self._procs.start()
            background = [
                asyncio.create_task(self._beats(), name="sqlq-worker-beats"),
                asyncio.create_task(self._outbox.run(), name="sqlq-worker-outcomes"),
                asyncio.create_task(self._health(), name="sqlq-worker-health"),
            ]
            await self._claims()
            await self._wind_down()
        finally:
            for t in background:
                t.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            for a in list(self._held.values()):
                if a.task is not None:
                    a.task.cancel()
            if self._procs is not None:
                await self._procs.close()
            self._cpu.shutdown()
            self._executor.shutdown()
        if self._fatal is not None:
            raise WorkerError(str(self._fatal)) from self._fatal

    # -- claiming ---------------------------------------------------------------------------

    async def _claims(self) -> None:
        """Keep claims out for the free slots: one while the queue looks empty (it
        long-polls), up to ``MAX_CLAIMS_OUT`` while claims come back full, so a busy
        queue's claims overlap (and the server commits them together) instead of
        waiting on each other's round trip."""
        out: set[asyncio.Task[None]] = set()
        while not self._stop.is_set():
            now = self._clock.monotonic()
            if now < self._claim_after:  # a backoff, or an empty answer that came at once
                await wait_event(self._clock, self._stop, self._claim_after - now)
                continue
            spare = self.concurrency - len(self._held) - self._asked
            wanted = spare > 0 and (spare >= self._refill or
                                    len(self._held) + self._asked < self._processes)  # fmt: skip
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
        if out:  # each waits (within the grace) for its answer, whose jobs are released
            await asyncio.gather(*out, return_exceptions=True)

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
                self._fatal = exc
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
            self._fatal = exc
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
        for g in granted:
            self._start(g, asked)
        if not granted and not carried:  # a long poll that came back at once: not a spin
            self._claim_after = max(self._claim_after, asked + IDLE_POLL_S)

    async def _claim(
        self, n: int, carried: list[Attempt]
    ) -> tuple[list[Granted], Sequence[Reported] | None]:
        """One claim (with the outcomes it carries: then it does not wait), and the
        carried outcomes' answers; after a stop, it is waited for (to release what it
        got) until the grace runs out (one that carries outcomes ``CARRIED_WITHIN_S`` more,
        even in a hurry), then abandoned (the server gives back what a long poll claimed
        once it sees the connection gone, or the lease runs out; the outcomes go again)."""
        self.stats["claims"] += 1
        call: asyncio.Future[ClaimAnswer | list[Granted]]
        if carried:
            call = asyncio.ensure_future(self.client.report_and_claim(
                [msgspec.Raw(a.body) for a in carried], self.queues, worker=self.name,
                kinds=self.kinds, max=n, lease_s=self.lease_s))  # fmt: skip
        else:
            call = asyncio.ensure_future(self.client.claim(
                self.queues, worker=self.name, kinds=self.kinds, max=n, wait_s=self.wait_s,
                lease_s=self.lease_s))  # fmt: skip
        answered = asyncio.Event()
        call.add_done_callback(lambda _: answered.set())
        self._claims_out.add(answered)
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({call, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not call.done() and not self._hurry.is_set():
                await wait_event(self._clock, answered, max(0.0, self._grace_left() or 0.0))
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

    def _grace_left(self) -> float | None:
        if self._stop_at is None:
            return None
        return self._stop_at + self.grace_s - self._clock.monotonic()

    def _start(self, g: Granted, asked: float) -> None:
        """A job granted by a claim sent at ``asked`` (monotonic): its lease runs from then."""
        loop = asyncio.get_running_loop()
        job = job_of(g.job)
        claimed: asyncio.Future[ClaimResult] = loop.create_future()
        claimed.set_result(ClaimResult.CLAIMED)
        a = Attempt(g.token, job, Claim(job, claimed), asked + self.lease_s)
        if self._clock.monotonic() - asked > self.lease_s * SKEW_MARGIN:  # a late answer:
            self._progressed.add(a)  # renewed with the next progress beat, not a lease third
            self._beat_now.set()  # later (its lease ran from the claim's sending)
        self.stats["claimed"] += 1
        self._held[a.token] = a
        self._leased[a.token] = a
        self._by_claim[id(a.claim)] = a
        self._idle.clear()
        if self._stop.is_set():
            self._decide(a, ReleaseIn())
        elif job.cancel_requested_at is not None:  # given back: cancelled, and no attempt
            self._decide(a, ReleaseIn())
        else:
            a.task = loop.create_task(self._attempt(a), name=f"sqlq-job-{job.id}")

    # -- an attempt -------------------------------------------------------------------------

    async def _attempt(self, a: Attempt) -> None:
        job = a.job
        if job.kind not in self.registry:  # (not asked for: a server that ignored ``kinds``)
            self._decide(a, ReleaseIn())
            return
        kind = self.registry.get(job.kind)
        try:
            kind.validate(job.args)
        except ValidationError as exc:  # (the server can't check a remote queue's args)
            self._decide(a, failure(f"invalid job: {exc}", retry=False))
            return
        in_child = self._procs is not None and not kind.interruptible
        if in_child:
            assert self._procs is not None
            a.waiting = True
            try:
                a.child = await self._procs.acquire()
            except asyncio.CancelledError:
                return  # released, or cancelled (decided by whoever cancelled)
            a.waiting = False
            if a.over:  # decided while it waited (a cancel, a fence): the process is spare
                self._procs.release(a.child)
                return
        ctx = self._executor.context(job, a.claim, self)
        a.ctx = ctx
        self._running.add(a)
        self._busy.set()
        what: What
        try:
            if in_child:
                assert self._procs is not None
                result: Any = await self._procs.run(a.child, job, ctx)
            else:
                result = await self._executor.execute(job, ctx)
        except asyncio.CancelledError:
            if a.over:
                return  # cut off, fenced or stopped: decided by whoever cancelled
            if not ctx.cancel_sent:
                raise
            what = failure(CANCELLED_WHILE)
        except Snooze as s:
            what = SnoozeIn(delay_s=s.seconds)
        except AttemptFenced:
            self._fence(a)
            return
        except ChildFailed as exc:
            what = failure(str(exc))
        except Exception as exc:
            what = failure(describe(exc))
        else:
            if type(result) is Snooze:
                what = SnoozeIn(delay_s=result.seconds)
            else:
                what = CompleteIn(result=result)
        self._decide(a, what)

    def _decide(self, a: Attempt, what: What) -> None:
        """``a``'s outcome is ``what``: its slot is free, and the outbox delivers it."""
        if a.over:
            return
        a.decide(what)
        self._done(a)
        self._outbox.put(a)

    def _fence(self, a: Attempt, *, counted: bool = True) -> None:
        """``a`` is no longer this worker's: nothing of it is reported (``counted``: as
        fenced, the server said so; else its lease ran out here, counted by the caller)."""
        if a.over:
            return
        a.fenced()
        self._done(a)
        self._leased.pop(a.token, None)
        self._by_claim.pop(id(a.claim), None)
        if not counted:
            return
        self.stats["fenced"] += 1
        log.warning("job %s (%s) fenced: its claim is no longer this worker's; dropped",
                    a.job.id, a.job.kind)  # fmt: skip

    def _done(self, a: Attempt) -> None:
        self._held.pop(a.token, None)
        self._running.discard(a)
        self._progressed.discard(a)
        self._room.set()
        if not self._held:
            self._idle.set()

    def _cut(self, a: Attempt, what: What | None, *, counted: bool = True) -> None:
        """End ``a`` here (a timeout, a fence, a lease lost, the stop): decided now, its
        handler told."""
        if what is None:
            self._fence(a, counted=counted)
        else:
            self._decide(a, what)
        ctx = a.ctx
        if ctx is not None:
            ctx.cancelled = True
        if a.child is not None and self._procs is not None:
            self._procs.interrupt(a.child)
        if a.task is not None:
            a.task.cancel()  # async: it stops; a thread is abandoned; a process is told

    # -- the context's channel (``sqlq.runtime.context.Channel``) ---------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        return self._loop

    def progressed(self, claim: Claim) -> None:
        a = self._by_claim.get(id(claim))
        if a is None or a.over:
            return
        if not self._progressed:
            self._beat_now.set()
        self._progressed.add(a)

    def save(self, claim: Claim, data: Any) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        fut.add_done_callback(_retrieve)
        a = self._by_claim.get(id(claim))
        if a is None or a.over:
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
                self._fence(a)
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
        period = self.lease_s / 3
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
        items: list[BeatItem] = []
        carried: list[Attempt] = []
        for chunk in range(0, len(attempts), MAX_ITEMS):
            part = attempts[chunk : chunk + MAX_ITEMS]
            items = []
            carried = []
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
                self._cut(a, None)
            return
        if beat.error is not None:
            log.error("job %s: the server refused its heartbeat (%s)", a.job.id, beat.error)
            return
        a.lease_end = sent_at + self.lease_s
        if beat.cancel_requested and not a.over:
            self._interrupt(a)

    def _interrupt(self, a: Attempt) -> None:
        """A cancel was asked for: as the server's ``WorkerPool.interrupt`` does it."""
        ctx = a.ctx
        if ctx is None:  # claimed, not started (waiting for a process): given back now
            self._decide(a, ReleaseIn())
            if a.task is not None:
                a.task.cancel()
            return
        ctx.cancelled = True
        if a.child is not None and self._procs is not None:
            self._procs.interrupt(a.child)
        if ctx.interruptible and not ctx.cancel_sent and a.task is not None:
            ctx.cancel_sent = True
            a.task.cancel()

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
        log.info("job %s (%s) %s -> %s", job.id, job.kind,
                 describe_what(what) if what else "?", answer.state)  # fmt: skip

    # -- limits -----------------------------------------------------------------------------

    async def _health(self) -> None:
        """Cut off every attempt past its kind's ``timeout`` or ``hb_timeout``, as the
        server's health loop does: only while something runs, every second, or every
        quarter of the shortest ``hb_timeout`` running."""
        while True:
            if not self._running:
                self._busy.clear()
                await self._busy.wait()
            hbs = [a.ctx.hb_timeout for a in self._running if a.ctx and a.ctx.hb_timeout]
            every = min([HEALTH_EVERY_S, self.lease_s * SKEW_MARGIN / 2, *(hb / 4 for hb in hbs)])
            await self._clock.sleep(every)
            now = self._clock.monotonic()
            for a in list(self._running):
                ctx = a.ctx
                if ctx is None:
                    continue
                if a.child is not None and self._procs is not None:
                    ctx.last_beat = max(ctx.last_beat, self._procs.last_beat(a.child))
                past = overdue(ctx, now, stop_before(a.lease_end, self.lease_s))
                if past is None:
                    continue
                limit, reason = past
                log.warning("job %s (%s): %s; cut off", a.job.id, a.job.kind, reason)
                if limit is Limit.LEASE:  # the server may have given it to another worker
                    self.stats["lease_lost"] += 1
                    self._cut(a, None, counted=False)  # nothing reported
                else:
                    self.stats["cut_off"] += 1
                    self._cut(a, failure(reason))

    # -- the stop ---------------------------------------------------------------------------

    async def _wind_down(self) -> None:
        for a in list(self._held.values()):
            if a.waiting:  # claimed, not started: given back
                self._cut(a, ReleaseIn())
        if self._held:
            left = self._grace_left() or 0.0
            log.info("stopping: %d jobs running get %.0f s to finish", len(self._held), left)
            both = asyncio.Event()
            done = asyncio.ensure_future(self._either(both))
            await wait_event(self._clock, both, left)
            done.cancel()
        for a in list(self._held.values()):
            log.warning("job %s (%s): still running at the end of the grace; interrupted",
                        a.job.id, a.job.kind)  # fmt: skip
            self._cut(a, failure(INTERRUPTED))
        if len(self._outbox):
            owed = self._outbox.owed()
            within = max(a.lease_end for a in owed) - self._clock.monotonic()
            log.info("stopping: %d outcomes to report (for %.0f s at most)", len(owed), within)
            if not await self._outbox.drained(within):
                lost = self._outbox.owed()
                self.stats["undelivered"] += len(lost)
                log.error("stopped with %d outcomes the server never took (jobs %s); they "
                          "run again after their lease", len(lost),
                          ", ".join(a.job.id for a in lost[:10]))  # fmt: skip

    async def _either(self, both: asyncio.Event) -> None:
        """Set ``both`` once nothing runs, or at a hurry."""
        idle = asyncio.ensure_future(self._idle.wait())
        hurry = asyncio.ensure_future(self._hurry.wait())
        try:
            await asyncio.wait({idle, hurry}, return_when=asyncio.FIRST_COMPLETED)
            both.set()
        finally:
            idle.cancel()
            hurry.cancel()


_COUNTED: dict[type[Any], str] = {CompleteIn: "completed", SnoozeIn: "snoozed",
                                  ReleaseIn: "released"}  # fmt: skip


def _retrieve(fut: asyncio.Future[None]) -> None:
    """A checkpoint nobody awaited: its error is the handler's to ignore, not the loop's."""
    if not fut.cancelled():
        fut.exception()
