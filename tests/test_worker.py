"""``sqlq.Worker`` against a fake of the protocol's server, on the autojumping fake clock:
batched claims and outcomes, the heartbeat's cadence, the backoff while the server is
unreachable and the delivery after, an outcome kept until accepted or fenced, a fenced
heartbeat that stops its attempt, a cancel, a stop that releases unstarted claims, and
the handler's semantics (timeout, snooze, checkpoint, progress, unstorable results)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import AsyncIterator, Container
from contextlib import asynccontextmanager
from typing import Any

import pytest

from sqlq import Cancelled, JobContext, Snooze, task
from sqlq.calls import Invalid, Unauthorized
from sqlq.common.backoff import RetryPolicy
from sqlq.common.clock import FakeClock
from sqlq.common.lease import SKEW_MARGIN
from sqlq.common.models import State
from sqlq.common.protocol import UNAVAILABLE, CompleteIn, FailIn, Reported
from sqlq.runtime.kinds import Registry
from sqlq.worker import (
    CANCELLED_WHILE,
    CARRIED_WITHIN_S,
    INTERRUPTED,
    MAX_REFUSED_CARRIES,
    Worker,
    WorkerError,
)
from sqlq.worker_outbox import Backoff
from tests.helpers import wait_for
from tests.worker_helpers import FakeServer


def make(server: FakeServer, registry: Registry, clock: FakeClock, **options: Any) -> Worker:
    options.setdefault("concurrency", 10)
    return Worker(server, ["default"], registry=registry, clock=clock, rng=random.Random(7),
                  name="w1", **options)  # fmt: skip


def _doubling() -> Registry:
    """A registry of one async kind, ``double``: ``{"n": n}`` -> ``2n``."""
    reg = Registry()

    @task(registry=reg)
    async def double(args: Any) -> Any:
        return args["n"] * 2

    return reg


def _forever(clock: FakeClock, cancelled_at: list[float]) -> Registry:
    """A registry of one async kind, ``forever``: it runs until its task is cancelled, and
    notes when (on ``clock``) in ``cancelled_at``."""
    reg = Registry()

    @task(registry=reg)
    async def forever(args: Any) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled_at.append(clock.monotonic())
            raise

    return reg


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    """The worker runs inside the block; stopped (and its end awaited) after it."""
    run = asyncio.create_task(worker.run())
    try:
        yield run
    finally:
        worker.stop()
        await run


async def test_claims_up_to_its_free_slots_and_reports_what_finished_together(
    fake_clock: FakeClock,
) -> None:
    reg = _doubling()
    server = FakeServer(fake_clock)
    ids = [server.submit("double", {"n": i}) for i in range(30)]
    worker = make(server, reg, fake_clock, concurrency=50)
    async with running(worker):
        await server.until(lambda: all(server.state(i) is State.COMPLETED for i in ids))
    assert [server.jobs[i].result for i in ids] == [2 * i for i in range(30)]
    first = server.named("claim")[0]
    assert first.body["max"] == 50
    assert first.body["kinds"] == ["cpu", "double", "sleep"]  # what it runs, no more
    batches = server.named("outcomes")
    assert sum(len(b.body) for b in batches) == 30
    assert len(batches) == 1  # all 30 finished in one turn of the loop: one report
    assert worker.stats["completed"] == 30


async def test_a_busy_queues_next_claim_carries_the_outcomes_of_the_last_round(
    fake_clock: FakeClock,
) -> None:
    reg = _doubling()
    server = FakeServer(fake_clock)
    ids = [server.submit("double", {"n": i}) for i in range(35)]
    worker = make(server, reg, fake_clock, concurrency=10)
    async with running(worker):
        await server.until(lambda: all(server.state(i) is State.COMPLETED for i in ids))
    assert [server.jobs[i].result for i in ids] == [2 * i for i in range(35)]
    assert all(server.jobs[i].ends == ["complete"] for i in ids)  # each reported once
    carried, alone = server.named("carried"), server.named("outcomes")
    assert sum(len(c.body) for c in carried + alone) == 35
    # each full claim's round rode the next claim; the last one came back short (5 of
    # 10: the queue looks empty), so the round after it went alone
    assert [len(c.body) for c in carried] == [10, 10, 10]
    assert [len(c.body) for c in alone] == [5]
    assert worker.stats["completed"] == 35


class Refusing(FakeServer):
    """Refuses carried claims (422, naming ``field``): those whose number (from 0) is in
    ``which``, or all."""

    def __init__(self, clock: FakeClock, field: str, which: Container[int] | None = None) -> None:
        super().__init__(clock)
        self.field, self.which, self.asked = field, which, 0

    async def report_and_claim(self, *args: Any, **kwargs: Any) -> Any:
        n, self.asked = self.asked, self.asked + 1
        if self.which is None or n in self.which:
            self._record("carried", args[0])
            raise Invalid(422, "invalid", "refused (test)", self.field)
        return await super().report_and_claim(*args, **kwargs)


async def _each_completed_once(server: FakeServer, clock: FakeClock, jobs: int) -> None:
    """``jobs`` doubling jobs through a worker of 5 slots, each completed exactly once."""
    ids = [server.submit("double", {"n": i}) for i in range(jobs)]
    async with running(make(server, _doubling(), clock, concurrency=5)):
        await server.until(lambda: all(server.state(i) is State.COMPLETED for i in ids))
    assert all(server.jobs[i].ends == ["complete"] for i in ids)


async def test_a_claim_carrying_outcomes_refused_makes_the_worker_send_them_alone(
    fake_clock: FakeClock,
) -> None:
    """An older server refuses the field (422): the worker goes on, and its outcomes go
    by ``/claims/outcomes`` from then on, each once."""
    server = Refusing(fake_clock, "outcomes")
    await _each_completed_once(server, fake_clock, 25)
    assert len(server.named("carried")) == 1  # tried once, then never again
    assert sum(len(c.body) for c in server.named("outcomes")) == 25


async def test_a_carried_outcome_refused_alone_keeps_the_worker_carrying(
    fake_clock: FakeClock,
) -> None:
    """A 422 naming one carried item (not the ``outcomes`` field itself) is that item's
    refusal: those outcomes go alone, and later claims still carry."""
    server = Refusing(fake_clock, "outcomes[0].token", which={0, 2})
    await _each_completed_once(server, fake_clock, 40)
    # refused, carried, refused, and more after: a worker that never reset its count of
    # refusals would stop at the third (two refusals in all)
    assert len(server.named("carried")) > 3


async def test_carried_claims_refused_for_an_item_each_time_end_carrying(
    fake_clock: FakeClock,
) -> None:
    """A server that refuses every carried claim for an item (an older one that knows
    the field but not what is in it, say): the refused outcomes are never carried again,
    and after ``MAX_REFUSED_CARRIES`` refusals in a row no claim carries any."""
    server = Refusing(fake_clock, "outcomes[0].complete")
    await _each_completed_once(server, fake_clock, 40)
    carried = server.named("carried")
    assert len(carried) == MAX_REFUSED_CARRIES
    tokens = [bytes(o) for c in carried for o in c.body]
    assert len(tokens) == len(set(tokens))  # none carried twice


@pytest.mark.parametrize(("answer_in", "abandoned"), [(1.5, False), (5.0, True)])
async def test_a_claim_carrying_outcomes_at_a_hurry_is_awaited_two_seconds(
    fake_clock: FakeClock, answer_in: float, abandoned: bool
) -> None:
    """A carried claim in flight at a stop and a hurry: answered within
    ``CARRIED_WITHIN_S``, its outcomes stand and the jobs it claimed are released; later,
    it is abandoned (cancelled unanswered), and its outcomes go again, alone."""

    class Slow(FakeServer):
        def __init__(self, clock: FakeClock) -> None:
            super().__init__(clock)
            self.asked = asyncio.Event()

        async def report_and_claim(self, *args: Any, **kwargs: Any) -> Any:
            self.asked.set()
            await self.clock.sleep(answer_in)
            return await super().report_and_claim(*args, **kwargs)

    reg = _doubling()
    server = Slow(fake_clock)
    first = [server.submit("double", {"n": i}) for i in range(5)]
    rest = [server.submit("double", {"n": i}) for i in range(5, 10)]
    worker = make(server, reg, fake_clock, concurrency=5, grace_s=30.0)
    run = asyncio.create_task(worker.run())
    await server.asked.wait()  # the first five done, their outcomes riding the next claim
    at = fake_clock.monotonic()
    worker.stop()
    worker.hurry()
    await run
    waited = fake_clock.monotonic() - at
    assert all(server.jobs[i].ends == ["complete"] for i in first)  # once, either way
    if abandoned:
        assert CARRIED_WITHIN_S <= waited < answer_in
        assert len(server.named("carried")) == 0  # cancelled before the server applied it
        assert sum(len(c.body) for c in server.named("outcomes")) == 5  # sent again, alone
        assert all(server.jobs[i].ends == [] for i in rest)  # never claimed
    else:
        assert answer_in <= waited < CARRIED_WITHIN_S + 1.0
        assert all(server.jobs[i].ends == ["release"] for i in rest)  # given back at once
        assert worker.stats["released"] == 5


@pytest.mark.parametrize("answered", [True, False], ids=["unavailable", "no-answer"])
async def test_an_outcome_the_server_could_not_write_goes_again_as_it_was(
    fake_clock: FakeClock, answered: bool
) -> None:
    """``unavailable`` (the store took others of the batch, not this one) is no refusal:
    the completion is kept and sent again after a backoff, never turned into a failure.
    An item the answer leaves out (a server's bug) is kept the same way, not sent again
    at once, over and over."""

    class Flaky(FakeServer):
        missed = 0

        async def outcomes(self, items: Any) -> list[Reported]:
            if not self.missed:
                self.missed += 1
                self._record("outcomes", items)
                return [Reported(token="", error=UNAVAILABLE) for _ in items] if answered else []
            return await super().outcomes(items)

    reg = Registry()

    @task(registry=reg)
    async def one(args: Any) -> Any:
        return "done"

    server = Flaky(fake_clock)
    job = server.submit("one")
    async with running(make(server, reg, fake_clock)):
        await server.until(lambda: server.state(job) is State.COMPLETED)
    assert server.jobs[job].ends == ["complete"]  # no failure reported, no second run
    assert server.jobs[job].result == "done"
    first, second = server.named("outcomes")
    assert second.at > first.at  # after a backoff


async def test_a_full_worker_claims_no_more_than_the_slots_that_free(
    fake_clock: FakeClock,
) -> None:
    reg = Registry()
    gates = {i: asyncio.Event() for i in range(6)}

    @task(registry=reg)
    async def gated(args: Any) -> Any:
        await gates[args["i"]].wait()
        return args["i"]

    server = FakeServer(fake_clock)
    ids = [server.submit("gated", {"i": i}) for i in range(6)]
    worker = make(server, reg, fake_clock, concurrency=3, wait_s=0.0)
    async with running(worker):
        await server.until(lambda: worker.held == 3)
        claims_before = len(server.named("claim"))
        await fake_clock.sleep(5)
        assert len(server.named("claim")) == claims_before  # full: it does not ask
        gates[0].set()
        gates[1].set()
        await server.until(lambda: worker.held == 3 and server.state(ids[4]) is State.RUNNING)
        assert server.named("claim")[-1].body["max"] in (1, 2)
        for g in gates.values():
            g.set()
        await server.until(lambda: all(server.state(i) is State.COMPLETED for i in ids))


async def test_one_heartbeat_renews_every_lease_each_third_of_it(fake_clock: FakeClock) -> None:
    reg = Registry()
    gate = asyncio.Event()

    @task(registry=reg)
    async def hold(args: Any) -> None:
        await gate.wait()

    server = FakeServer(fake_clock)
    ids = [server.submit("hold") for _ in range(3)]
    worker = make(server, reg, fake_clock, lease_s=30.0)
    async with running(worker):
        await server.until(lambda: len(server.named("heartbeat")) >= 4)
        beats = server.named("heartbeat")
        assert [round(b.at - a.at, 6) for a, b in itertools.pairwise(beats)] == [10.0] * 3
        assert all(sorted(i.token for i in b.body) == sorted(f"{i}.1" for i in ids)
                   for b in beats)  # fmt: skip
        # 40 s of a 30 s lease: held all along, never fenced.
        assert all(server.state(i) is State.RUNNING for i in ids)
        gate.set()
        await server.until(lambda: all(server.state(i) is State.COMPLETED for i in ids))


async def test_unreachable_it_backs_off_keeps_the_outcome_and_delivers_it_after(
    fake_clock: FakeClock,
) -> None:
    reg = Registry()
    gate = asyncio.Event()

    @task(registry=reg)
    async def work(args: Any) -> str:
        await gate.wait()
        return "done"

    server = FakeServer(fake_clock)
    job = server.submit("work")
    worker = make(server, reg, fake_clock, backoff=Backoff(base_s=0.1, cap_s=2.0))
    async with running(worker):
        await server.until(lambda: server.state(job) is State.RUNNING)
        server.down = True
        gate.set()
        await server.until(lambda: len(server.named("outcomes", ok=False)) >= 8)
        tries = [c.at for c in server.named("outcomes", ok=False)]
        gaps = [b - a for a, b in itertools.pairwise(tries)]
        assert all(0.05 <= g <= 2.0 for g in gaps), gaps  # jittered, capped
        assert gaps[-1] > gaps[0] * 4  # exponential
        assert server.state(job) is State.RUNNING  # nothing landed
        assert worker.owed == 1  # kept
        server.down = False
        await server.until(lambda: server.state(job) is State.COMPLETED)
    assert server.jobs[job].result == "done"
    assert [len(c.body) for c in server.named("outcomes")] == [1]  # delivered once
    assert worker.stats["completed"] == 1


async def test_an_outcome_kept_while_unreachable_is_dropped_once_fenced(
    fake_clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    reg = Registry()

    @task(registry=reg)
    async def quick(args: Any) -> int:
        return 1

    server = FakeServer(fake_clock)
    server.down = True
    job = server.submit("quick")
    worker = make(server, reg, fake_clock)
    caplog.set_level(logging.INFO, "sqlq.worker")
    async with running(worker):
        await server.until(lambda: len(server.named("claim", ok=False)) >= 2)
        server.down = False  # it claims, runs; and the server is gone again at once
        await server.until(lambda: worker.stats["claimed"] == 1)
        server.down = True
        await server.until(lambda: len(server.named("outcomes", ok=False)) >= 3)
        server.fence(job)  # its lease ran out on the server meanwhile
        server.down = False
        await server.until(lambda: worker.stats["fenced"] == 1)
        assert worker.owed == 0
    assert server.jobs[job].ends == []  # never recorded
    assert any(r.levelno == logging.WARNING and "fenced" in r.getMessage()
               for r in caplog.records)  # fmt: skip


async def test_a_fenced_heartbeat_stops_the_attempt_and_reports_nothing(
    fake_clock: FakeClock,
) -> None:
    cancelled_at: list[float] = []
    reg = _forever(fake_clock, cancelled_at)
    server = FakeServer(fake_clock)
    job = server.submit("forever")
    worker = make(server, reg, fake_clock)
    async with running(worker):
        await server.until(lambda: server.state(job) is State.RUNNING)
        server.fence(job)
        await server.until(lambda: len(cancelled_at) == 1)
        assert worker.held == 0
        assert worker.stats["fenced"] == 1
    assert server.named("outcomes") == []
    assert server.jobs[job].ends == []


async def test_a_server_out_of_reach_past_the_lease_stops_the_attempt_unreported(
    fake_clock: FakeClock,
) -> None:
    """A worker that cannot renew stops its attempt before its lease can run out on the
    server (``common.lease``), so the job never runs twice at once past a lease; it reports
    nothing of that attempt, even once the server is back."""
    cancelled_at: list[float] = []
    reg = _forever(fake_clock, cancelled_at)
    server = FakeServer(fake_clock)
    job = server.submit("forever")
    worker = make(server, reg, fake_clock, lease_s=3.0)
    async with running(worker):
        await server.until(lambda: server.state(job) is State.RUNNING)
        server.down = True
        await server.until(lambda: bool(cancelled_at))
        # before the server's lease can run out (and another worker claim it)
        lease_end = server.jobs[job].lease_end
        assert lease_end is not None
        assert lease_end - 3.0 * SKEW_MARGIN <= cancelled_at[0] < lease_end  # and not sooner
        assert worker.stats["lease_lost"] == 1
        assert worker.held == 0
        server.down = False
    assert server.named("outcomes") == []
    assert server.jobs[job].ends == []


async def test_a_cancel_in_the_heartbeat_cancels_an_async_handler(fake_clock: FakeClock) -> None:
    reg = Registry()

    @task(registry=reg)
    async def forever(args: Any) -> None:
        await asyncio.Event().wait()

    server = FakeServer(fake_clock)
    job = server.submit("forever")
    worker = make(server, reg, fake_clock)
    async with running(worker):
        await server.until(lambda: server.state(job) is State.RUNNING)
        server.ask_cancel(job)
        await server.until(lambda: server.state(job) is State.CANCELLED)
    assert server.jobs[job].last_error == CANCELLED_WHILE


async def test_a_cancel_sets_ctx_cancelled_for_a_plain_handler(fake_clock: FakeClock) -> None:
    reg = Registry()
    started = asyncio.Event()
    loop = asyncio.get_running_loop()

    @task(registry=reg)
    def spin(args: Any, ctx: JobContext) -> None:
        loop.call_soon_threadsafe(started.set)
        while True:
            ctx.raise_if_cancelled()
            ctx.beat()

    server = FakeServer(fake_clock)
    job = server.submit("spin")
    worker = make(server, reg, fake_clock, lease_s=30.0)
    async with running(worker):
        await started.wait()
        server.ask_cancel(job)
        # A thread runs: the clock stands still (the autojump waits for the executor),
        # so the test moves it to the next heartbeat.
        fake_clock.advance(10.0)
        await wait_for(lambda: server.state(job) is State.CANCELLED)
    assert server.jobs[job].last_error == "Cancelled: a cancel of this job was asked for"


async def test_a_stop_releases_what_a_long_poll_brought_after_it(fake_clock: FakeClock) -> None:
    reg = Registry()

    @task(registry=reg)
    async def never(args: Any) -> None:
        raise AssertionError("a released job never starts")

    server = FakeServer(fake_clock)
    worker = make(server, reg, fake_clock, wait_s=10.0)
    run = asyncio.create_task(worker.run())
    await server.until(lambda: len(server.named("claim")) == 1)  # long-polling now
    worker.stop()
    ids = [server.submit("never") for _ in range(2)]  # the poll answers with them
    await run
    assert [server.jobs[i].ends for i in ids] == [["release"], ["release"]]
    assert all(server.jobs[i].attempts == 0 and server.state(i) is State.SCHEDULED for i in ids)
    assert worker.stats["released"] == 2
    assert len(server.named("claim")) == 1  # none after the stop


async def test_a_stop_lets_running_jobs_finish_within_the_grace_then_interrupts(
    fake_clock: FakeClock,
) -> None:
    reg = Registry()

    @task(registry=reg)
    async def nap(args: Any, ctx: JobContext) -> float:
        await ctx.clock.sleep(args["s"])
        return float(args["s"])

    server = FakeServer(fake_clock)
    short, long = server.submit("nap", {"s": 2}), server.submit("nap", {"s": 100})
    worker = make(server, reg, fake_clock, grace_s=5.0)
    run = asyncio.create_task(worker.run())
    await server.until(lambda: worker.held == 2)
    stopped_at = fake_clock.monotonic()
    worker.stop()
    await run
    assert server.state(short) is State.COMPLETED
    assert server.jobs[long].last_error == INTERRUPTED  # an attempt counted: retried
    assert server.state(long) is State.SCHEDULED
    assert fake_clock.monotonic() - stopped_at == pytest.approx(5.0, abs=0.5)


async def test_snooze_checkpoint_and_progress_reach_the_server(fake_clock: FakeClock) -> None:
    reg = Registry()

    @task(registry=reg)
    async def steps(args: Any, ctx: JobContext) -> Any:
        start = ctx.checkpoint_data or 0
        ctx.progress(50, f"from {start}")
        await ctx.checkpoint(start + 1)
        if start == 0:
            raise Snooze(60)
        return {"from": start}

    server = FakeServer(fake_clock)
    job = server.submit("steps")
    worker = make(server, reg, fake_clock)
    async with running(worker):
        await server.until(lambda: server.state(job) is State.COMPLETED)
    j = server.jobs[job]
    assert j.ends == ["snooze", "complete"]
    assert j.result == {"from": 1}
    assert [(p.percent, p.message) for p in j.progress_seen] == [(50, "from 0"), (50, "from 1")]
    assert [c.body["data"] for c in server.named("checkpoint")] == [1, 2]
    assert j.attempts == 1  # the snooze gave its attempt back


async def test_progress_goes_in_a_heartbeat_within_a_second_not_a_lease_third(
    fake_clock: FakeClock,
) -> None:
    reg = Registry()
    gate = asyncio.Event()

    @task(registry=reg)
    async def report(args: Any, ctx: JobContext) -> None:
        await ctx.clock.sleep(0.5)
        ctx.progress(10, "a tenth")
        await gate.wait()

    server = FakeServer(fake_clock)
    job = server.submit("report")
    worker = make(server, reg, fake_clock, lease_s=60.0)
    async with running(worker):
        await server.until(lambda: server.jobs[job].progress is not None)
        beat = server.named("heartbeat")[-1]
        claimed = server.named("claim")[0].at
        assert beat.at - claimed <= 1.5  # not the 20 s of a lease's third
        assert [i.progress is not None for i in beat.body] == [True]
        gate.set()
        await server.until(lambda: server.state(job) is State.COMPLETED)


async def test_a_timeout_cuts_the_attempt_off_and_fails_it(fake_clock: FakeClock) -> None:
    reg = Registry()

    @task(registry=reg, timeout=5)
    async def slow(args: Any, ctx: JobContext) -> None:
        await ctx.clock.sleep(100)

    server = FakeServer(fake_clock)
    job = server.submit("slow", max_attempts=2)
    worker = make(server, reg, fake_clock)
    async with running(worker):
        await server.until(lambda: server.state(job) is State.DEAD)
    assert server.jobs[job].ends == ["fail", "fail"]
    assert (server.jobs[job].last_error or "").startswith("timed out")
    assert worker.stats["cut_off"] == 2


async def test_results_json_cannot_hold_and_bad_args_fail_the_attempt(
    fake_clock: FakeClock,
) -> None:
    reg = Registry()

    @task(registry=reg)
    async def odd(args: Any) -> Any:
        return object()

    @task(registry=reg)
    async def boom(args: Any) -> Any:
        raise ValueError("no")

    server = FakeServer(fake_clock)
    a = server.submit("odd", max_attempts=1)
    b = server.submit("boom", max_attempts=1)
    c = server.submit("sleep", {"work_ms": -1})  # the built-in kind's args, checked here
    worker = make(server, reg, fake_clock)
    async with running(worker):
        await server.until(lambda: all(server.state(i) is State.DEAD for i in (a, b, c)))
    assert (server.jobs[a].last_error or "").startswith("result is not JSON-serialisable")
    assert server.jobs[b].last_error == "ValueError: no"
    assert (server.jobs[c].last_error or "").startswith("invalid job: ")
    sent = [o for call in server.named("outcomes") for o in call.body]
    assert [type(o.what()) for o in sent] == [FailIn, FailIn, FailIn]
    assert not any(isinstance(o.what(), CompleteIn) for o in sent)


async def test_a_cancel_asked_before_the_claim_ends_the_job_unstarted(
    fake_clock: FakeClock,
) -> None:
    reg = Registry()

    @task(registry=reg)
    async def never(args: Any) -> None:
        raise AssertionError("not started")

    server = FakeServer(fake_clock)
    job = server.submit("never", cancel=True)
    async with running(make(server, reg, fake_clock)):
        await server.until(lambda: server.state(job) is State.CANCELLED)
    assert server.jobs[job].ends == ["release"]  # given back: it was no attempt
    assert server.jobs[job].attempts == 0


async def test_a_claim_the_server_refuses_stops_the_worker(fake_clock: FakeClock) -> None:
    class Refusing(FakeServer):
        async def claim(self, *args: Any, **kwargs: Any) -> Any:
            raise Unauthorized(403, "forbidden", "this token may not claim from default")

    reg = Registry()
    worker = make(Refusing(fake_clock), reg, fake_clock)
    with pytest.raises(WorkerError, match="may not claim"):
        await worker.run()


def test_its_options_are_checked() -> None:
    server: Any = None
    with pytest.raises(ValueError, match="processes"):
        Worker(server, concurrency=2, processes=3)
    with pytest.raises(ValueError, match="kinds: no handler for nope"):
        Worker(server, kinds=["nope"], registry=Registry())
    with pytest.raises(ValueError, match="queues"):
        Worker(server, [])


async def test_a_plain_handler_that_raises_cancelled_by_itself_just_fails(
    fake_clock: FakeClock,
) -> None:
    reg = Registry()

    @task(registry=reg)
    async def quits(args: Any) -> None:
        raise Cancelled("changed my mind")

    server = FakeServer(fake_clock)
    job = server.submit("quits", max_attempts=1)
    async with running(make(server, reg, fake_clock)):
        await server.until(lambda: server.state(job) is State.DEAD)
    assert server.jobs[job].last_error == "Cancelled: changed my mind"


async def test_a_hurry_cuts_the_grace_short_and_still_reports_once(fake_clock: FakeClock) -> None:
    reg = Registry()

    @task(registry=reg)
    async def nap(args: Any, ctx: JobContext) -> None:
        await ctx.clock.sleep(100)

    server = FakeServer(fake_clock)
    job = server.submit("nap")
    worker = make(server, reg, fake_clock, grace_s=30.0)
    run = asyncio.create_task(worker.run())
    await server.until(lambda: worker.held == 1)
    at = fake_clock.monotonic()
    worker.stop()
    worker.hurry()
    await run
    assert fake_clock.monotonic() - at < 1.0  # not the 30 s grace
    assert server.jobs[job].last_error == INTERRUPTED  # and the server heard of it
    assert worker.stats["undelivered"] == 0


async def test_a_hurry_during_a_long_poll_abandons_the_claim_quietly(
    fake_clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The claim out at a hurry is not waited for, and its end is no error (it was read
    as an unanswered call's result once, and logged as a failed claim)."""
    server = FakeServer(fake_clock)
    worker = make(server, Registry(), fake_clock, grace_s=30.0, wait_s=20.0)
    run = asyncio.create_task(worker.run())
    await server.until(lambda: len(server.named("claim")) == 1)
    at = fake_clock.monotonic()
    with caplog.at_level(logging.WARNING, logger="sqlq.worker"):
        worker.stop()
        worker.hurry()
        await run
    assert fake_clock.monotonic() - at < 1.0  # neither the grace nor the long poll
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "was not waited for" in caplog.records[0].getMessage()


async def test_a_stop_with_the_server_gone_waits_only_as_long_as_the_leases(
    fake_clock: FakeClock,
) -> None:
    reg = Registry()

    @task(registry=reg)
    async def quick(args: Any) -> int:
        return 1

    server = FakeServer(fake_clock)
    job = server.submit("quick")
    worker = make(server, reg, fake_clock, lease_s=30.0)
    run = asyncio.create_task(worker.run())
    await server.until(lambda: server.state(job) is State.RUNNING)
    server.down = True
    await server.until(lambda: len(server.named("outcomes", ok=False)) >= 1)
    at = fake_clock.monotonic()
    worker.stop()
    await run
    assert fake_clock.monotonic() - at <= 30.0  # the lease's end: no longer worth trying
    assert worker.stats["undelivered"] == 1
    assert server.jobs[job].ends == []


async def test_a_tasks_own_rules_and_traceback_go_in_the_outcome_it_reports(
    fake_clock: FakeClock,
) -> None:
    """For a remote queue the worker applies the task's rules (the server does not know
    the task): its backoff as ``retry_in_s``, final past its ``max_attempts`` or for an
    exception it does not retry; the traceback goes with the error."""
    reg = Registry()

    @task(registry=reg, max_attempts=2, backoff=RetryPolicy(base_s=7.0, jitter=0.0))
    def flaky(n: int) -> None:
        raise ConnectionError(f"down {n}")

    @task(registry=reg, no_retry_on=KeyError)
    def keyed() -> None:
        raise KeyError("to")

    server = FakeServer(fake_clock)
    a = server.submit("flaky", {"n": 1}, max_attempts=5)
    b = server.submit("keyed", {}, max_attempts=5)
    worker = make(server, reg, fake_clock)
    async with running(worker):
        await server.until(lambda: len(server.jobs[a].ends) == 2 and server.jobs[b].ends != [])
    sent = [o.what() for call in server.named("outcomes") for o in call.body]
    fails = [w for w in sent if isinstance(w, FailIn)]
    flaky_fails = [w for w in fails if w.error == "ConnectionError: down 1"]
    # Its first failure: retried after its own backoff; its second, its last of two.
    assert [(w.retry, w.retry_in_s) for w in flaky_fails] == [(True, 7.0), (False, 14.0)]
    first = flaky_fails[0]
    assert first.traceback is not None
    assert "in flaky" in first.traceback
    assert first.traceback.rstrip().endswith("ConnectionError: down 1")
    by_error = {w.error: w for w in fails}
    final = by_error["KeyError: 'to'"]
    assert (final.retry, final.retry_in_s) == (False, None)
