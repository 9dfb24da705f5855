"""The injected clock: reading, sleeping and timers, on the system clock and the fake.

The fake's promises are what every runtime test on it relies on: sleepers wake in
deadline order, a cancelled timer never fires, ``advance`` fires what is due, and
with autojump a loop with nothing to do jumps to the next deadline at once.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from sqlq.common.clock import SYSTEM_CLOCK, Clock, FakeClock
from sqlq.common.models import State
from tests.helpers import NOW, ServiceFactory, final, submit


def test_advance_fires_due_callbacks_in_deadline_order() -> None:
    clock = FakeClock(NOW)
    fired: list[tuple[str, float]] = []
    clock.call_later(5, lambda: fired.append(("b", clock.monotonic())))
    clock.call_later(1, lambda: fired.append(("a", clock.monotonic())))
    clock.call_later(9, lambda: fired.append(("c", clock.monotonic())))
    clock.advance(6)
    assert fired == [("a", 1.0), ("b", 5.0)]  # each fires with the clock at its deadline
    assert clock.monotonic() == 6.0
    assert clock.time() == NOW + 6
    clock.advance(3)
    assert [name for name, _ in fired] == ["a", "b", "c"]


def test_a_callback_arms_from_its_own_deadline() -> None:
    clock = FakeClock(NOW)
    fired: list[float] = []

    def tick() -> None:
        fired.append(clock.monotonic())
        if len(fired) < 3:
            clock.call_later(2, tick)

    clock.call_later(2, tick)
    clock.advance(10)
    assert fired == [2.0, 4.0, 6.0]


def test_cancelled_timer_never_fires() -> None:
    clock = FakeClock(NOW)
    fired: list[str] = []
    timer = clock.call_later(1, lambda: fired.append("x"))
    timer.cancel()
    clock.advance(5)
    assert fired == []
    assert clock.next_deadline() is None
    timer.cancel()  # a second cancel is a no-op


async def test_sleepers_wake_in_deadline_order() -> None:
    clock = FakeClock(NOW)
    woke: list[str] = []

    async def sleeper(name: str, s: float) -> None:
        await clock.sleep(s)
        woke.append(name)

    tasks = [asyncio.create_task(sleeper(n, s)) for n, s in (("c", 30), ("a", 10), ("b", 20))]
    await asyncio.sleep(0)
    clock.advance(15)
    await asyncio.sleep(0)
    assert woke == ["a"]
    clock.advance(100)
    await asyncio.gather(*tasks)
    assert woke == ["a", "b", "c"]


async def test_cancelling_a_sleeper_cancels_its_timer() -> None:
    clock = FakeClock(NOW)
    task = asyncio.create_task(clock.sleep(10))
    await asyncio.sleep(0)
    assert clock.next_deadline() == 10.0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert clock.next_deadline() is None


def test_autojump_fires_an_hour_long_sleep_at_once() -> None:
    clock = FakeClock(NOW, autojump=True)

    async def main() -> float:
        await clock.sleep(3600)
        return clock.monotonic()

    started = time.monotonic()
    with asyncio.Runner(loop_factory=clock.new_event_loop) as runner:
        assert runner.run(main()) == 3600.0
    assert clock.time() == NOW + 3600
    assert time.monotonic() - started < 30  # generous: a real wait would be an hour


def test_autojump_waits_for_real_io_and_threads_first() -> None:
    """A thread in the loop's executor holds the jump back: the job it runs must not
    see its timeout expire under it. Real readiness wins over the fake clock."""
    clock = FakeClock(NOW, autojump=True)
    release = threading.Event()

    async def main() -> list[str]:
        order: list[str] = []
        loop = asyncio.get_running_loop()

        async def timeout() -> None:
            await clock.sleep(5)
            order.append("timeout")

        t = asyncio.create_task(timeout())
        work = loop.run_in_executor(None, release.wait)
        loop.call_soon(release.set)
        await work
        order.append("thread")
        await t
        return order

    with asyncio.Runner(loop_factory=clock.new_event_loop) as runner:
        assert runner.run(main()) == ["thread", "timeout"]


def test_autojump_off_leaves_the_clock_alone() -> None:
    clock = FakeClock(NOW)

    async def main() -> bool:
        task = asyncio.create_task(clock.sleep(60))
        await asyncio.sleep(0.01)
        return task.done()

    with asyncio.Runner(loop_factory=clock.new_event_loop) as runner:
        assert runner.run(main()) is False
    assert clock.monotonic() == 0.0


async def test_system_clock_sleeps_and_calls_later() -> None:
    clock: Clock = SYSTEM_CLOCK
    assert abs(clock.time() - time.time()) < 5
    before = clock.monotonic()
    await clock.sleep(0)
    fired = asyncio.Event()
    clock.call_later(0, fired.set)
    await asyncio.wait_for(fired.wait(), 30)  # a bound, not a timing claim
    cancelled: list[str] = []
    clock.call_later(0, lambda: cancelled.append("x")).cancel()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert cancelled == []
    assert clock.monotonic() >= before


async def test_the_fake_clock_fixture_runs_the_test_on_its_autojump_loop(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """A job delayed an hour, on a Service on the fixture's clock: done at once."""
    rt = services(clock=fake_clock, healthcheck=False)
    await rt.start()
    job = await submit(rt, delay_ms=3_600_000)
    await fake_clock.sleep(3601)
    done = await final(rt, job.id)
    assert done.state is State.COMPLETED
    assert fake_clock.time() >= NOW + 3600


async def test_a_raising_timer_callback_is_reported_and_the_later_ones_still_fire() -> None:
    """As ``loop.call_later``'s: the loop's exception handler hears of it; nothing stops."""
    clock = FakeClock(NOW)
    loop = asyncio.get_running_loop()
    heard: list[BaseException | None] = []
    loop.set_exception_handler(lambda _loop, context: heard.append(context.get("exception")))
    fired: list[str] = []

    def boom() -> None:
        raise RuntimeError("boom")

    clock.call_later(1, boom)
    clock.call_later(2, lambda: fired.append("after"))
    try:
        clock.advance(3)
    finally:
        loop.set_exception_handler(None)
    assert fired == ["after"]
    assert len(heard) == 1
    assert isinstance(heard[0], RuntimeError)
