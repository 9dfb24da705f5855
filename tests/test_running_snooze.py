"""Snoozes through the handler's API (an attempt given back, a snooze counted), their bound,
and the history of failed attempts, its bound and every way an attempt fails. (A snooze,
one after a cancel, and a dead job's errors, for every holder: ``test_claims_contract.py``.)"""

from __future__ import annotations

from typing import Any

from sqlq.common.clock import FakeClock
from sqlq.common.models import Job, State
from sqlq.common.running import MAX_ERRORS
from sqlq.runtime.context import Snooze, snooze
from sqlq.runtime.kinds import JobContext, Registry, task
from tests.helpers import ServiceFactory, final, submit


def snoozer() -> Registry:
    reg = Registry()

    @task(registry=reg)
    async def later(args: Any, ctx: JobContext) -> Any:
        if ctx.job.snoozes < args["times"]:
            if ctx.job.snoozes % 2:
                return snooze(args["s"])
            raise Snooze(args["s"])
        return {"snoozed": ctx.job.snoozes}

    return reg


async def test_a_job_that_snoozes_3_times_then_succeeds_used_one_attempt(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = services(clock=fake_clock, kinds=snoozer(), max_attempts=1)
    await rt.start()
    start = fake_clock.time()
    job = await submit(rt, "later", args={"times": 3, "s": 30})
    done = await final(rt, job.id)
    assert (done.state, done.result, done.attempts, done.snoozes) == (
        State.COMPLETED, {"snoozed": 3}, 1, 3,
    )  # fmt: skip
    assert done.updated_at - start >= 90.0  # three 30 s snoozes, on the scheduler's clock
    assert (done.errors, done.last_error) == ((), None)  # a snooze is not a failure
    stats = rt.stats()
    assert (stats["snoozed"], stats["retried"]) == (3, 0)


async def test_a_job_that_snoozes_past_max_snoozes_is_dead(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = services(clock=fake_clock, kinds=snoozer(), max_snoozes=2)
    await rt.start()
    done = await final(rt, (await submit(rt, "later", args={"times": 99, "s": 1})).id)
    assert (done.state, done.snoozes) == (State.DEAD, 2)
    assert done.last_error == "snoozed 3 times, more than --max-snoozes (2)"
    assert [e.error for e in done.errors] == [done.last_error]


async def test_a_bad_snooze_fails_the_attempt(services: ServiceFactory) -> None:
    reg = Registry()

    @task(registry=reg)
    async def wrong(args: Any) -> Any:
        raise Snooze(-1)

    rt = services(kinds=reg, max_attempts=1)
    await rt.start()
    done = await final(rt, (await submit(rt, "wrong")).id)
    assert done.state is State.DEAD
    assert done.last_error is not None
    assert done.last_error.startswith("ValueError: a snooze's delay must be from 0 to")


def failing(registry: Registry) -> None:
    @task(registry=registry)
    async def boom(args: Any, ctx: JobContext) -> Any:
        raise RuntimeError(f"boom {ctx.job.attempts}")


async def dead_boom(services: ServiceFactory, clock: FakeClock, *, max_attempts: int) -> Job:
    """A job that fails every attempt, as it ended after ``max_attempts``."""
    reg = Registry()
    failing(reg)
    rt = services(clock=clock, kinds=reg, max_attempts=max_attempts)
    await rt.start()
    return await final(rt, (await submit(rt, "boom")).id)


async def test_a_job_keeps_its_last_10_errors(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    done = await dead_boom(services, fake_clock, max_attempts=13)
    assert (done.state, done.all_attempts) == (State.DEAD, 13)
    assert len(done.errors) == MAX_ERRORS
    assert [e.attempt for e in done.errors] == list(range(4, 14))
    assert done.errors[-1].error == done.last_error == "RuntimeError: boom 13"


async def test_every_way_an_attempt_fails_fills_the_history(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """A timeout, a hang, an unencodable result and a result past the bounds each end an
    attempt through the retry policy, so each leaves its entry."""
    reg = Registry()

    @task(registry=reg, timeout=1)
    async def mixed(args: Any, ctx: JobContext) -> Any:
        n = ctx.job.attempts
        if n == 1:
            await ctx.clock.sleep(10)  # past its timeout
        if n == 2:
            return {"bad": object()}  # JSON cannot hold it
        return "ok"

    rt = services(clock=fake_clock, kinds=reg, max_attempts=3)
    await rt.start()
    mixed_job = await submit(rt, "mixed")
    hung = await submit(rt, "sleep", args={"hang_prob": 1.0}, max_attempts=1)
    done = await final(rt, mixed_job.id)
    assert done.state is State.COMPLETED
    assert [e.error.split(":")[0] for e in done.errors] == [
        "timed out",
        "result is not JSON-serialisable",
    ]
    dead = await final(rt, hung.id)
    assert [e.error.split(":")[0] for e in dead.errors] == ["worker hung"]
