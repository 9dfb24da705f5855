"""``Schedules``: what the HTTP layer (and ``sqlq serve``'s code-defined schedules) change.

Every change is one ``JobStore.commit`` of a ``PutSchedule`` or ``DropSchedule``,
durable on return, fenced on the version it read: a put that meets a concurrent
change (another request, another node, the evaluator never: it only advances, and
an advance does not bump the version) reads the schedule again and retries. A put
keeps the cursor and ``last_job`` of the schedule it replaces, so replacing a spec
neither repeats a tick nor loses one; a resume (paused to not) moves the cursor to
now, because a paused schedule owes nothing for the time it was paused (those
ticks are counted as skipped, so the drop is visible in ``/metrics``).

The evaluator (``sqlq.runtime.ticker``) enqueues the ticks; this class tells it of
every change made here, so it wakes at once instead of polling.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec

from sqlq.common.clock import Clock
from sqlq.common.errors import StaleScheduleError, StoreError, ValidationError
from sqlq.common.models import JSON, Job, new_job_id
from sqlq.common.schedule import (
    MAX_SCHEDULES,
    CatchUp,
    DropSchedule,
    PutSchedule,
    Schedule,
    ScheduleSpec,
    check_name,
    check_spec,
    schedule_of,
    trigger_key,
)
from sqlq.common.store import JobStore
from sqlq.common.wire import JobRef, ScheduleView
from sqlq.runtime.events import Event, Events
from sqlq.runtime.kinds import Registry

if TYPE_CHECKING:
    from sqlq.runtime.claims import Claims
    from sqlq.runtime.submissions import Submissions

log = logging.getLogger(__name__)

PUT_ATTEMPTS = 20  # a put that keeps meeting concurrent changes gives up (StoreError)


def paused_over(spec: ScheduleSpec, cursor: int, now: float) -> int:
    """How many ticks of ``spec`` fell due in ``(cursor, now]``: those a resume passes over."""
    from sqlq.common import ticks

    skip = msgspec.structs.replace(spec, catch_up=CatchUp.SKIP)
    plan = ticks.plan(skip, cursor, now)  # which enqueues the newest if it is on time
    return plan.skipped + len(plan.enqueue)


class Schedules:
    """The schedules of one store (``service.schedules``); see the module's docstring."""

    def __init__(
        self,
        store: JobStore,
        claims: Claims,
        submissions: Submissions,
        kinds: Registry,
        events: Events,
        clock: Clock,
        get_job: Callable[[str], Awaitable[Job | None]],
    ) -> None:
        self._store = store
        self._creating = asyncio.Lock()  # MAX_SCHEDULES holds per node (not across nodes)
        self._claims = claims
        self._submissions = submissions
        self._kinds = kinds
        self._events = events
        self._clock = clock
        self._get_job = get_job
        self.on_change: Callable[[str, Schedule | None], None] = _ignore  # set by the evaluator

    # -- reads ------------------------------------------------------------------------

    async def get(self, name: str) -> ScheduleView | None:
        schedule = await self._store.get_schedule(name)
        return None if schedule is None else await self.view(schedule)

    async def list(self) -> builtins.list[ScheduleView]:
        return [await self.view(s) for s in await self._store.list_schedules()]

    async def view(self, schedule: Schedule) -> ScheduleView:
        """``schedule`` as the API shows it: when it fires next, and its newest tick's job."""
        from sqlq.common import ticks

        spec = schedule.spec
        next_at = None if spec.paused else float(ticks.next_tick(spec, schedule.cursor))
        last_tick: int | None = None
        ref: JobRef | None = None
        if schedule.last_job is not None:
            job = await self._get_job(schedule.last_job)
            ref = JobRef(id=schedule.last_job, state=None if job is None else job.state)
            made = None if job is None else schedule_of(job.idempotency_key)
            last_tick = None if made is None else made[1]
        return ScheduleView(
            name=schedule.name, spec=spec, next_at=next_at, last_tick=last_tick, last_job=ref
        )

    # -- changes ----------------------------------------------------------------------

    def check(self, name: str, spec: ScheduleSpec) -> JSON:
        """``ValidationError`` naming the field unless ``spec`` may be stored as ``name``:
        as a submission's, the kind must be registered here and accept the args."""
        check_name(name)
        check_spec(spec)
        return self._kinds.get(spec.kind).validate(spec.args)

    async def put(self, name: str, spec: ScheduleSpec) -> tuple[ScheduleView, bool]:
        """Create or replace ``name`` (durable on return): the view, and whether it is new."""
        self.check(name, spec)
        for _ in range(PUT_ATTEMPTS):
            current = await self._store.get_schedule(name)
            schedule, skipped = self._replacing(current, name, spec)
            put = PutSchedule(schedule=schedule, expect_version=_version(current))
            try:
                async with self._creating:  # this node's new schedules and names, in turn
                    if current is None:
                        await self._check_room()
                    await self._commit_naming(put, spec.queue)
            except StaleScheduleError:
                continue  # someone changed it since we read it: read again
            self._events.schedule_skipped(name, skipped)
            self._changed(name, schedule)
            return await self.view(schedule), current is None
        raise StoreError(f"schedule {name}: kept changing under {PUT_ATTEMPTS} puts; try again")

    def _replacing(
        self, current: Schedule | None, name: str, spec: ScheduleSpec
    ) -> tuple[Schedule, int]:
        """The record a put of ``spec`` stores over ``current``, and the ticks it passes over."""
        now = self._clock.time()
        if current is None:
            # The first version is the creation's millisecond, not 1: a schedule deleted and
            # made again under its name must not take up an old record's (version, cursor),
            # or an evaluator still holding the old record could advance the new one.
            schedule = Schedule(name=name, spec=spec, version=int(now * 1000), cursor=int(now),
                                created_at=now, updated_at=now)  # fmt: skip
            return schedule, 0
        cursor, skipped = current.cursor, 0
        if current.spec.paused and not spec.paused and int(now) > cursor:  # a resume
            skipped = paused_over(current.spec, cursor, now)
            cursor = int(now)
        elif _timing(current.spec) != _timing(spec):
            # New ticks start from now: the old cursor would make the new expression's ticks
            # between it and now look missed (up to max_catch_up of them under ``all``).
            cursor = max(cursor, int(now))
        schedule = msgspec.structs.replace(
            current, spec=spec, version=current.version + 1, cursor=cursor, updated_at=now
        )
        return schedule, skipped

    async def _commit_naming(self, put: PutSchedule, queue: str) -> None:
        """Commit ``put``; a queue name it adds is admitted as a submission's new name is
        (``sqlq.runtime.names``: a schedule's queue is never refused after, so its creation
        is where the cap holds) and held while the commit runs."""
        names = self._submissions.names
        new = [] if names.known(queue) else [queue]
        if new:
            names.check_new("queue", None)
            names.hold(new, None)
        try:
            await self._store.commit([put])
        finally:
            names.let_go(new)

    def _changed(self, name: str, schedule: Schedule | None) -> None:
        """``name`` is now ``schedule`` (None: gone): the names counted, and the ticker."""
        self._submissions.names.scheduled(name, None if schedule is None else schedule.spec.queue)
        self.on_change(name, schedule)

    def listed(self, schedules: Sequence[Schedule]) -> None:
        """Every schedule as the store lists it now (the ticker's read): their queues."""
        self._submissions.names.schedules_are({s.name: s.spec.queue for s in schedules})

    async def _check_room(self) -> None:
        if len(await self._store.list_schedules()) >= MAX_SCHEDULES:
            raise ValidationError("name", f"would be one more than {MAX_SCHEDULES} schedules")

    async def delete(self, name: str) -> bool:
        """Delete ``name`` (its jobs stay); False if there was none."""
        if await self._store.get_schedule(name) is None:
            return False
        await self._store.commit([DropSchedule(name=name)])
        self._events.schedule_gone(name)
        self._changed(name, None)
        return True

    async def pause(self, name: str) -> ScheduleView | None:
        return await self._set_paused(name, True)

    async def resume(self, name: str) -> ScheduleView | None:
        """Not paused any more; the ticks that fell due while paused are passed over."""
        return await self._set_paused(name, False)

    async def _set_paused(self, name: str, paused: bool) -> ScheduleView | None:
        for _ in range(PUT_ATTEMPTS):
            current = await self._store.get_schedule(name)
            if current is None:
                return None
            if current.spec.paused == paused:
                return await self.view(current)
            spec = msgspec.structs.replace(current.spec, paused=paused)
            schedule, skipped = self._replacing(current, name, spec)
            try:
                await self._store.commit(
                    [PutSchedule(schedule=schedule, expect_version=current.version)]
                )
            except StaleScheduleError:
                continue
            self._events.schedule_skipped(name, skipped)
            self._changed(name, schedule)
            return await self.view(schedule)
        raise StoreError(f"schedule {name}: kept changing under {PUT_ATTEMPTS} puts; try again")

    async def trigger(self, name: str) -> Job | None:
        """One job of ``name`` now, outside its ticks (its key: ``trigger_key``); None if
        there is no such schedule. Admitted as a submission is (``--max-queued``)."""
        schedule = await self._store.get_schedule(name)
        if schedule is None:
            return None
        spec = schedule.spec
        args = self._kinds.get(spec.kind).validate(spec.args)
        now = self._clock.time()
        job_id = new_job_id(now)
        job = Job.new(kind=spec.kind, args=args, now=now, max_attempts=spec.max_attempts,
                      priority=spec.priority, queue=spec.queue, job_id=job_id,
                      idempotency_key=trigger_key(name, job_id))  # fmt: skip
        with self._submissions.admission([job], batch=False):
            await self._store.commit([job])
        self._claims.submitted([job])
        self._events.record(Event.SUBMITTED, job)
        return job

    async def define(self, defined: Mapping[str, ScheduleSpec]) -> None:
        """Upsert the code-defined schedules (``@task(cron=...)``, ``sqlq.schedule``): create
        each one missing, replace each one whose spec differs. ``paused`` is the operator's
        once it exists (a restart does not undo a pause), and a schedule the code lacks is
        never deleted: another node's code may define it."""
        for name, spec in defined.items():
            current = await self._store.get_schedule(name)
            if current is not None:
                spec = msgspec.structs.replace(spec, paused=current.spec.paused)
                if spec == current.spec:
                    continue
            _, created = await self.put(name, spec)
            log.info("schedule %s %s from code", name, "created" if created else "replaced")


def _version(current: Schedule | None) -> int:
    return 0 if current is None else current.version


def _ignore(name: str, schedule: Schedule | None) -> None:
    pass


def _timing(spec: ScheduleSpec) -> tuple[str | None, int | None, str]:
    """What decides when a schedule's ticks fall."""
    return spec.cron, spec.every_s, spec.tz
