"""What the schedule tests of the runtime share: a memory store a second service may open
(a restart, or a second node), and reading a schedule's jobs and cursor from it."""

from __future__ import annotations

from typing import Any

import msgspec

from sqlq.common.clock import FakeClock
from sqlq.common.engine.memory import MemoryStore
from sqlq.common.models import Job, State
from sqlq.common.schedule import ScheduleSpec, schedule_of
from sqlq.common.store import MAX_PAGE, JobQuery, JobStore, Recovery
from sqlq.runtime.service import Service
from tests.helpers import ServiceFactory, wait_for


class Reopenable(MemoryStore):
    """A memory store that a second ``Service`` may open again (a restart, or a second
    node sharing it): the jobs and schedules stay, the live ones are recovered."""

    opens = 0  # services that have it open: it closes when the last one closes it

    async def open(self) -> Recovery:
        self.opens += 1
        if not self._opened_once:
            return await super().open()
        self._open = True
        live = [j for j in self._index.jobs.values() if not j.terminal]
        running = [j.id for j in live if j.state is State.RUNNING]
        return Recovery(jobs=live, running=running, records=0)

    async def close(self) -> None:
        self.opens -= 1
        if self.opens <= 0:
            await super().close()


class SharedMemory(Reopenable):
    shared = True  # what a PostgreSQL store says: other nodes change its schedules


def spec_of(**fields: Any) -> ScheduleSpec:
    """A spec as a ``PUT`` body decodes to (enums as enums, bounds checked)."""
    return msgspec.convert(fields, ScheduleSpec)


def every(seconds: int = 1, **spec: Any) -> ScheduleSpec:
    return spec_of(kind="sleep", every_s=seconds, **spec)


async def jobs_of(store: JobStore, name: str) -> list[Job]:
    """``name``'s jobs, as a listing filtered on the schedule gives them (open or not)."""
    was_open = store._open  # type: ignore[attr-defined]
    store._open = True  # type: ignore[attr-defined]
    try:
        return await store.list_jobs(JobQuery(schedule=name, limit=MAX_PAGE))
    finally:
        store._open = was_open  # type: ignore[attr-defined]


async def ticks_of(store: JobStore, name: str) -> list[int]:
    """The ticks of ``name``'s jobs, sorted (a trigger's job has none)."""
    ticks = []
    for job in await jobs_of(store, name):
        made = schedule_of(job.idempotency_key)
        assert made is not None
        assert made[0] == name
        if made[1] is not None:
            assert job.ready_at == made[1]
            ticks.append(made[1])
    return sorted(ticks)


async def cursor_of(store: JobStore, name: str) -> int:
    schedule = store._index.schedules.get(name)  # type: ignore[attr-defined]
    assert schedule is not None
    return int(schedule.cursor)


async def jobs_at_least(store: JobStore, name: str, n: int) -> None:
    async def enough() -> bool:
        return len(await ticks_of(store, name)) >= n

    await wait_for(enough, what=f"{n} jobs of {name}")


def start(services: ServiceFactory, clock: FakeClock, store: JobStore, **config: Any) -> Service:
    config.setdefault("compact_every_s", 0)  # the clock runs on: keep the finished jobs
    return services(store, clock=clock, **config)
