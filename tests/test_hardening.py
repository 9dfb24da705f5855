"""No single request or handler can fail the service (issue: safe to run for real).

Service-level: bad results, long and broken error text, handler limits, abandoned
work, the queue limit, fault injection, and the cancel/claim race.
"""

from __future__ import annotations

import pytest

from sqlq.common.backoff import RetryPolicy
from sqlq.common.clock import FakeClock
from sqlq.common.engine.memory import MemoryStore
from sqlq.common.errors import ValidationError
from sqlq.common.models import State
from sqlq.common.running import MAX_ERROR_BYTES
from sqlq.common.specs import JobSpec
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.kinds import Registry, task
from sqlq.runtime.service import Service
from tests import hardening_helpers
from tests.hardening_helpers import BARRIER, RELEASE, STUCK, dead_after, handlers
from tests.helpers import ServiceFactory, final, submit, wait_for

runtimes = hardening_helpers.runtimes  # the fixture, by its name


async def test_an_unencodable_result_fails_the_attempt_not_the_store(
    runtimes: ServiceFactory,
) -> None:
    rt = runtimes()
    await rt.start()
    bad = await submit(rt, "bad_result", max_attempts=3)
    sur = await submit(rt, "surrogate_result", max_attempts=2)
    done = await final(rt, bad.id)
    assert (done.state, done.attempts) == (State.DEAD, 3)
    assert done.last_error == "result is not JSON-serialisable: object"
    done = await final(rt, sur.id)
    assert done.state is State.DEAD
    assert done.last_error is not None
    assert done.last_error.startswith("result is not JSON-serialisable")
    assert rt.readiness() == (True, "ready")
    assert rt.liveness()[0]
    after = await submit(rt, "sleep")  # the store still takes work
    assert (await final(rt, after.id)).state is State.COMPLETED
    assert rt.stats()["unencodable_results"] == 5


async def test_error_text_is_cut_to_4k_and_lone_surrogates_are_stored_escaped(
    runtimes: ServiceFactory,
) -> None:
    rt = runtimes()
    done = await dead_after(rt, "broken_error", max_attempts=2)
    assert done.last_error is not None
    assert done.last_error.startswith("RuntimeError: file \\udcff.txt: éé")
    assert done.last_error.endswith("(truncated)")
    assert len(done.last_error.encode()) <= MAX_ERROR_BYTES
    assert rt.readiness()[0]


async def test_a_plain_half_second_handler_completes_first_time_with_default_flags(
    runtimes: ServiceFactory,
) -> None:
    rt = runtimes(retry=RetryPolicy())  # every other setting at its default too
    assert rt.config.hb_timeout_s == 0.2  # shorter than the handler: it must not matter
    await rt.start()
    jobs = (await rt.submit([JobSpec(kind="half_second") for _ in range(8)]))[0]
    for job in jobs:
        done = await final(rt, job.id)
        assert (done.state, done.attempts, done.result) == (State.COMPLETED, 1, "done")
    assert rt.stats()["workers"]["hung_declared"] == 0


async def test_sync_handlers_get_a_thread_per_worker() -> None:
    """asyncio's default pool has cores + 4 threads; 16 workers must not queue behind 6."""
    BARRIER.reset()
    rt = Service(MemoryStore(), RuntimeConfig(workers=16, max_attempts=1), kinds=handlers())
    await rt.start()
    try:
        jobs = (await rt.submit([JobSpec(kind="together") for _ in range(16)]))[0]
        for job in jobs:
            done = await final(rt, job.id, within=30)
            assert (done.state, done.result) == (State.COMPLETED, "together"), done.last_error
    finally:
        await rt.stop(0)


async def test_a_timed_out_thread_is_abandoned_and_counted(
    runtimes: ServiceFactory, fake_clock: FakeClock
) -> None:
    """On the fake clock, moved by hand: a thread at work holds the autojump back, so each
    attempt's 0.1 s timeout passes when the test says, with no real wait."""
    rt = runtimes(max_abandoned=1, clock=fake_clock)
    await rt.start()
    job = await submit(rt, "stuck_thread", max_attempts=2)
    await wait_for(lambda: len(STUCK) == 1, 10, "the first attempt's thread to start")
    fake_clock.advance(0.2)  # past its timeout: the health loop's next look cuts it off
    await wait_for(lambda: len(STUCK) == 2, 10, "the second attempt's thread to start")
    fake_clock.advance(0.2)
    done = await final(rt, job.id)
    assert done.state is State.DEAD
    assert done.attempts == 2
    assert done.last_error is not None
    assert done.last_error.startswith("timed out")
    stats = rt.stats()["workers"]
    assert stats["abandoned_threads_running"] == 2
    assert stats["timed_out"] == 2
    assert stats["live"] == 4  # replaced
    ok, reason = rt.readiness()
    assert not ok
    assert "abandoned" in reason
    RELEASE.set()  # the threads return; their results are dropped
    await wait_for(lambda: rt.executor.threads.abandoned == 0, 10, "abandoned threads to return")
    assert rt.readiness() == (True, "ready")
    got = await rt.get(done.id)
    assert got is not None
    assert got.result is None  # "late" was never stored


async def test_hung_async_handlers_are_cancelled_so_abandoned_tasks_do_not_pile_up(
    runtimes: ServiceFactory, fake_clock: FakeClock
) -> None:
    rt = runtimes(workers=4, hb_timeout_s=0.05, fault_injection=True, clock=fake_clock)
    await rt.start()
    hanging = (
        await rt.submit(
            [JobSpec(kind="sleep", args={"hang_prob": 1.0}, max_attempts=4) for _ in range(10)]
        )
    )[0]
    timing_out = await submit(rt, "stuck_async", max_attempts=2)
    for job in [*hanging, timing_out]:
        assert (await final(rt, job.id)).state is State.DEAD
    await wait_for(lambda: not rt.pool.abandoned, 5, "cancelled workers to end")
    stats = rt.stats()["workers"]
    assert stats["hung_declared"] == 42
    assert stats["abandoned_still_running"] == 0
    assert stats["live"] == 4
    assert rt.readiness()[0]


async def test_a_handler_with_hb_timeout_is_judged_by_its_heartbeat(
    runtimes: ServiceFactory,
) -> None:
    done = await dead_after(runtimes(), "beats_then_stops", max_attempts=1)
    assert done.last_error is not None
    assert done.last_error.startswith("worker hung: no heartbeat")
    assert done.updated_at - done.created_at >= 0.3  # alive while it beat


def test_task_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="timeout"):
        task(registry=Registry(), timeout=0)
    with pytest.raises(ValueError, match="1 to 128"):
        task(name="k" * 129, registry=Registry())(lambda a: a)


async def test_fault_injection_is_refused_unless_the_server_allows_it(
    runtimes: ServiceFactory,
) -> None:
    rt = runtimes(fault_injection=False)
    await rt.start()
    for name in ("fail_prob", "hang_prob"):
        with pytest.raises(ValidationError) as err:
            await submit(rt, args={name: 0.5})
        assert err.value.field == f"args.{name}"
        assert "--fault-injection" in err.value.message
    await submit(rt, args={"work_ms": 1, "fail_prob": 0.0})  # zero is no injection
    assert rt.stats()["submitted"] == 1
