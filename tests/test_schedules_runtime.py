"""The runtime's schedules: the evaluator enqueues every tick once, on the fake clock.

Every test runs on the autojumping ``fake_clock``: while a test waits on a condition
the clock jumps to the next deadline (the evaluator's next tick), so a schedule
ticks as fast as the loop can go and no test waits in real time. The assertions
therefore never rely on when a wait ends, only on what the store holds: each
tick from the first to the cursor has exactly one job, and the policies' gaps
are exactly where they should be.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.models import State
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.kinds import Registry, task
from sqlq.runtime.local import LocalClaims
from sqlq.runtime.service import Service
from tests.helpers import NOW, ServiceFactory, wait_for
from tests.schedules_helpers import (
    Reopenable,
    SharedMemory,
    cursor_of,
    every,
    jobs_at_least,
    jobs_of,
    spec_of,
    start,
    ticks_of,
)


async def test_every_s_ticks_fire_once_each(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    store = Reopenable(clock=fake_clock)
    rt = start(services, fake_clock, store)
    await rt.start()
    view, created = await rt.schedules.put("tick", every(1))
    assert created
    assert view.next_at == NOW + 1
    assert view.last_job is None
    await jobs_at_least(store, "tick", 5)
    await rt.stop(0)
    ticks, cursor = await ticks_of(store, "tick"), await cursor_of(store, "tick")
    assert ticks == list(range(int(NOW) + 1, cursor + 1))  # each tick once, none missing
    assert rt.events.ticks["tick"] == [len(ticks), 0]
    assert all(j.state is State.COMPLETED for j in (await jobs_of(store, "tick"))[:-1])


@pytest.mark.parametrize("catch_up", ["latest", "all"])
async def test_after_a_3_s_downtime(
    fake_clock: FakeClock, services: ServiceFactory, catch_up: str
) -> None:
    """``latest``: exactly one catch-up job for the ticks missed; ``all``: each of them."""
    store = Reopenable(clock=fake_clock)
    first = start(services, fake_clock, store)
    await first.start()
    await first.schedules.put("s", every(1, catch_up=catch_up))
    await jobs_at_least(store, "s", 2)
    await first.stop(0)
    stopped = await cursor_of(store, "s")
    fake_clock.advance(3.5)
    second = start(services, fake_clock, store)
    await second.start()
    back = int(fake_clock.time())  # the first evaluation runs now, before the loop idles
    assert back - stopped >= 3
    await wait_for(lambda: second.events.ticks.get("s", [0, 0])[0] >= 2, what="two ticks")
    await second.stop(0)
    ticks = await ticks_of(store, "s")
    before = [t for t in ticks if t <= stopped]
    missed = [t for t in ticks if stopped < t <= back]
    after = [t for t in ticks if t > back]
    assert before == list(range(int(NOW) + 1, stopped + 1))
    if catch_up == "latest":
        assert missed == [back]  # the one catch-up job: the newest missed tick
        assert second.events.ticks["s"][1] == back - stopped - 1
    else:
        assert missed == list(range(stopped + 1, back + 1))
        assert second.events.ticks["s"][1] == 0
    assert after == list(range(back + 1, await cursor_of(store, "s") + 1))


async def test_a_restart_between_two_ticks_loses_and_doubles_nothing(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    store = Reopenable(clock=fake_clock)
    for round in range(3):
        rt = start(services, fake_clock, store)
        await rt.start()
        if round == 0:
            await rt.schedules.put("r", every(1, catch_up="all"))
        await jobs_at_least(store, "r", 3 * (round + 1))
        fake_clock.advance(0.5)  # stop between two ticks
        await rt.stop(0)
    ticks = await ticks_of(store, "r")
    assert ticks == list(range(int(NOW) + 1, await cursor_of(store, "r") + 1))


async def test_overlap_skip_passes_ticks_over_while_the_last_job_is_live(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    registry = Registry()
    release = asyncio.Event()

    @task(registry=registry)
    async def slow(args: Any) -> Any:
        await release.wait()

    store = Reopenable(clock=fake_clock)
    rt = start(services, fake_clock, store, kinds=registry)
    await rt.start()
    await rt.schedules.put("o", spec_of(kind="slow", every_s=1, overlap="skip"))
    await wait_for(lambda: rt.events.ticks.get("o", [0, 0])[1] >= 3, what="3 skipped ticks")
    assert len(await ticks_of(store, "o")) == 1  # the first job still runs: nothing else
    release.set()
    await jobs_at_least(store, "o", 3)
    await rt.stop(0)
    ticks, cursor = await ticks_of(store, "o"), await cursor_of(store, "o")
    enqueued, skipped = rt.events.ticks["o"]
    assert enqueued == len(ticks)
    assert enqueued + skipped == cursor - int(NOW)
    assert ticks[1] - ticks[0] >= 4  # the skipped ticks made no job


async def test_pause_and_resume(fake_clock: FakeClock, services: ServiceFactory) -> None:
    store = Reopenable(clock=fake_clock)
    rt = start(services, fake_clock, store)
    await rt.start()
    await rt.schedules.put("p", every(1))
    await jobs_at_least(store, "p", 2)
    view = await rt.schedules.pause("p")
    assert view is not None
    assert view.spec.paused
    assert view.next_at is None
    made = await ticks_of(store, "p")
    paused_at = await cursor_of(store, "p")
    await fake_clock.sleep(10)  # ten seconds of ticks while paused
    assert await ticks_of(store, "p") == made
    view = await rt.schedules.resume("p")
    resumed = int(fake_clock.time())
    assert view is not None
    assert not view.spec.paused
    assert view.next_at == resumed + 1
    assert await cursor_of(store, "p") == resumed
    assert rt.events.ticks["p"][1] == resumed - paused_at  # counted as skipped
    await jobs_at_least(store, "p", len(made) + 2)
    assert await rt.schedules.pause("nope") is None
    assert await rt.schedules.resume("nope") is None
    await rt.stop(0)
    later = [t for t in await ticks_of(store, "p") if t > paused_at]
    assert later[0] == resumed + 1  # no job for the paused ticks


async def test_two_services_on_one_store_enqueue_each_tick_once(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """Both evaluate the same schedule at the same instants; the compare-and-set on the
    cursor lets exactly one commit each tick, and the loser goes on from the winner's."""
    store = Reopenable(clock=fake_clock)
    a = start(services, fake_clock, store)
    await a.start()
    await a.schedules.put("both", every(1, catch_up="all"))
    b = start(services, fake_clock, store)
    await b.start()  # reads the schedule list at its start
    await jobs_at_least(store, "both", 8)
    await a.stop(0)
    await b.stop(0)
    ticks = await ticks_of(store, "both")
    assert ticks == list(range(int(NOW) + 1, await cursor_of(store, "both") + 1))
    enqueued = [rt.events.ticks.get("both", [0, 0])[0] for rt in (a, b)]
    assert sum(enqueued) == len(ticks)
    assert a.ticker.stale + b.ticker.stale >= len(ticks) - 1  # the loser of (nearly) each


async def test_shared_mode_reads_other_nodes_schedules_again(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """In shared mode a node hears of a schedule another node made by reading the list
    again (every 5 s); when that node stops, this one goes on with every tick."""
    store = SharedMemory(clock=fake_clock)
    config = RuntimeConfig(compact_every_s=0)
    a = Service(store, config, claims=LocalClaims, clock=fake_clock)
    b = Service(store, config, claims=LocalClaims, clock=fake_clock)
    try:
        await a.start()
        await b.start()
        await a.schedules.put("x", every(1, catch_up="all"))
        await jobs_at_least(store, "x", 2)
        await a.stop(0)
        # However far the clock ran before the stop (the autojump loop may have run a alone
        # through many ticks), ten more ticks are b's alone.
        await jobs_at_least(store, "x", len(await ticks_of(store, "x")) + 10)
    finally:
        await a.stop(0)
        await b.stop(0)
    assert b.events.ticks["x"][0] > 0
    ticks = await ticks_of(store, "x")
    assert ticks == list(range(int(NOW) + 1, await cursor_of(store, "x") + 1))


async def test_a_cron_schedule_in_a_zone_ticks_once_a_minute(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    store = Reopenable(clock=fake_clock)
    rt = start(services, fake_clock, store)
    await rt.start()
    await rt.schedules.put("m", spec_of(kind="sleep", cron="* * * * *", tz="Europe/Berlin"))
    await jobs_at_least(store, "m", 3)
    await rt.stop(0)
    ticks = await ticks_of(store, "m")
    first = (int(NOW) // 60 + 1) * 60
    assert ticks == list(range(first, await cursor_of(store, "m") + 1, 60))


async def test_a_schedule_its_kind_refuses_does_not_stop_the_others(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """A stored spec whose args the kind now refuses (a deploy changed the kind, say)
    fails its own ticks, logged and retried; every other schedule still ticks."""
    from sqlq.common.schedule import PutSchedule, Schedule

    store = Reopenable(clock=fake_clock)
    await store.open()
    bad = Schedule(
        name="bad", spec=every(1, args={"work_ms": "soon"}), version=1, cursor=int(NOW),
        created_at=NOW, updated_at=NOW,
    )  # fmt: skip
    await store.commit([PutSchedule(schedule=bad, expect_version=0)])
    rt = start(services, fake_clock, store)
    await rt.start()
    await rt.schedules.put("good", every(1))
    await jobs_at_least(store, "good", 5)
    await rt.stop(0)
    assert await ticks_of(store, "bad") == []
