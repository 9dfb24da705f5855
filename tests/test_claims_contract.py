"""The running job's contract: one suite of what an attempt may do and what each of its ends
becomes, run over every kind of holder the execution model has, as the store's contract
runs over every engine.

The holders: (local, shared) engines x (node, worker) holders. A *node* holder is this
process's worker pool, driven here through ``Claims`` itself (its ``next``, its ends, the
context's channel) with a stand-in pool that the claims' cancels reach; a *worker* holder
is a remote ``worker:<name>``, driven through the pull protocol's server side
(``Remote``). The local engine is the memory store (``LocalClaims``); the shared one is the
fake shared store that runs the ``SharedStore`` contract beside PostgreSQL
(``tests/remote_fake_shared.py``, ``SharedClaims``). All on the autojumping fake clock.

What differs between holders is said once, in ``Holder``; every test speaks only its verbs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.engine.memory import MemoryStore
from sqlq.common.models import JSON, Job, State
from sqlq.common.protocol import (
    CheckpointIn,
    CompleteIn,
    FailIn,
    Granted,
    ProgressIn,
    ReleaseIn,
    SnoozeIn,
    What,
)
from sqlq.common.running import Progress
from sqlq.runtime.claim import Claim, ClaimResult
from sqlq.runtime.kinds import Registry, task
from sqlq.runtime.service import Service
from sqlq.worker_attempt import job_of
from tests.helpers import ServiceFactory, submit
from tests.remote_fake_shared import RemoteDatabase, RemoteFakeStore
from tests.remote_helpers import beat, claim, report

COMBOS = [("local", "node"), ("local", "worker"), ("shared", "node"), ("shared", "worker")]
REMOTE_QUEUE = "r"
LEASE_S = 30.0


@dataclass
class Attempt:
    """One attempt a holder took: its job as it started, and the holder's own handle."""

    job: Job
    claim: Claim | None = None  # a node's
    token: str = ""  # a worker's


@dataclass
class Pool:
    """A stand-in for the worker pool (``reach.Attempts``): the claims a node's test holds,
    and the cancels the claims told it of."""

    held: dict[str, Claim] = field(default_factory=dict)
    interrupted: list[str] = field(default_factory=list)

    def holding(self, job_id: str) -> Claim | None:
        return self.held.get(job_id)

    def interrupt(self, job_id: str, grace_s: float | None) -> bool:
        if job_id not in self.held:
            return False
        self.interrupted.append(job_id)
        return True

    def lose(self, job_id: str, reason: str) -> bool:
        return self.held.pop(job_id, None) is not None


class Holder:
    """The verbs every test speaks, for one kind of holder on one engine."""

    def __init__(self, rt: Service, kind: str, clock: FakeClock) -> None:
        self.rt, self.kind, self.clock = rt, kind, clock
        self.queue = REMOTE_QUEUE if kind == "worker" else "default"
        self.pool = Pool()
        if kind == "node":
            rt.claims.attach(self.pool)

    async def submit(self, **spec: Any) -> Job:
        return await submit(self.rt, "k", queue=self.queue, **spec)

    async def take(self) -> Attempt:
        if self.kind == "node":
            c = await self.rt.claims.next()
            self.pool.held[c.job.id] = c
            # (the work may start while the claim commits; here, once it is durable)
            assert await c.claimed is ClaimResult.CLAIMED
            return Attempt(c.job, claim=c)
        [g] = await self._claim()
        return Attempt(job_of(g.job), token=g.token)

    async def _claim(self) -> list[Granted]:
        return await claim(self.rt, [self.queue], worker_name="w1", lease_s=LEASE_S)

    async def took_nothing(self) -> bool:
        if self.kind == "node":
            return self.rt.claims.queues_now().get(self.queue) is None or (
                self.rt.claims.queues_now()[self.queue].depth == 0
            )
        return await self._claim() == []

    async def end(self, a: Attempt, what: What) -> None:
        """End ``a`` as ``what`` says (a worker's outcome), and wait until it is written."""
        if self.kind == "worker":
            answer = await report(self.rt, a.token, what)
            assert answer.error is None, answer
            return
        c = a.claim
        assert c is not None
        self.pool.held.pop(c.job.id, None)
        claims = self.rt.claims
        if isinstance(what, CompleteIn):
            claims.completed(c, what.result)
        elif isinstance(what, FailIn):
            claims.failed(c, what.error)
        elif isinstance(what, SnoozeIn):
            claims.snoozed(c, what.delay_s)
        elif isinstance(what, ReleaseIn):
            claims.given_back(c)
        else:
            raise AssertionError(f"not an end: {what!r}")
        await claims.settle()

    async def checkpoint(self, a: Attempt, data: JSON) -> None:
        if self.kind == "worker":
            answer = await report(self.rt, a.token, CheckpointIn(data=data))
            assert answer.error is None, answer
            return
        assert a.claim is not None
        await self.rt.claims.save(a.claim, data)

    async def progress(self, a: Attempt, percent: float, message: str) -> None:
        """Report progress, and wait until the store has it (a heartbeat carries a worker's;
        a node's goes with its own write, or its next renewal in shared mode)."""
        if self.kind == "worker":
            await beat(self.rt, a.token, progress=ProgressIn(percent=percent, message=message))
            return
        c = a.claim
        assert c is not None
        c.progress = Progress(percent=percent, message=message, at=self.clock.time())
        self.rt.claims.progressed(c)
        self.clock.advance(self.rt.config.progress_every_s + 1)
        shared = getattr(self.rt.claims, "renew", None)
        if shared is not None:
            await shared()  # (the renewal carries it)
        await self.rt.claims.settle()

    async def heard_cancel(self, a: Attempt) -> bool:
        """Whether the holder was told its attempt's cancel was asked for."""
        if self.kind == "worker":
            [b] = await beat(self.rt, a.token)
            return bool(b.cancel_requested)
        shared = getattr(self.rt.claims, "renew", None)
        if shared is not None:
            await shared()  # (the fallback, had the NOTIFY been lost)
        return a.job.id in self.pool.interrupted


def _kinds() -> Registry:
    """The kind the tests submit: the holders run it, never the service (no workers)."""
    reg = Registry()

    @task(registry=reg, name="k")
    def k(args: Any) -> Any:
        raise AssertionError("the test's holder ends its attempts itself")

    return reg


@pytest.fixture(params=COMBOS, ids=["-".join(c) for c in COMBOS])
async def holder(
    request: pytest.FixtureRequest, services: ServiceFactory, fake_clock: FakeClock
) -> Holder:
    engine, kind = request.param
    store: Any = MemoryStore(clock=fake_clock)
    if engine == "shared":
        store = RemoteFakeStore(RemoteDatabase(), "n1")
    rt = services(store, clock=fake_clock, kinds=_kinds(), workers=0, all_remote=False,
                  remote_queues=frozenset({REMOTE_QUEUE}), lease_s=LEASE_S)  # fmt: skip
    await rt.start()  # (stopped by ``services`` at teardown)
    return Holder(rt, kind, fake_clock)


async def stored(h: Holder, job_id: str) -> Job:
    job = await h.rt.store.get(job_id)
    assert job is not None
    return job


async def test_a_claim_is_a_durable_attempt_and_a_completion_ends_it(holder: Holder) -> None:
    job = await holder.submit()
    a = await holder.take()
    assert (a.job.id, a.job.state, a.job.attempts) == (job.id, State.RUNNING, 1)
    running = await stored(holder, job.id)
    assert (running.state, running.attempts) == (State.RUNNING, 1)
    await holder.end(a, CompleteIn(result={"ok": True}))
    done = await stored(holder, job.id)
    assert (done.state, done.result, done.attempts) == (State.COMPLETED, {"ok": True}, 1)


async def test_a_failure_retries_then_the_last_one_dead_letters(holder: Holder) -> None:
    job = await holder.submit(max_attempts=2)
    await holder.end(await holder.take(), FailIn(error="RuntimeError: first"))
    again = await stored(holder, job.id)
    assert (again.state, again.attempts, again.last_error) == (
        State.SCHEDULED, 1, "RuntimeError: first",
    )  # fmt: skip
    assert [e.error for e in again.errors] == ["RuntimeError: first"]
    holder.clock.advance(60)  # past its backoff
    await holder.end(await holder.take(), FailIn(error="RuntimeError: second"))
    dead = await stored(holder, job.id)
    assert (dead.state, dead.attempts) == (State.DEAD, 2)
    assert [e.error for e in dead.errors] == ["RuntimeError: first", "RuntimeError: second"]


async def test_a_snooze_gives_the_attempt_back_and_counts_a_snooze(holder: Holder) -> None:
    job = await holder.submit()
    now = holder.clock.time()
    await holder.end(await holder.take(), SnoozeIn(delay_s=45))
    snoozed = await stored(holder, job.id)
    assert (snoozed.state, snoozed.attempts, snoozed.snoozes) == (State.SCHEDULED, 0, 1)
    assert snoozed.ready_at >= now + 45


async def test_a_claim_given_back_unstarted_is_no_attempt(holder: Holder) -> None:
    job = await holder.submit(max_attempts=5)
    await holder.end(await holder.take(), FailIn(error="RuntimeError: once"))
    before = await stored(holder, job.id)
    holder.clock.advance(60)
    await holder.end(await holder.take(), ReleaseIn())
    back = await stored(holder, job.id)
    assert (back.state, back.attempts, back.errors, back.last_error) == (
        State.SCHEDULED, before.attempts, before.errors, before.last_error,
    )  # fmt: skip


async def test_a_checkpoint_is_durable_and_the_next_attempt_starts_from_it(
    holder: Holder,
) -> None:
    job = await holder.submit()
    a = await holder.take()
    await holder.checkpoint(a, {"page": 7})
    running = await stored(holder, job.id)
    assert (running.state, running.checkpoint) == (State.RUNNING, {"page": 7})
    await holder.end(a, FailIn(error="RuntimeError: crash"))
    holder.clock.advance(60)
    b = await holder.take()
    assert (b.job.attempts, b.job.checkpoint) == (2, {"page": 7})
    await holder.end(b, CompleteIn(result=None))
    assert (await stored(holder, job.id)).checkpoint is None  # spent by the success


async def test_progress_reaches_the_store(holder: Holder) -> None:
    job = await holder.submit()
    a = await holder.take()
    await holder.progress(a, 40, "step 2 of 5")
    running = await stored(holder, job.id)
    assert running.progress is not None
    assert (running.progress.percent, running.progress.message) == (40, "step 2 of 5")


async def test_a_cancel_before_the_claim_cancels_and_nothing_is_taken(holder: Holder) -> None:
    job = await holder.submit()
    gone = await holder.rt.cancel(job.id)
    assert gone.state is State.CANCELLED
    assert await holder.took_nothing()
    assert (await stored(holder, job.id)).attempts == 0


async def test_a_cancel_while_it_runs_is_heard_and_turns_its_failure_into_cancelled(
    holder: Holder,
) -> None:
    job = await holder.submit()
    a = await holder.take()
    asked = await holder.rt.cancel(job.id)
    assert (asked.state, asked.cancel_requested_at is not None) == (State.RUNNING, True)
    assert await holder.heard_cancel(a)
    if a.claim is not None:  # a node's attempt ends from the claim the cancel marked
        a.job = a.claim.job
    await holder.end(a, FailIn(error="Cancelled: a cancel of this job was asked for"))
    ended = await stored(holder, job.id)
    assert (ended.state, ended.attempts) == (State.CANCELLED, 1)


async def test_a_success_after_a_cancel_was_asked_for_still_completes(holder: Holder) -> None:
    job = await holder.submit()
    a = await holder.take()
    await holder.rt.cancel(job.id)
    await holder.end(a, CompleteIn(result="made it"))
    done = await stored(holder, job.id)
    assert (done.state, done.result) == (State.COMPLETED, "made it")


async def test_an_end_written_twice_is_refused_the_second_time(holder: Holder) -> None:
    """Fencing: once an attempt has ended, nothing more of it is written."""
    job = await holder.submit()
    a = await holder.take()
    await holder.end(a, CompleteIn(result=1))
    if holder.kind == "worker":
        answer = await report(holder.rt, a.token, FailIn(error="late"))
        assert answer.error == "fenced"
    else:
        assert a.claim is not None
        holder.rt.claims.failed(a.claim, "late")  # the claim is over: its end is fenced
        await holder.rt.claims.settle()
    done = await stored(holder, job.id)
    assert (done.state, done.result, done.errors) == (State.COMPLETED, 1, ())
    assert holder.rt.claims.running_here() == {}  # the attempt was counted out once
