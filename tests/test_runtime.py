"""The runtime: lifecycle, retries, dead letters, hangs, restarts.

On the memory engine (the contract suite covers every engine); restarts on the
durable ones.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from sqlq.common.backoff import RetryPolicy
from sqlq.common.clock import FakeClock
from sqlq.common.models import Job, State
from sqlq.common.specs import JobSpec
from sqlq.common.store import JobQuery
from sqlq.http.app import create_app
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.kinds import SLEEP, JobContext, JobFailed, Kind, Registry, task
from sqlq.runtime.scheduler import Scheduler
from sqlq.runtime.service import Service
from tests.helpers import NOW, ServiceFactory, StoreFactory, final, submit, wait_for


async def test_all_jobs_complete(services: ServiceFactory) -> None:
    rt = services(workers=8)
    await rt.start()
    jobs = await rt.submit([JobSpec(kind="sleep", args={"work_ms": 5}) for _ in range(200)])
    for job in jobs:
        done = await final(rt, job.id)
        assert done.state is State.COMPLETED
        assert done.result == {"slept_ms": 5}
        assert done.attempts == 1
    assert rt.stats()["jobs"]["completed"] == 200


async def test_always_failing_job_is_dead_lettered_after_max_attempts(
    services: ServiceFactory,
) -> None:
    rt = services(max_attempts=3, retry=RetryPolicy(base_s=0.001))
    await rt.start()
    job = await submit(rt, args={"fail_prob": 1.0})
    done = await final(rt, job.id)
    assert done.state is State.DEAD
    assert done.attempts == 3
    assert done.last_error is not None
    assert "injected failure" in done.last_error
    assert rt.stats()["retried"] == 2


async def test_per_job_max_attempts_overrides_the_default(services: ServiceFactory) -> None:
    rt = services(max_attempts=5, retry=RetryPolicy(base_s=0.001))
    await rt.start()
    job = await submit(rt, args={"fail_prob": 1.0}, max_attempts=2)
    assert (await final(rt, job.id)).attempts == 2


async def test_no_retries_dead_letters_at_first_failure(services: ServiceFactory) -> None:
    rt = services(retry=RetryPolicy(retries=False))
    await rt.start()
    job = await submit(rt, args={"fail_prob": 1.0})
    done = await final(rt, job.id)
    assert (done.state, done.attempts) == (State.DEAD, 1)
    assert rt.stats()["retried"] == 0


async def test_hung_worker_is_replaced_and_its_job_requeued_with_a_new_epoch(
    services: ServiceFactory,
) -> None:
    """On an injected clock: the health check is driven by hand, to the millisecond."""
    clock = FakeClock(NOW)
    retry = RetryPolicy(base_s=0.001, cap_s=0.001, jitter=0.0)
    rt = services(
        clock=clock, workers=2, healthcheck=False, hb_timeout_s=0.2, max_attempts=2, retry=retry
    )
    await rt.start()
    hanging = await submit(rt, args={"hang_prob": 1.0})
    await wait_for(lambda: rt.pool.busy() == 1, 5, "the job to start, and hang")
    clock.advance(0.2)  # silent for exactly the timeout: not yet hung
    assert rt.pool.check(clock.monotonic()) == []
    clock.advance(0.001)
    assert len(rt.pool.check(clock.monotonic())) == 1
    # Requeued with a new epoch, due 1 ms later on the injected clock.
    await wait_for(lambda: rt.stats()["retried"] == 1, 5, "the retry to be durable")
    assert rt.pool.busy() == 0
    clock.advance(0.001)
    await wait_for(lambda: rt.pool.busy() == 1, 5, "the second attempt to start")
    clock.advance(0.201)
    assert len(rt.pool.check(clock.monotonic())) == 1
    done = await final(rt, hanging.id)
    # It hung on both attempts: requeued once with a new epoch, then dead-lettered.
    assert (done.state, done.attempts, done.epoch) == (State.DEAD, 2, 2)
    assert done.last_error == "worker hung: no heartbeat for 201 ms"
    workers = rt.stats()["workers"]
    assert (workers["hung_declared"], workers["replaced"], workers["live"]) == (2, 2, 2)
    assert workers["max_live_seen"] <= 2
    assert rt.stats()["requeued_hung"] == 2
    await wait_for(lambda: not rt.pool.abandoned, 5, "the hung tasks to be cancelled")


async def test_a_timeout_is_judged_on_the_injected_clock(services: ServiceFactory) -> None:
    registry = Registry()

    @task(registry=registry, timeout=5.0)
    async def busy(args: Any, ctx: JobContext) -> Any:
        while True:  # beats, so only the timeout can stop it
            ctx.beat()
            await asyncio.sleep(0.001)

    clock = FakeClock(NOW)
    rt = services(clock=clock, kinds=registry, healthcheck=False, max_attempts=1)
    await rt.start()
    job = await submit(rt, "busy")
    await wait_for(lambda: rt.pool.busy() == 1, 5, "the job to start")
    clock.advance(5.0)
    assert rt.pool.check(clock.monotonic()) == []
    clock.advance(0.5)
    assert len(rt.pool.check(clock.monotonic())) == 1
    done = await final(rt, job.id)
    assert done.state is State.DEAD
    assert done.last_error == "timed out: still running 0.500 s past its timeout"
    assert rt.stats()["workers"]["timed_out"] == 1


async def test_stale_worker_cannot_complete_a_requeued_job(
    services: ServiceFactory, fake_clock: FakeClock
) -> None:
    """A hung handler is cancelled; one that swallows the cancel and returns late is fenced.
    (On the fake clock: the heartbeat timeout and the retry's backoff take no real time.)"""
    release = asyncio.Event()
    calls: list[int] = []

    async def slow_then_fast(args: Any, ctx: JobContext) -> Any:
        calls.append(ctx.job.epoch)
        if len(calls) == 1:  # the first attempt goes silent and ignores its cancellation
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                await release.wait()
            return "stale"
        return "fresh"

    registry = Registry()
    registry.register(Kind("flaky", lambda a: a, slow_then_fast))
    rt = services(
        kinds=registry, workers=2, hb_timeout_s=0.05, retry=RetryPolicy(base_s=0.001),
        clock=fake_clock,
    )  # fmt: skip
    await rt.start()
    job = await submit(rt, kind="flaky")
    done = await final(rt, job.id)
    assert (done.state, done.result, done.epoch) == (State.COMPLETED, "fresh", 1)
    assert rt.stats()["workers"]["abandoned_still_running"] == 1
    release.set()  # now the abandoned worker finishes with its old epoch
    await wait_for(lambda: rt.stats()["fenced"] == 1, 10, "the stale completion to be fenced")
    again = await rt.get(job.id)
    assert again is not None
    assert again.result == "fresh"
    assert calls == [0, 1]
    assert rt.stats()["workers"]["abandoned_still_running"] == 0


async def test_cpu_jobs_longer_than_the_heartbeat_timeout_are_not_hung(
    services: ServiceFactory,
) -> None:
    rt = services(workers=4, hb_timeout_s=0.05)  # 4 workers, 2 cores: jobs queue for a CPU
    await rt.start()
    jobs = await rt.submit([JobSpec(kind="cpu", args={"rounds": 200_000}) for _ in range(4)])
    for job in jobs:
        done = await final(rt, job.id, within=60)
        assert done.state is State.COMPLETED
        assert done.attempts == 1
    assert rt.stats()["workers"]["hung_declared"] == 0


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
    assert rt.claims.scheduler.sizes()["delayed"] == 100_000
    now_jobs = await rt.submit([JobSpec(kind="sleep") for _ in range(200)])
    for job in now_jobs:
        assert (await final(rt, job.id)).state is State.COMPLETED
    # Only the immediate jobs went through the dispatcher; the heap was never scanned.
    assert rt.claims.scheduler.dispatched == 200
    assert rt.claims.scheduler.sizes()["delayed"] == 100_000


async def test_cancel_a_scheduled_job(services: ServiceFactory) -> None:
    rt = services()
    await rt.start()
    job = await submit(rt, delay_ms=60_000)
    cancelled = await rt.cancel(job.id)
    assert cancelled.state is State.CANCELLED
    got = await rt.get(job.id)
    assert got is not None
    assert got.state is State.CANCELLED


async def test_restart_requeues_only_unfinished_jobs(
    durable_engine: str, durable_factory: StoreFactory, tmp_path: Path
) -> None:
    engine, factory = durable_engine, durable_factory
    from sqlq.common.clock import SYSTEM_CLOCK

    first = Service(factory(clock=SYSTEM_CLOCK), RuntimeConfig(workers=3, seed=1))
    await first.start()
    quick = await first.submit([JobSpec(kind="sleep", args={"work_ms": 1}) for _ in range(5)])
    for job in quick:
        await final(first, job.id)
    slow = await first.submit([JobSpec(kind="sleep", args={"work_ms": 60_000}) for _ in range(5)])
    await wait_for(lambda: first.stats()["jobs"]["running"] == 3, 10, "3 running")
    await first.stop(grace_s=0)  # the 3 running jobs are left "running" in the store
    if engine == "walq":  # and the crash tore the last line
        with open(tmp_path / "walq" / "walq.log", "ab") as f:
            f.write(b'{"crc":"0000')

    second = Service(factory(clock=SYSTEM_CLOCK), RuntimeConfig(workers=3, seed=1))
    try:
        recovery = await second.start()
        assert len(recovery.running) == 3
        assert {j.id for j in recovery.jobs} == {j.id for j in slow}
        if engine == "walq":
            assert recovery.torn_bytes == len(b'{"crc":"0000')
        assert second.stats()["requeued_at_recovery"] == 3
        for job in quick:
            got = await second.get(job.id)
            assert got is not None
            assert (got.state, got.attempts) == (State.COMPLETED, 1)
        for job_id in recovery.running:
            got = await second.get(job_id)
            assert got is not None
            assert got.epoch == 1  # requeued with a new epoch
    finally:
        await second.stop(0)


async def test_periodic_compaction_prunes_past_retention(factory: StoreFactory) -> None:
    from sqlq.common.clock import FakeClock

    clock = FakeClock(time.time())
    store = factory(retention=60.0, clock=clock)
    rt = Service(store, RuntimeConfig(workers=2, compact_every_s=0.05), clock=clock)
    await rt.start()
    try:
        job = await submit(rt)
        await final(rt, job.id)
        clock.advance(3600)  # long past retention
        await wait_for(lambda: rt.live.totals["compactions"] >= 1, 10, "a periodic compaction")

        async def gone() -> bool:
            return await rt.get(job.id) is None

        await wait_for(gone, 10, "the finished job to be pruned")
    finally:
        await rt.stop(0)


def test_registry_refuses_a_duplicate_kind() -> None:
    registry = Registry()
    registry.register(SLEEP)
    with pytest.raises(ValueError, match="already registered"):
        registry.register(SLEEP)


async def test_a_cancelled_delayed_job_leaves_the_depth_at_once(services: ServiceFactory) -> None:
    rt = services()
    await rt.start()
    job = await submit(rt, delay_ms=3_600_000, queue="later")
    assert (await rt.queues())["later"].depth == 1
    await rt.cancel(job.id)
    assert rt.claims.scheduler.depth("later") == 0  # not at its due time, an hour from now
    assert rt.stats()["lanes"]["delayed"] == 0
    assert "later" not in await rt.queues()
    assert rt.claims.scheduler.queues_held() == 0  # and nothing of it is kept


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
    assert rt.claims.queue_now("default").depth == 0
    await rt.retry(job.id)  # due now
    await wait_for(lambda: rt.stats()["retried"] == 1, 5, "the retry's attempt to fail")
    assert started == [NOW]
    assert rt.claims.queue_now("default").depth == 1  # the backoff's entry, and only that
    dispatched = rt.claims.scheduler.dispatched
    clock.advance(10.0)  # the old due time: nothing is due
    rt.claims.scheduler.poke()
    assert rt.claims.scheduler.dispatched == dispatched
    clock.advance(50.0)  # the backoff's time
    rt.claims.scheduler.poke()
    done = await final(rt, job.id)
    assert done.state is State.COMPLETED
    assert started == [NOW, NOW + 60.0]
    assert rt.claims.scheduler.queues_held() == 0


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


async def _http(rt: Service) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(rt, start_runtime=False)),
        base_url="http://localhost",
    )


async def test_max_queues_counts_queues_with_live_jobs_and_paused_ones(
    services: ServiceFactory,
) -> None:
    rt = services(max_queues=3)
    await rt.start()
    async with await _http(rt) as c:
        later = {"kind": "sleep", "delay_ms": 3_600_000}
        a = await c.post("/jobs", json={**later, "queue": "a"})
        assert a.status_code == 201
        assert (await c.post("/jobs", json={**later, "queue": "b"})).status_code == 201
        # pausing a name nobody used makes a durable entry: it counts too
        assert (await c.post("/queues/p/pause")).status_code == 200
        r = await c.post("/jobs", json={**later, "queue": "c"})
        assert (r.status_code, r.json()["field"]) == (422, "queue")
        assert "--max-queues (3)" in r.json()["message"]
        r = await c.post("/jobs/batch", json={"jobs": [{**later, "queue": "a"},
                                                        {**later, "queue": "c"}]})  # fmt: skip
        assert (r.status_code, r.json()["field"]) == (422, "jobs[1].queue")
        r = await c.post("/queues/x/pause")
        assert (r.status_code, r.json()["field"]) == (422, "queue")
        assert (await c.post("/jobs", json={**later, "queue": "a"})).status_code == 201
        assert (await c.post("/queues/a/pause")).status_code == 200  # in use already
        assert rt.stats()["queues_used"] == 3
        for job in await rt.list_jobs(JobQuery(queue="b")):
            await rt.cancel(job.id)  # b has no live job left: a slot is free
        assert (await c.post("/jobs", json={**later, "queue": "c"})).status_code == 201
        assert (await c.post("/queues/p/resume")).status_code == 200
        assert (await c.post("/queues/x/pause")).status_code == 200


async def test_retries_count_against_max_queues_and_max_queued(services: ServiceFactory) -> None:
    """A retry makes jobs live again, perhaps in queues nothing else uses: the same bounds
    as a submission hold (review found six queues and six live jobs past limits of 2 and 3)."""
    rt = services(max_queues=2, max_queued=3, workers=0)  # a retried job is due: none runs
    await rt.start()
    later = {"kind": "sleep", "delay_ms": 3_600_000}
    async with await _http(rt) as c:
        ids = {}
        for q in "abcdef":
            ids[q] = (await c.post("/jobs", json={**later, "queue": q})).json()["id"]
            assert (await c.delete(f"/jobs/{ids[q]}")).status_code == 200
        r = await c.post("/jobs/retry", json={"state": "cancelled"})  # six live: past 3
        assert r.status_code == 429
        assert (await c.post(f"/jobs/{ids['a']}/retry")).status_code == 200
        assert (await c.post(f"/jobs/{ids['b']}/retry")).status_code == 200
        r = await c.post(f"/jobs/{ids['c']}/retry")  # a third queue
        assert (r.status_code, r.json()["field"]) == (422, "queue")
        assert (await c.post("/jobs", json={**later, "queue": "a"})).status_code == 201
        assert len(rt.live) == 3
        r = await c.post("/jobs/retry", json={"state": "cancelled", "queue": "a"})
        assert (r.status_code, r.json()["retried"]) == (200, 0)  # nothing left to retry in a
        r = await c.post("/jobs", json={**later, "queue": "b"})
        assert r.status_code == 429
    assert rt.stats()["queues_used"] == 2
    assert len(rt.live) == 3


async def test_the_census_is_kept_as_jobs_move_with_no_entry_for_an_empty_queue(
    services: ServiceFactory,
) -> None:
    rt = services(workers=2, retry=RetryPolicy(base_s=0.001), max_attempts=2)
    await rt.start()

    def walked() -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for job in rt.live.jobs.values():
            out[job.state.value, job.queue] = out.get((job.state.value, job.queue), 0) + 1
        return out

    jobs = []
    for i in range(30):
        spec = {"args": {"work_ms": 2, "fail_prob": 1.0 if i % 3 == 0 else 0.0}}
        jobs.append(await submit(rt, queue=f"q{i % 4}", **spec))
    later = await submit(rt, delay_ms=3_600_000, queue="later")
    assert rt.claims.census() == walked()
    for job in jobs:
        await final(rt, job.id)
        assert rt.claims.census() == walked()
    assert rt.claims.census() == {("scheduled", "later"): 1}
    assert set(rt.live.queues) == {"later"}
    await rt.cancel(later.id)
    assert rt.claims.census() == {}
    assert not rt.live.queues


async def test_metrics_series_of_an_idle_queue_last_until_the_bound_needs_their_room(
    services: ServiceFactory,
) -> None:
    """A queue that drains between jobs keeps its counters across scrapes (dropping them at
    every scrape reset them, and ``increase`` lost each first increment); only past the
    bound (2 x --max-queues queues) do idle queues' series go, live ones never."""
    rt = services(max_queues=10)  # series for 20 queues at most
    await rt.start()
    stays = await submit(rt, delay_ms=3_600_000, queue="stays")
    for _ in range(3):
        await final(rt, (await submit(rt, queue="bursty")).id)

    def series() -> list[str]:
        text = rt.metrics.exposition().decode()
        return [
            ln for ln in text.splitlines() if ln.startswith(("sqlq_jobs_total", "sqlq_jobs_live"))
        ]

    for _ in range(3):  # idle between scrapes, and still counted whole
        done = [ln for ln in series() if 'queue="bursty"' in ln and 'event="completed"' in ln]
        assert done
        assert done[0].endswith(" 3.0")
    for i in range(40):
        await final(rt, (await submit(rt, queue=f"once{i}")).id)
    again = series()
    assert len(rt.metrics.events) <= 20
    assert any('queue="stays"' in ln and 'event="submitted"' in ln for ln in again)
    assert any(ln.startswith("sqlq_jobs_live") and 'queue="stays"' in ln for ln in again)
    await rt.cancel(stays.id)


async def test_metrics_series_stay_bounded_when_nobody_scrapes(services: ServiceFactory) -> None:
    rt = services(max_queues=10)  # series for 20 queues at most
    await rt.start()
    for i in range(200):
        await final(rt, (await submit(rt, queue=f"once{i}")).id)
    assert len(rt.metrics.events) <= 20


def test_the_max_queues_flag_reaches_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    import sqlq.serve
    from sqlq.cli import main

    seen: dict[str, Any] = {}

    async def fake_serve(runtime: Any, opts: Any) -> None:
        seen["runtime"] = runtime

    monkeypatch.setattr(sqlq.serve, "serve", fake_serve)
    r = CliRunner().invoke(main, ["serve", "--store", "memory", "--max-queues", "7"])
    assert r.exit_code == 0, r.output
    assert seen["runtime"].config.max_queues == 7
    r = CliRunner().invoke(main, ["serve", "--store", "memory", "--max-queues", "0"])
    assert r.exit_code == 2
    assert "--max-queues" in r.output


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
            job = sched._pop(now)  # (take() without a loop: the choice itself)
            if job is None:
                assert not due
                continue
            assert live.pop(job.id) is job
            assert job.ready_at <= now
            assert job.queue not in paused
            assert job.priority == max(j.priority for j in due)
            popped += 1
        for q in queues:
            assert sched.depth(q) == sum(1 for j in live.values() if j.queue == q)
    paused.clear()
    sched.poke()
    clock.advance(60)
    while (job := sched._pop(clock.time())) is not None:
        assert live.pop(job.id) is job
    assert not live
    assert sched.queues_held() == 0
    assert popped > 300


async def test_a_queue_that_ran_jobs_leaves_no_running_entry(services: ServiceFactory) -> None:
    """Queue names are a bound: a queue whose jobs all ended is held nowhere, not even as a
    zero in the running counts (review found one entry left per queue ever run)."""
    rt = services(workers=2)
    await rt.start()
    jobs = [await submit(rt, "sleep", queue=f"q{i}") for i in range(20)]
    for job in jobs:
        await final(rt, job.id)
    await wait_for(lambda: rt.claims.backlog() == 0, 10, "every job to leave the view")
    assert not rt.claims._running  # the leak lived here
