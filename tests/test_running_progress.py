"""Progress and checkpoints: what a running handler writes, coalesced, durable and fenced.
(A checkpoint the next attempt reads, and a stale attempt's refused, for every holder:
``test_claims_contract.py``.)

Writes are counted at the store (``HeldStore`` records every transition it is
asked to commit), on the injected clock, so "at most one a second" is a count
of commits over fake seconds.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from pathlib import Path
from typing import Any

import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.models import Job, State
from sqlq.runtime.context import AttemptFenced
from sqlq.runtime.kinds import JobContext, Registry, task
from sqlq.runtime.service import Service
from tests.helpers import ServiceFactory, StoreFactory, final, submit, wait_for
from tests.running_helpers import HeldStore, cut_off


async def test_progress_every_10_ms_for_5_s_makes_a_write_a_second(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    reg = Registry()

    @task(registry=reg)
    async def busy(args: Any, ctx: JobContext) -> Any:
        for i in range(500):
            ctx.progress(i / 5, f"step {i}")
            await ctx.clock.sleep(0.010)
        return "done"

    store = HeldStore(clock=fake_clock)
    rt = services(store, clock=fake_clock, kinds=reg)
    await rt.start()
    job = await submit(rt, "busy")
    done = await final(rt, job.id)
    touches = store.touches(job.id)
    assert 3 <= len(touches) <= 5, [t.progress for t in touches]  # 500 reports, 5 fake seconds
    assert all(t.progress is not None for t in touches)
    ats = [t.updated_at for t in touches]
    assert all(b - a >= 1.0 - 1e-3 for a, b in itertools.pairwise(ats))  # at most 1/s
    assert done.state is State.COMPLETED
    assert done.progress is not None  # the latest went with the outcome
    assert (done.progress.percent, done.progress.message) == (99.8, "step 499")


async def test_a_job_that_reports_nothing_writes_only_its_claim_and_outcome(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    store = HeldStore(clock=fake_clock)
    rt = services(store, clock=fake_clock)
    await rt.start()
    job = await submit(rt, args={"work_ms": 3000})
    done = await final(rt, job.id)
    assert [t.state for t in store.transitions if t.job_id == job.id] == [
        State.RUNNING, State.COMPLETED,
    ]  # fmt: skip
    assert done.progress is None


async def test_written_progress_shows_on_the_job_while_it_runs(services: ServiceFactory) -> None:
    """(On the real clock: the fake one stands still while a handler's thread works.)"""
    reg = Registry()
    go = asyncio.Event()

    @task(registry=reg)
    def crunch(args: Any, ctx: JobContext) -> Any:  # from a thread: never blocks
        ctx.progress(percent=40)
        ctx.progress(percent=50, message="half")
        asyncio.run_coroutine_threadsafe(go.wait(), loop).result()
        return "ok"

    loop = asyncio.get_running_loop()
    rt = services(kinds=reg, progress_every_s=0.05)
    await rt.start()
    job = await submit(rt, "crunch")

    async def shown() -> bool:
        now = await rt.get(job.id)
        return now is not None and now.progress is not None

    await wait_for(shown, 10, "the progress to be written")
    now = await rt.get(job.id)
    assert now is not None
    assert now.progress is not None
    assert (now.state, now.progress.percent, now.progress.message) == (
        State.RUNNING, 50.0, "half",
    )  # fmt: skip
    stored = await rt.store.get(job.id)
    assert stored is not None
    assert stored.progress == now.progress  # durable, not only in the view
    go.set()
    assert (await final(rt, job.id)).state is State.COMPLETED


async def test_a_bad_progress_value_fails_the_handler_not_the_store(
    services: ServiceFactory,
) -> None:
    reg = Registry()

    @task(registry=reg)
    async def wrong(args: Any, ctx: JobContext) -> Any:
        ctx.progress(percent=args["p"])
        return "unreachable"

    rt = services(kinds=reg, max_attempts=1)
    await rt.start()
    job = await submit(rt, "wrong", args={"p": 101})
    done = await final(rt, job.id)
    assert done.state is State.DEAD
    assert done.last_error == "ValueError: progress percent must be from 0 to 100, not 101"


async def test_a_sync_handler_s_checkpoint_is_durable_when_it_returns(
    services: ServiceFactory,
) -> None:
    reg = Registry()
    saved = threading.Event()
    release = threading.Event()

    @task(registry=reg)
    def saver(args: Any, ctx: JobContext) -> Any:
        ctx.checkpoint([1, 2, 3])
        saved.set()
        release.wait(10)
        return "ok"

    rt = services(kinds=reg)
    await rt.start()
    job = await submit(rt, "saver")
    await wait_for(saved.is_set, 10, "the checkpoint call to return")
    stored = await rt.store.get(job.id)
    assert stored is not None
    assert (stored.state, stored.checkpoint) == (State.RUNNING, [1, 2, 3])
    release.set()
    assert (await final(rt, job.id)).checkpoint is None


async def test_a_bad_checkpoint_fails_the_handler(services: ServiceFactory) -> None:
    reg = Registry()

    @task(registry=reg)
    async def big(args: Any, ctx: JobContext) -> Any:
        await ctx.checkpoint("x" * 70_000)

    rt = services(kinds=reg, max_attempts=1)
    await rt.start()
    done = await final(rt, (await submit(rt, "big")).id)
    assert done.state is State.DEAD
    assert done.last_error is not None
    assert done.last_error.startswith("ValueError: the checkpoint is 70002 bytes of JSON")


async def test_a_checkpoint_survives_a_stop_before_the_outcome_and_is_read_after(
    durable_engine: str, durable_factory: StoreFactory, tmp_path: Path
) -> None:
    """The service stops while the attempt runs (its outcome never lands); a new service on
    the same files runs the job again, and that attempt reads the checkpoint."""
    reg = Registry()
    seen: list[Any] = []
    saved = threading.Event()
    release = threading.Event()

    @task(registry=reg)
    def worker(args: Any, ctx: JobContext) -> Any:
        seen.append(ctx.checkpoint_data)
        if ctx.checkpoint_data is not None:
            return {"resumed_from": ctx.checkpoint_data}
        ctx.progress(50, "half")  # goes with the checkpoint's write
        ctx.checkpoint({"row": 42})
        saved.set()
        release.wait(30)
        return "first attempt"

    async def until_saved(_: Service, __: Job) -> None:
        await wait_for(saved.is_set, 10, "the checkpoint")

    second, job, _ = await cut_off(durable_factory, reg, "worker", until_saved, release)
    try:
        done = await final(second, job.id)
        assert seen == [None, {"row": 42}]
        assert (done.state, done.result, done.attempts) == (
            State.COMPLETED, {"resumed_from": {"row": 42}}, 2,
        )  # fmt: skip
        assert done.checkpoint is None
        assert done.progress is not None  # durable with the checkpoint, kept by the rerun
        assert (done.progress.percent, done.progress.message) == (50.0, "half")
    finally:
        await second.stop(0)


@pytest.mark.parametrize("value", [None, float("nan"), "x"])
def test_a_context_without_a_claim_keeps_progress_and_refuses_a_checkpoint(value: Any) -> None:
    import random

    from sqlq.common.models import Job

    ctx = JobContext(Job.new(kind="k", args={}, now=0.0), random.Random(1))
    if value == "x":
        ctx.progress(message=value)
        assert ctx.latest_progress is not None
        assert ctx.latest_progress.message == "x"
        with pytest.raises(AttemptFenced):
            ctx.checkpoint(value)
    else:
        with pytest.raises(ValueError):  # noqa: PT011 (the message is check_*'s)
            ctx.checkpoint(value) if value is None else ctx.progress(value)
