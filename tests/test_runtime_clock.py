"""The runtime waits on the injected clock: heartbeats, timeouts, grace and the sleep kind.

Every test here runs on the autojumping ``fake_clock``: a wait that went to the
real clock instead would take its policy's full time (minutes here) and fail the
test's bound, and a wait that went to the fake clock takes none.
"""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.engine.memory import MemoryStore
from sqlq.common.models import Job, State
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.kinds import JobContext, Registry, task
from sqlq.runtime.service import Service
from sqlq.runtime.workers import Limit, overdue
from tests.helpers import NOW, ServiceFactory, final, submit, wait_for


async def test_the_health_loop_sleeps_on_the_injected_clock(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """A minute's heartbeat timeout: the health loop looks every 15 s of the fake clock.

    Maintenance is off: the test polls in real time, and while it does the autojumping
    clock runs on past retention, where compaction would prune the dead job it reads."""
    rt = services(clock=fake_clock, hb_timeout_s=60.0, max_attempts=1, compact_every_s=0)
    await rt.start()
    job = await submit(rt, args={"hang_prob": 1.0})
    done = await final(rt, job.id)
    assert done.state is State.DEAD
    assert done.last_error == "worker hung: no heartbeat for 75000 ms"  # at the 5th look
    assert rt.stats()["workers"]["timed_out"] == 0


async def test_a_timeout_cuts_an_attempt_off_on_the_injected_clock(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    registry = Registry()

    @task(registry=registry, timeout=600.0)
    async def stuck(args: Any) -> Any:
        await asyncio.Event().wait()

    rt = services(clock=fake_clock, kinds=registry, max_attempts=1)
    await rt.start()
    done = await final(rt, (await submit(rt, "stuck")).id)
    assert done.state is State.DEAD
    assert done.last_error is not None
    assert done.last_error.startswith("timed out: still running")
    assert rt.stats()["workers"]["timed_out"] == 1
    assert fake_clock.monotonic() >= 600.0


def test_overdue_names_the_limit_it_ran_past() -> None:
    """The health loop counts timeouts by the limit, not by parsing its own message."""
    clock = FakeClock(NOW)
    job = Job.new(kind="sleep", args={}, now=NOW)
    ctx = JobContext(job, random.Random(1), clock=clock, hb_timeout=1.0, timeout=5.0)
    assert overdue(ctx, 0.5) is None
    assert overdue(ctx, 2.0) == (Limit.HEARTBEAT, "worker hung: no heartbeat for 2000 ms")
    ctx.beat()
    assert overdue(ctx, 5.25) == (
        Limit.TIMEOUT,
        "timed out: still running 0.250 s past its timeout",
    )


async def test_a_long_sleep_job_takes_no_real_time(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """The built-in ``sleep`` kind sleeps (and beats) on the server's clock: ten minutes."""
    rt = services(clock=fake_clock)
    await rt.start()
    done = await final(rt, (await submit(rt, args={"work_ms": 600_000})).id)
    assert (done.state, done.result, done.attempts) == (State.COMPLETED, {"slept_ms": 600_000}, 1)
    assert fake_clock.monotonic() >= 600.0


async def test_the_grace_period_is_waited_on_the_injected_clock(fake_clock: FakeClock) -> None:
    """A job that needs 10 s of a 30 s grace finishes; one that needs forever is cancelled
    when the grace runs out, 30 s of the fake clock after the stop."""
    registry = Registry()
    both = asyncio.Event()  # the test wakes before the loop idles: the stop comes first
    running: list[str] = []
    ended: list[str] = []

    @task(registry=registry)
    async def ten_seconds(args: Any, ctx: JobContext) -> Any:
        running.append("ten_seconds")
        if len(running) == 2:
            both.set()
        await ctx.clock.sleep(10)
        ended.append("ten_seconds done")
        return "done"

    @task(registry=registry)
    async def forever(args: Any) -> Any:
        running.append("forever")
        if len(running) == 2:
            both.set()
        try:
            await asyncio.Event().wait()
        finally:
            ended.append("forever cancelled")

    config = RuntimeConfig(workers=2, seed=1, max_attempts=1)
    rt = Service(MemoryStore(clock=fake_clock), config, kinds=registry, clock=fake_clock)
    await rt.start()
    await submit(rt, "ten_seconds")
    await submit(rt, "forever")
    await asyncio.wait_for(both.wait(), 10)
    stopped_at = fake_clock.monotonic()
    await asyncio.wait_for(rt.stop(30), 10)  # a bound, not a timing claim: 30 s are fake
    assert fake_clock.monotonic() - stopped_at == pytest.approx(30.0)
    assert ended == ["ten_seconds done", "forever cancelled"]


async def test_a_handler_running_in_a_thread_holds_the_fake_clock_still(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """While a sync handler works in its thread, autojump must not race the fake clock
    past the handler's timeout: the thread's work is not idleness."""
    registry = Registry()
    started, release = threading.Event(), threading.Event()

    @task(registry=registry, timeout=5.0)
    def working(args: Any) -> Any:
        started.set()
        release.wait(30)
        return "worked"

    rt = services(clock=fake_clock, kinds=registry, max_attempts=1)
    await rt.start()
    job = await submit(rt, "working")
    await wait_for(started.is_set, 10, "the handler to start in its thread")
    before = fake_clock.monotonic()
    await asyncio.sleep(0.05)  # the loop idles: a jump would pass the timeout 100 times over
    assert fake_clock.monotonic() == before
    release.set()
    done = await final(rt, job.id)
    assert (done.state, done.result, done.attempts) == (State.COMPLETED, "worked", 1)


async def test_a_thread_cut_off_at_its_timeout_sees_ctx_cancelled(
    services: ServiceFactory,
) -> None:
    """A thread cannot be stopped, so the health loop's cut-off tells it through
    ``ctx.cancelled`` (as a cancel or a lost lease does): a handler that looks, stops.
    (The real clock: the fake one holds still while a thread runs.)"""
    registry = Registry()
    saw = threading.Event()

    @task(registry=registry, timeout=0.2)
    def looks(args: Any, ctx: JobContext) -> Any:
        while not ctx.cancelled:
            if saw.wait(0.01):  # (never set by anyone else: a bounded poll)
                break
        saw.set()
        return "stopped"

    rt = services(kinds=registry, max_attempts=1, hb_timeout_s=1.0)
    await rt.start()
    done = await final(rt, (await submit(rt, "looks")).id, within=30)
    assert done.state is State.DEAD
    assert done.last_error is not None
    assert done.last_error.startswith("timed out")
    await wait_for(saw.is_set, 30, "the thread to see ctx.cancelled")
