"""The runtime's scheduling: delayed jobs, cancels, queues taking turns, against a model."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from sqlq.common.backoff import RetryPolicy
from sqlq.common.clock import FakeClock
from sqlq.common.models import Job, State
from sqlq.common.specs import JobSpec
from sqlq.runtime.kinds import JobContext, JobFailed, Kind, Registry
from sqlq.runtime.scheduler import Scheduler
from tests.helpers import NOW, ServiceFactory, final, submit, wait_for
from tests.runtime_helpers import lanes


async def test_delayed_job_waits_and_an_earlier_one_wakes_the_dispatcher(
    services: ServiceFactory, fake_clock: FakeClock
) -> None:
    """On the fake clock: had the earlier job not re-armed the dispatcher's timer (set for
    the later one), it would start 30 s late, with the later one."""
    started: dict[str, float] = {}
    ran = asyncio.Event()  # awaited, not polled: the test looks before the clock jumps on

    async def stamp(args: Any, ctx: JobContext) -> Any:
        started[ctx.job.id] = ctx.clock.time()
        ran.set()
        return None

    registry = Registry()
    registry.register(Kind("stamp", lambda a: a, stamp))
    rt = services(kinds=registry, clock=fake_clock)
    await rt.start()
    late = await submit(rt, kind="stamp", delay_ms=30_000)
    soon = await submit(rt, kind="stamp", delay_ms=150)
    await ran.wait()
    assert list(started) == [soon.id]
    assert soon.ready_at <= started[soon.id] < late.ready_at
    current = await rt.get(late.id)
    assert current is not None
    assert current.state is State.SCHEDULED
    done = await final(rt, soon.id, within=10)
    assert done.state is State.COMPLETED


async def test_immediate_jobs_skip_100k_delayed_ones(services: ServiceFactory) -> None:
    rt = services(workers=8)
    await rt.start()
    for _ in range(10):
        await rt.submit(
            [JobSpec(kind="sleep", delay_ms=3_600_000) for _ in range(10_000)], batch=True
        )
    assert lanes(rt).sizes()["delayed"] == 100_000
    now_jobs = (await rt.submit([JobSpec(kind="sleep") for _ in range(200)]))[0]
    for job in now_jobs:
        assert (await final(rt, job.id)).state is State.COMPLETED
    # Only the immediate jobs went through the dispatcher; the heap was never scanned.
    assert lanes(rt).dispatched == 200
    assert lanes(rt).sizes()["delayed"] == 100_000


async def test_cancel_a_scheduled_job(services: ServiceFactory) -> None:
    rt = services()
    await rt.start()
    job = await submit(rt, delay_ms=60_000)
    cancelled = await rt.cancel(job.id)
    assert cancelled.state is State.CANCELLED
    got = await rt.get(job.id)
    assert got is not None
    assert got.state is State.CANCELLED


async def test_a_cancelled_delayed_job_leaves_the_depth_at_once(services: ServiceFactory) -> None:
    rt = services()
    await rt.start()
    job = await submit(rt, delay_ms=3_600_000, queue="later")
    assert (await rt.queues())["later"].depth == 1
    await rt.cancel(job.id)
    assert lanes(rt).depth("later") == 0  # not at its due time, an hour from now
    assert rt.stats()["lanes"]["delayed"] == 0
    assert "later" not in await rt.queues()
    assert lanes(rt).queues_held() == 0  # and nothing of it is kept


async def test_cancel_then_retry_runs_at_the_retry_never_at_the_old_due_time(
    services: ServiceFactory,
) -> None:
    """The stale entry of a cancelled job must not start it at the old due time: after the
    retry fails, its backoff (a minute) holds, where the old entry fired at 10 s."""
    clock = FakeClock(NOW)
    started: list[float] = []

    async def flaky(args: Any, ctx: JobContext) -> Any:
        started.append(clock.time())
        if len(started) == 1:
            raise JobFailed("the first attempt fails")
        return None

    registry = Registry()
    registry.register(Kind("flaky", lambda a: a, flaky))
    retry = RetryPolicy(base_s=60.0, cap_s=60.0, jitter=0.0)
    rt = services(clock=clock, kinds=registry, workers=1, retry=retry, healthcheck=False)
    await rt.start()
    job = await submit(rt, kind="flaky", delay_ms=10_000)  # due at NOW + 10
    await rt.cancel(job.id)
    assert (await rt.view.queue("default")).depth == 0
    await rt.retry(job.id)  # due now
    await wait_for(lambda: rt.stats()["retried"] == 1, 5, "the retry's attempt to fail")
    assert started == [NOW]
    assert (await rt.view.queue("default")).depth == 1  # the backoff's entry, and only that
    dispatched = lanes(rt).dispatched
    clock.advance(10.0)  # the old due time: nothing is due
    lanes(rt).poke()
    assert lanes(rt).dispatched == dispatched
    clock.advance(50.0)  # the backoff's time
    lanes(rt).poke()
    done = await final(rt, job.id)
    assert done.state is State.COMPLETED
    assert started == [NOW, NOW + 60.0]
    assert lanes(rt).queues_held() == 0


async def test_queues_used_and_emptied_are_dropped(clock: FakeClock) -> None:
    sched = Scheduler(clock)
    for i in range(10_000):
        sched.add(Job.new(kind="sleep", args={}, now=NOW, queue=f"q{i}"))
    assert sched.queues_held() == 10_000
    taken = {(await sched.take()).queue for _ in range(10_000)}
    assert len(taken) == 10_000
    assert sched.queues_held() == 0
    assert sched.sizes() == {"immediate": 0, "delayed": 0, "workers_waiting": 0}


async def test_ties_between_queues_take_turns_and_priority_goes_first(clock: FakeClock) -> None:
    sched = Scheduler(clock)
    for name in ("a", "b", "c"):
        for _ in range(3):
            sched.add(Job.new(kind="sleep", args={}, now=NOW, queue=name))
    sched.add(Job.new(kind="sleep", args={}, now=NOW, queue="c", priority=5))
    order = [(await sched.take()).queue for _ in range(10)]
    assert order[0] == "c"  # the highest priority of every open queue first
    assert order[1:] == ["a", "b", "c"] * 3  # then equal ones in turn


async def test_a_closed_queue_is_not_looked_at_on_every_pop(clock: FakeClock) -> None:
    """1,000 paused queues full of due jobs: a pop asks about each of them once, not each time."""
    asked: list[str] = []

    def gate(queue: str) -> bool:
        asked.append(queue)
        return not queue.startswith("paused")

    sched = Scheduler(clock, gate=gate)
    for i in range(1000):
        sched.add(Job.new(kind="sleep", args={}, now=NOW, queue=f"paused{i}", priority=1))
    for _ in range(500):
        sched.add(Job.new(kind="sleep", args={}, now=NOW, queue="open"))
    for _ in range(500):
        assert (await sched.take()).queue == "open"
    assert len(asked) <= 1000 + 500
    sched.poke("paused7")  # reopened (it is still paused: asked once more, closed again)
    asked.clear()
    sched.add(Job.new(kind="sleep", args={}, now=NOW, queue="open"))
    assert (await sched.take()).queue == "open"
    assert len(asked) <= 2


async def test_a_closed_queue_whose_delayed_job_falls_due_does_not_spin_the_dispatcher(
    clock: FakeClock,
) -> None:
    """One queue, paused, with a delayed job that comes due while a worker waits: the
    dispatcher sleeps until the queue is poked, instead of re-arming a timer for a time
    already past on every turn of the loop (a busy loop, found by review)."""
    paused = {"only"}
    sched = Scheduler(clock, gate=lambda q: q not in paused)
    sched.start()
    try:
        sched.add(Job.new(kind="sleep", args={}, now=NOW, ready_at=NOW + 0.05, queue="only"))
        worker = asyncio.ensure_future(sched.take())
        await asyncio.sleep(0)
        clock.advance(1)  # the job is due, its queue still closed
        sched.add(Job.new(kind="sleep", args={}, now=NOW, ready_at=NOW + 60, queue="only"))
        before = sched.wakeups
        for _ in range(200):  # turns of the event loop, not time: a spinning dispatcher
            await asyncio.sleep(0)  # wakes on (nearly) every one of them
        assert sched.wakeups - before <= 2
        assert not worker.done()
        paused.clear()
        sched.poke("only")
        assert (await worker).ready_at == NOW + 0.05
    finally:
        await sched.stop()


async def test_a_delayed_job_of_another_queue_goes_first_once_due(clock: FakeClock) -> None:
    sched = Scheduler(clock)
    sched.add(Job.new(kind="sleep", args={}, now=NOW, queue="a"))
    sched.add(Job.new(kind="sleep", args={}, now=NOW, queue="a"))
    sched.add(Job.new(kind="sleep", args={}, now=NOW, ready_at=NOW + 5, queue="b", priority=3))
    assert sched._next_wakeup() == NOW + 5
    assert (await sched.take()).queue == "a"
    clock.advance(5)
    assert (await sched.take()).queue == "b"
    assert (await sched.take()).queue == "a"
    assert sched.queues_held() == 0


@pytest.mark.parametrize("seed", [*range(6), 83])  # 83 found a queue kept by stale entries
def test_the_scheduler_against_a_brute_force_model(seed: int) -> None:
    """Random adds (queues, priorities, delays), cancels, pauses, resumes and clock steps; each
    pop must be a due, live job of an open queue with the highest priority of every open
    queue's due jobs; depths must be exact; at the end everything left comes out."""
    rng = random.Random(seed)
    clock = FakeClock(NOW)
    paused: set[str] = set()
    live: dict[str, Job] = {}  # the model: every job scheduled and not yet taken or cancelled
    sched = Scheduler(clock, gate=lambda q: q not in paused, current=lambda j: live.get(j.id) is j)
    queues = [f"q{i}" for i in range(rng.choice([1, 2, 5, 40]))]
    popped = 0
    for _ in range(3000):
        op = rng.random()
        now = clock.time()
        if op < 0.45:
            delay = rng.choice([0, 0, 0, 0.5, 3, 20])
            job = Job.new(kind="sleep", args={}, now=now, ready_at=now + delay,
                          queue=rng.choice(queues), priority=rng.choice([0, 0, 1, 5]))  # fmt: skip
            live[job.id] = job
            sched.add(job)
        elif op < 0.55 and live:
            job = live.pop(rng.choice(list(live)))  # cancelled: the claims discard its entry
            sched.discard(job)
        elif op < 0.6:
            q = rng.choice(queues)
            if q in paused:
                paused.discard(q)
                sched.poke(q)
            else:
                paused.add(q)
        elif op < 0.7:
            clock.advance(rng.choice([0.1, 1, 5]))
        else:
            due = [j for j in live.values() if j.ready_at <= now and j.queue not in paused]
            popped_job = sched._pop(now)  # (take() without a loop: the choice itself)
            if popped_job is None:
                assert not due
                continue
            assert live.pop(popped_job.id) is popped_job
            assert popped_job.ready_at <= now
            assert popped_job.queue not in paused
            assert popped_job.priority == max(j.priority for j in due)
            popped += 1
        for q in queues:
            assert sched.depth(q) == sum(1 for j in live.values() if j.queue == q)
    paused.clear()
    sched.poke()
    clock.advance(60)
    while (left := sched._pop(clock.time())) is not None:
        assert live.pop(left.id) is left
    assert not live
    assert sched.queues_held() == 0
    assert popped > 300


async def test_a_cancel_of_a_job_handed_to_a_waiting_worker_leaves_the_depth_exact(
    clock: FakeClock,
) -> None:
    """The cancel/hand-out race: the entry went to a worker that has not resumed yet when
    the cancel discards it. It is no longer in the lanes, so nothing is counted stale there
    (before, the depth read one low until a purge)."""
    gone: set[str] = set()
    sched = Scheduler(clock, current=lambda job: job.id not in gone)
    others = [Job.new(kind="sleep", args={}, now=NOW, queue="q") for _ in range(5)]
    worker = asyncio.create_task(sched.take())
    await asyncio.sleep(0)  # it waits
    handed = Job.new(kind="sleep", args={}, now=NOW, queue="q")
    sched.add(handed)  # handed to the waiting worker at once; the worker has not resumed
    for job in others:
        sched.add(job)
    gone.add(handed.id)
    sched.discard(handed)  # the cancel, before the worker runs
    assert sched.depth("q") == 5
    assert await worker is handed  # its worker finds it cancelled and lets it go
    assert sched.depth("q") == 5
    assert [await sched.take() for _ in range(5)] == others
