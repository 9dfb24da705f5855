"""``Ticker``: the evaluator, one task per ``Service``, that turns due ticks into jobs.

It sleeps, on the injected clock, until the earliest next tick among the unpaused
schedules (no polling while idle; ``Schedules`` wakes it at once on every change
it makes), then carries out ``ticks.plan`` for each due schedule as commits: one
``[AdvanceSchedule(job=J.id), J]`` per enqueued tick, and an ``AdvanceSchedule``
with no job to pass the skipped ticks over. The advance is a compare-and-set on
the schedule's version and cursor, so of any number of evaluators (two nodes, or
a restart racing an old process's last commit) exactly one moves the cursor past
a tick, and its job is in the same atomic commit: a tick is never lost (the
cursor does not move without its job) nor doubled (the loser's commit inserts
nothing; the tick's idempotency key is the second guard). A loser re-reads the
schedule and goes on from where the winner left it.

The same code runs in local and shared mode. In local mode this process is the
store's only writer, so the schedule list is read once at start and then kept by
``Schedules``' own changes. In shared mode (PostgreSQL) other nodes create,
change and delete schedules this node would not hear of, so the list is read
again every ``reread_s`` (and a schedule whose advance fails is read again at
once): a new schedule from another node is evaluated here within that interval,
though the node that made it evaluates it from the start anyway.
"""

from __future__ import annotations

import asyncio
import logging
import math

from sqlq.common.clock import Clock, wait_event
from sqlq.common.errors import DuplicateKeyError, OverlapError, StaleScheduleError, StoreError
from sqlq.common.models import LIVE, Job
from sqlq.common.schedule import AdvanceSchedule, CatchUp, Overlap, Schedule, fold, tick_key
from sqlq.common.store import JobStore
from sqlq.runtime.claims import Claims
from sqlq.runtime.events import Event, Events
from sqlq.runtime.kinds import Registry
from sqlq.runtime.schedules import Schedules

log = logging.getLogger(__name__)

SHARED_REREAD_S = 5.0  # shared mode: how often the schedule list is read again
RETRY_S = 1.0  # after a store error: wait this long before evaluating again
MAX_ROUNDS = 10  # re-reads of one schedule per evaluation (each one means it changed)
CONCURRENCY = 64  # schedules evaluated at once: their ticks share group-commit batches


class Ticker:
    def __init__(
        self,
        store: JobStore,
        claims: Claims,
        schedules: Schedules,
        kinds: Registry,
        events: Events,
        clock: Clock,
        *,
        shared: bool,
        reread_s: float = SHARED_REREAD_S,
    ) -> None:
        self._store = store
        self._claims = claims
        self._kinds = kinds
        self._events = events
        self._clock = clock
        self._shared = shared
        self._reread_s = reread_s
        self._known: dict[str, Schedule] = {}  # unpaused ones only
        self._next: dict[str, int] = {}  # name -> its next tick after its cursor
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.stale = 0  # advances refused: another evaluator won, or the schedule changed
        self.second_guard = 0  # ticks the idempotency key refused after the cursor let them by
        schedules.on_change = self.changed
        self._listed = schedules.listed

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="sqlq-schedules")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def changed(self, name: str, schedule: Schedule | None) -> None:
        """``Schedules`` committed a change to ``name`` (None: deleted): wake up."""
        self._remember(name, schedule)
        self._wake.set()

    def _remember(self, name: str, schedule: Schedule | None) -> None:
        if schedule is None or schedule.spec.paused:
            self._known.pop(name, None)
            self._next.pop(name, None)
        else:
            from sqlq.common import ticks  # the cron parser: loaded once there is a schedule

            known = self._known.get(name)
            self._known[name] = schedule
            if (
                known is not None
                and name in self._next
                and (known.version, known.cursor) == (schedule.version, schedule.cursor)
            ):
                return  # unchanged (a shared-mode re-read): no next_tick for each of 10,000
            self._next[name] = ticks.next_tick(schedule.spec, schedule.cursor)

    def next_at(self) -> float | None:
        """When the earliest tick of an unpaused schedule falls (None: none is due ever)."""
        return min(self._next.values(), default=None)

    async def _run(self) -> None:
        reread_at = -math.inf
        while True:
            try:
                if self._clock.monotonic() >= reread_at:
                    await self._reread()
                    reread_at = self._clock.monotonic() + (
                        self._reread_s if self._shared else math.inf
                    )
                self._wake.clear()
                await self._evaluate_due(self._clock.time())
            except StoreError as exc:
                log.error("schedules: evaluation failed, again in %.0f s: %s", RETRY_S, exc)
                await self._clock.sleep(RETRY_S)
                continue
            earliest = self.next_at()
            wait = math.inf if earliest is None else earliest - self._clock.time()
            if self._shared:
                wait = min(wait, max(0.0, reread_at - self._clock.monotonic()))
            if wait > 0:
                await wait_event(self._clock, self._wake, min(wait, 1e9))

    async def _reread(self) -> None:
        listed = await self._store.list_schedules()
        self._listed(listed)
        for name in set(self._known) - {s.name for s in listed}:
            self._remember(name, None)
            self._events.schedule_gone(name)
        for schedule in listed:
            self._remember(schedule.name, schedule)

    async def _evaluate_due(self, now: float) -> None:
        """Every schedule due at ``now``, up to ``CONCURRENCY`` at a time, so that their
        commits share group-commit batches, and each judged against this round's ``now``:
        one after another, 10,000 schedules due at one minute took longer than
        ``ticks.ON_TIME_S``, and those evaluated last were judged missed. A store's failure
        is raised once they have all been tried."""
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(name: str) -> None:
            async with gate:
                await self._evaluate_one(name, now)

        due = [n for n, at in self._next.items() if at <= now]
        outcomes = await asyncio.gather(*(one(n) for n in due), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    async def _evaluate_one(self, name: str, now: float) -> None:
        """``_evaluate``, with anything but a store's failure kept to this schedule: a spec
        whose args the kind now refuses (a deploy changed it, or --fault-injection is off)
        must not stop every other schedule's ticks. It is logged and tried again later."""
        try:
            await self._evaluate(name, now)
        except StoreError:
            raise
        except Exception:
            log.exception("schedule %s: its tick failed; again in %.0f s", name, RETRY_S)
            if name in self._next:
                self._next[name] = int(self._clock.time() + RETRY_S)

    async def _evaluate(self, name: str, now: float) -> None:
        """Carry out the plan of ``name``'s due ticks; a stale read is read again."""
        schedule = self._known.get(name)
        for _ in range(MAX_ROUNDS):
            if schedule is None or schedule.spec.paused:
                return  # changed while the others were evaluated
            try:
                schedule = await self._carry_out(schedule, now)
                self._remember(name, schedule)
                return
            except (StaleScheduleError, OverlapError) as exc:
                self.stale += isinstance(exc, StaleScheduleError)
                schedule = await self._store.get_schedule(name)
                self._remember(name, schedule)
        log.warning("schedule %s: changed %d times while evaluated; again in %.0f s",
                    name, MAX_ROUNDS, RETRY_S)  # fmt: skip
        if name in self._next:  # not at once: that would spin while it keeps changing
            self._next[name] = int(self._clock.time() + RETRY_S)

    async def _carry_out(self, schedule: Schedule, now: float) -> Schedule:
        """Enqueue and pass over what ``ticks.plan`` says, one commit at a time; the schedule
        as it then stands. A refused commit (Stale, Overlap) leaves the earlier ones done."""
        from sqlq.common import ticks

        spec = schedule.spec
        if spec.catch_up == CatchUp.ALL and spec.cron is not None and spec.max_catch_up > 200:
            # Up to max_catch_up ticks walked back (a */n hour field minute by minute): up
            # to seconds of CPU, which must not be the event loop's.
            plan = await asyncio.to_thread(ticks.plan, spec, schedule.cursor, now)
        else:
            plan = ticks.plan(spec, schedule.cursor, now)
        skipped = plan.skipped  # counted once the commit that passes them over is durable
        for tick in plan.enqueue:
            schedule, made = await self._tick(schedule, tick)
            self._events.schedule_skipped(schedule.name, skipped + (not made))
            skipped = 0
        if schedule.cursor < plan.cursor:
            schedule = await self._advance(schedule, plan.cursor, None, None)
        self._events.schedule_skipped(schedule.name, skipped)
        return schedule

    async def _tick(self, schedule: Schedule, tick: int) -> tuple[Schedule, bool]:
        """Enqueue ``tick``'s job (True), or pass it over for overlap ``skip`` (False)."""
        spec = schedule.spec
        idle = None
        if spec.overlap == Overlap.SKIP and schedule.last_job is not None:
            previous = await self._store.get(schedule.last_job)
            if previous is not None and previous.state in LIVE:
                return await self._advance(schedule, tick, None, None), False
            idle = schedule.last_job  # checked again inside the commit
        now = self._clock.time()
        kind = self._kinds.get(spec.kind) if spec.kind in self._kinds else None
        args = spec.args if kind is None else kind.validate(spec.args)
        job = Job.new(kind=spec.kind, args=args, now=now, ready_at=float(tick),
                      max_attempts=spec.max_attempts, priority=spec.priority, queue=spec.queue,
                      idempotency_key=tick_key(schedule.name, tick))  # fmt: skip
        try:
            schedule = await self._advance(schedule, tick, job, idle)
        except DuplicateKeyError:  # the tick has its job already (the second guard)
            # Only a cursor behind its own tick's job gets here (the first guard let it by):
            # counted and logged, since a working compare-and-set never needs it.
            self.second_guard += 1
            log.warning("schedule %s: tick %d had its job already (the key caught it)",
                        schedule.name, tick)  # fmt: skip
            return await self._advance(schedule, tick, None, None), True
        self._claims.submitted([job])
        self._events.record(Event.SUBMITTED, job)
        self._events.schedule_enqueued(schedule.name, self._clock.time() - tick)
        return schedule, True

    async def _advance(
        self, schedule: Schedule, cursor: int, job: Job | None, idle: str | None
    ) -> Schedule:
        change = AdvanceSchedule(name=schedule.name, expect_version=schedule.version,
                                 expect_cursor=schedule.cursor, cursor=cursor,
                                 job=None if job is None else job.id, idle=idle)  # fmt: skip
        await self._store.commit([change] if job is None else [change, job])
        after = fold(schedule, change)
        assert after is not None
        return after
