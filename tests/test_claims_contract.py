"""The running job's contract: one suite of what an attempt may do and what each of its ends
becomes, run over every kind of holder the execution model has, as the store's contract
runs over every engine.

The holders: (local, shared) engines x (node, worker) holders. A *node* holder is this
process's worker pool, driven here through ``Claims`` itself (its ``next``, its ends, the
context's channel): the service's own ``WorkerPool`` with no worker task (``HeldPool``), so
a cancel's interrupt, the health loop's cuts (a forced cancel's grace, a lease lost) and the
stop are the pool's own code while the test is the handler; a *worker* holder is a remote
``worker:<name>``, driven through the pull protocol's server side (``Remote``), the test
doing what ``sqlq.Worker`` does. The local engine is the memory store (``LocalClaims``); the
shared one is the fake shared store that runs the ``SharedStore`` contract beside
PostgreSQL (``tests/remote_fake_shared.py``, ``SharedClaims``), with a node's leases made
as real as a remote worker's (``LeasedStore``). All on the autojumping fake clock.

What differs between holders is said once, in ``Holder``; every test speaks only its verbs,
and where a semantic differs between holders, the test's docstring says so and its
expectation (never its steps) is chosen by the holder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from sqlq.common.backoff import Failure
from sqlq.common.clock import FakeClock
from sqlq.common.engine.memory import MemoryStore
from sqlq.common.errors import IllegalTransitionError, JobNotFoundError
from sqlq.common.models import JSON, Job, State
from sqlq.common.protocol import (
    FENCED,
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
from sqlq.common.store import Recovery
from sqlq.runtime.claim import Claim, ClaimResult
from sqlq.runtime.context import AttemptFenced, JobContext
from sqlq.runtime.events import Event
from sqlq.runtime.kinds import Registry, task
from sqlq.runtime.service import Service
from sqlq.runtime.shared import SharedClaims
from sqlq.runtime.workers import WorkerPool, WorkerTask
from sqlq.worker_attempt import job_of
from sqlq.worker_claims import INTERRUPTED
from tests.helpers import ServiceFactory, submit, wait_for
from tests.remote_fake_shared import LeasedDatabase, LeasedStore
from tests.remote_helpers import beat, claim, report

COMBOS = [("local", "node"), ("local", "worker"), ("shared", "node"), ("shared", "worker")]
REMOTE_QUEUE = "r"
LEASE_S = 30.0
GRACE_S = 5.0  # --cancel-grace
NODE_LEASE_LOST = "lease expired: its node died or was cut off"
WORKER_LEASE_LOST = "lease expired: worker w1 went silent"


@dataclass
class Attempt:
    """One attempt a holder took: its job as it started, and the holder's own handle."""

    job: Job
    claim: Claim | None = None  # a node's
    ctx: JobContext | None = None  # a node's, once started
    token: str = ""  # a worker's
    started: bool = True  # False: taken, not started (what a stop gives back)


class HeldPool(WorkerPool):
    """The service's worker pool with no worker task: the test is the handler. An attempt
    the test starts is a ``WorkerTask`` holding its claim and a real context, so the pool's own
    code tells it of a cancel (``interrupt``), cuts it off (the health loop: a forced
    cancel's grace, a lease lost) and stops it. A cut starts no replacement: the test takes
    the next claim itself."""

    def _spawn(self) -> None:
        """(With no size, only a cut's replacement would start here.)"""

    def hold(self, claim: Claim, ctx: JobContext) -> None:
        self.live.append(WorkerTask(next(self._ids), ctx=ctx, claim=claim))

    def ended(self, job_id: str) -> None:
        self.live = [w for w in self.live if w.claim is None or w.claim.job.id != job_id]


class Reopened(MemoryStore):
    """A memory store that opens holding the jobs another one was left with, running ones
    too: what a durable engine's recovery finds after its process stopped."""

    def __init__(self, left: MemoryStore, clock: FakeClock) -> None:
        super().__init__(clock=clock)
        self._left = list(left._index.jobs.values())

    async def open(self) -> Recovery:
        await super().open()
        self._index.replay(self._left)
        live = [j for j in self._left if not j.terminal]
        running = [j.id for j in live if j.state is State.RUNNING]
        return Recovery(jobs=live, running=running, records=len(self._left))


def _kinds() -> Registry:
    """The kind the tests submit: the holders run it, never the service (no workers). No
    limits of its own: only a cancel's grace or a lease cuts an attempt off."""
    reg = Registry()

    @task(registry=reg, name="k", timeout=None, hb_timeout=None)
    def k(args: Any) -> Any:
        raise AssertionError("the test's holder ends its attempts itself")

    return reg


class Holder:
    """The verbs every test speaks, for one kind of holder on one engine."""

    def __init__(self, services: ServiceFactory, engine: str, kind: str, clock: FakeClock) -> None:
        self.services, self.engine, self.kind, self.clock = services, engine, kind, clock
        self.queue = REMOTE_QUEUE if kind == "worker" else "default"
        self.held: dict[str, Attempt] = {}  # taken and not ended, by job id
        self.db = LeasedDatabase(notify=False)  # (one node: it hears by its claim, or renewal)
        store: Any = MemoryStore(clock=clock) if engine == "local" else LeasedStore(self.db, "n1")
        self.rt = self._service(store)
        hb_timeout_s = self.rt.config.hb_timeout_s
        self.pool = HeldPool(self.rt.claims, self.rt.executor, workers=0, clock=clock,
                             hb_timeout_s=hb_timeout_s, healthcheck=True)  # fmt: skip
        self.rt.pool = self.pool
        self.rt.claims.attach(self.pool)

    def _service(self, store: Any) -> Service:
        return self.services(store, clock=self.clock, kinds=_kinds(), workers=0,
                             all_remote=False, remote_queues=frozenset({REMOTE_QUEUE}),
                             lease_s=LEASE_S, cancel_grace_s=GRACE_S)  # fmt: skip

    @property
    def leased(self) -> bool:
        """Whether its attempts run under a lease it may lose: every holder's but a node's on
        a local engine, whose queue is its own process's (``Holding.leased``)."""
        return self.kind == "worker" or self.engine == "shared"

    @property
    def shared(self) -> SharedClaims | None:
        claims = self.rt.claims
        return claims if isinstance(claims, SharedClaims) else None

    def fenced(self) -> int:
        return self.rt.events.totals[Event.FENCED]

    async def submit(self, **spec: Any) -> Job:
        return await submit(self.rt, "k", queue=self.queue, **spec)

    async def take(self, *, start: bool = True) -> Attempt:
        """The next claim; ``start``: its attempt starts (a node's pool holds it)."""
        if self.kind == "node":
            c = await self.rt.claims.next()
            # (the work may start while the claim commits; here, once it is durable)
            assert await c.claimed is ClaimResult.CLAIMED
            a = Attempt(c.job, claim=c, started=start)
            if start:
                a.ctx = self.rt.executor.context(c.job, c, self.rt.claims)
                self.pool.hold(c, a.ctx)
        else:
            [g] = await self._claim()
            a = Attempt(job_of(g.job), token=g.token, started=start)
        self.held[a.job.id] = a
        return a

    async def _claim(self) -> list[Granted]:
        return await claim(self.rt, [self.queue], worker_name="w1", lease_s=LEASE_S)

    async def took_nothing(self) -> bool:
        if self.kind == "node":
            return self.rt.view.queues_now().get(self.queue) is None or (
                self.rt.view.queues_now()[self.queue].depth == 0
            )
        return await self._claim() == []

    async def end(self, a: Attempt, what: What) -> None:
        """End ``a`` as ``what`` says (a worker's outcome), and wait until it is written."""
        self.held.pop(a.job.id, None)
        if self.kind == "worker":
            answer = await report(self.rt, a.token, what)
            assert answer.error is None, answer
            now = await self.rt.store.get(a.job.id)
            assert now is not None
            assert answer.state == now.state.value  # answered once durable, as it stands
            return
        self.pool.ended(a.job.id)
        self._end_claim(a, what)
        await self.rt.claims.settle()

    def _end_claim(self, a: Attempt, what: What) -> None:
        c = a.claim
        assert c is not None
        claims = self.rt.claims
        if isinstance(what, CompleteIn):
            claims.completed(c, what.result)
        elif isinstance(what, FailIn):
            claims.failed(c, Failure(what.error, what.traceback, what.retry, what.retry_in_s))
        elif isinstance(what, SnoozeIn):
            claims.snoozed(c, what.delay_s)
        elif isinstance(what, ReleaseIn):
            claims.given_back(c)
        else:
            raise AssertionError(f"not an end: {what!r}")

    async def end_late(self, a: Attempt, what: What) -> str | None:
        """End ``a`` after its job moved on without it, and assert a definite fence: a worker
        hears ``fenced`` (the detail, returned), a node counts it fenced; nothing is written."""
        self.held.pop(a.job.id, None)
        if self.kind == "worker":
            answer = await report(self.rt, a.token, what)
            assert (answer.error, answer.state) == (FENCED, None), answer
            return answer.detail
        before = self.fenced()
        self._end_claim(a, what)
        await self.rt.claims.settle()
        assert self.fenced() == before + 1
        return None

    async def checkpoint_late(self, a: Attempt, data: JSON) -> None:
        """A checkpoint from ``a`` after its job moved on: refused (a worker hears ``fenced``;
        a node's handler gets ``AttemptFenced``), nothing written."""
        if self.kind == "worker":
            answer = await report(self.rt, a.token, CheckpointIn(data=data))
            assert answer.error == FENCED, answer
            return
        assert a.ctx is not None
        with pytest.raises(AttemptFenced):
            await a.ctx.checkpoint(data)  # (as its handler would, going on after the cut)

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
        if self.shared is not None:
            await self.shared.renew()  # (the renewal carries it)
        await self.rt.claims.settle()

    async def heard_cancel(self, a: Attempt) -> bool:
        """Whether the holder was told its attempt's cancel was asked for."""
        if self.kind == "worker":
            [b] = await beat(self.rt, a.token)
            return bool(b.cancel_requested)
        assert a.ctx is not None  # (the holding node marks its own claim: no NOTIFY, no renewal)
        return a.ctx.cancelled

    async def cut_at(self, a: Attempt) -> float | None:
        """When (wall clock) the holder has been told its attempt will be cut off, or None:
        a worker's lease as its heartbeat renews it; a node's attempt's deadline."""
        if self.kind == "worker":
            [b] = await beat(self.rt, a.token)
            assert b.error is None, b
            return float(b.lease_until)
        assert a.ctx is not None
        if a.ctx.deadline is None:
            return None
        return self.clock.time() + (a.ctx.deadline - self.clock.monotonic())

    async def _moved_on(self, a: Attempt) -> None:
        """Wait until ``a``'s job is no longer running at ``a``'s epoch."""

        async def gone() -> bool:
            now = await self.rt.store.get(a.job.id)
            assert now is not None
            return now.state is not State.RUNNING or now.epoch != a.job.epoch

        await wait_for(gone, 10, f"job {a.job.id} to move on from epoch {a.job.epoch}")

    async def past_grace(self, a: Attempt) -> None:
        """Wait (the clock jumping from one deadline to the next) until ``a``'s attempt is
        cut off: by the node's health loop, or the server that holds a worker's lease."""
        await self._moved_on(a)
        await self.rt.claims.settle()

    async def expire(self, a: Attempt) -> None:
        """The holder goes silent (renews nothing) past its lease, and the rescue runs where
        one runs: any node's in shared mode, the lease heap of a local engine's remote
        leases. A node cuts its own attempt at its end of the lease, reporting nothing. A
        node on a local engine holds no lease: only the time passes."""
        if self.shared is not None:
            self.shared.by_hand()  # no renewal from here on; the test rescues
        self.clock.advance(LEASE_S + 1)
        if self.kind == "node" and self.leased:
            await wait_for(lambda: self.pool.holding(a.job.id) is None, 10, "the node's cut")
        if self.shared is not None:
            assert await self.shared.rescue() == 1
        elif self.leased:
            await self._moved_on(a)

    async def lose(self, a: Attempt) -> None:
        """The job is taken from ``a``'s holder and will run again: a leased holder's lease
        expires (``expire``); a node on a local engine holds none, and its pool cuts the
        attempt off as past its time (as the kind's timeout would), requeueing the job."""
        if self.leased:
            await self.expire(a)
            return
        assert a.ctx is not None
        a.ctx.deadline = self.clock.monotonic()
        self.clock.advance(1)
        await self._moved_on(a)
        await self.rt.claims.settle()

    async def stop(self) -> Service:
        """The holder stops at once (no grace), and the service where its jobs are seen after:
        a claim it took and did not start goes back (a worker: ``/claims/release``; a node's
        pool: ``given_back``, as for a claim that waited for a process at the stop); a
        running attempt is cut off. A worker reports it failed as interrupted (``sqlq
        worker``), the server going on; a node reports nothing, and its job is what the
        next life of a local engine recovers (the memory store reopened), or what another
        node rescues once the node released its leases (shared)."""
        attempts = list(self.held.values())
        if self.kind == "worker":
            for a in attempts:
                await self.end(a, FailIn(error=INTERRUPTED) if a.started else ReleaseIn())
            return self.rt
        for a in attempts:
            if not a.started:
                assert a.claim is not None
                self.rt.claims.given_back(a.claim)
        self.held.clear()
        await self.rt.stop(0)
        if self.engine == "local":
            assert isinstance(self.rt.store, MemoryStore)
            after = self._service(Reopened(self.rt.store, self.clock))
            await after.start()
            return after
        after = self._service(LeasedStore(self.db, "n2"))
        await after.start()
        claims = after.claims
        assert isinstance(claims, SharedClaims)
        claims.by_hand()
        self.clock.advance(1)
        await claims.rescue()
        return after


@pytest.fixture(params=COMBOS, ids=["-".join(c) for c in COMBOS])
async def holder(
    request: pytest.FixtureRequest, services: ServiceFactory, fake_clock: FakeClock
) -> Holder:
    engine, kind = request.param
    h = Holder(services, engine, kind, fake_clock)
    await h.rt.start()  # (stopped by ``services`` at teardown)
    return h


async def stored(h: Holder, job_id: str, rt: Service | None = None) -> Job:
    job = await (rt or h.rt).store.get(job_id)
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
    assert again.ready_at > holder.clock.time()  # its backoff
    assert holder.rt.stats()["retried"] == 1
    holder.clock.advance(60)  # past its backoff
    await holder.end(await holder.take(), FailIn(error="RuntimeError: second"))
    dead = await stored(holder, job.id)
    assert (dead.state, dead.attempts, dead.all_attempts) == (State.DEAD, 2, 2)
    assert [(e.attempt, e.error) for e in dead.errors] == [
        (1, "RuntimeError: first"), (2, "RuntimeError: second"),
    ]  # fmt: skip
    assert dead.errors[0].at < dead.errors[1].at
    assert holder.rt.stats()["jobs"]["dead"] == 1


async def test_a_snooze_gives_the_attempt_back_and_counts_a_snooze(holder: Holder) -> None:
    job = await holder.submit()
    now = holder.clock.time()
    await holder.end(await holder.take(), SnoozeIn(delay_s=45))
    snoozed = await stored(holder, job.id)
    assert (snoozed.state, snoozed.attempts, snoozed.snoozes) == (State.SCHEDULED, 0, 1)
    assert snoozed.ready_at >= now + 45
    assert (snoozed.errors, snoozed.last_error) == ((), None)  # a snooze is not a failure
    assert (holder.rt.stats()["snoozed"], holder.rt.stats()["retried"]) == (1, 0)
    holder.clock.advance(45)
    again = await holder.take()
    assert (again.job.id, again.job.attempts, again.job.snoozes) == (job.id, 1, 1)


async def test_a_snooze_after_a_cancel_was_asked_for_cancels(holder: Holder) -> None:
    """ "Not now" is no answer to a cancel: the job ends cancelled, no snooze counted."""
    job = await holder.submit()
    a = await holder.take()
    await holder.rt.cancel(job.id)
    await holder.end(a, SnoozeIn(delay_s=60))
    done = await stored(holder, job.id)
    assert (done.state, done.snoozes, done.attempts) == (State.CANCELLED, 0, 1)
    assert done.last_error == "cancelled: it snoozed after a cancel was asked for"


async def test_a_claim_given_back_unstarted_is_no_attempt(holder: Holder) -> None:
    """Given back (a worker's release, a node's pool's ``given_back``): due again at once,
    held by nobody, its attempts and errors as before the claim, whatever its history; the
    next taker's attempt is the one counted, and the claim given back is over (fenced).
    Given back after a cancel was asked for, it ends cancelled, still no attempt."""
    job = await holder.submit(max_attempts=5)
    await holder.end(await holder.take(), FailIn(error="RuntimeError: once"))
    before = await stored(holder, job.id)
    holder.clock.advance(60)
    a = await holder.take()
    await holder.end(a, ReleaseIn())
    back = await stored(holder, job.id)
    assert (back.state, back.attempts, back.errors, back.last_error) == (
        State.SCHEDULED, before.attempts, before.errors, before.last_error,
    )  # fmt: skip
    assert (back.holder, back.ready_at <= holder.clock.time()) == (None, True)
    assert holder.rt.stats()["retried"] == 1  # (the failure's; a release is no retry)
    await holder.end_late(a, CompleteIn(result="late"))
    b = await holder.take()
    assert (b.job.id, b.job.attempts) == (job.id, before.attempts + 1)
    await holder.rt.cancel(job.id)  # asked for while it is held: the holder gives it back
    await holder.end(b, ReleaseIn())
    gone = await stored(holder, job.id)
    assert (gone.state, gone.attempts, gone.errors) == (
        State.CANCELLED, before.attempts, before.errors,
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
    """Due or delayed, a job no holder took is cancelled at once: no request, no attempt."""
    later = await holder.submit(delay_ms=60_000)
    job = await holder.submit()
    for waiting in (job, later):
        gone = await holder.rt.cancel(waiting.id)
        assert (gone.state, gone.cancel_requested_at) == (State.CANCELLED, None)
        assert (await stored(holder, waiting.id)).attempts == 0
    assert await holder.took_nothing()
    holder.clock.advance(60)
    assert await holder.took_nothing()
    assert holder.rt.stats()["cancel_requested"] == 0


async def test_a_cancel_while_it_runs_is_heard_and_turns_its_failure_into_cancelled(
    holder: Holder,
) -> None:
    job = await holder.submit()
    a = await holder.take()
    asked_at = holder.clock.time()
    asked = await holder.rt.cancel(job.id)
    assert (asked.state, asked.cancel_requested_at) == (State.RUNNING, asked_at)
    assert (await stored(holder, job.id)).cancel_requested_at == asked_at  # durable first
    assert await holder.heard_cancel(a)
    if a.claim is not None:  # a node's attempt ends from the claim the cancel marked
        a.job = a.claim.job
    await holder.end(a, FailIn(error="Cancelled: a cancel of this job was asked for"))
    ended = await stored(holder, job.id)
    assert (ended.state, ended.attempts, ended.cancel_requested_at) == (
        State.CANCELLED, 1, asked_at,
    )  # fmt: skip
    assert [e.error for e in ended.errors] == ["Cancelled: a cancel of this job was asked for"]
    stats = holder.rt.stats()
    assert (stats["cancel_requested"], stats["cancelled_running"], stats["retried"]) == (1, 1, 0)


async def test_a_success_after_a_cancel_was_asked_for_still_completes(holder: Holder) -> None:
    job = await holder.submit()
    a = await holder.take()
    await holder.rt.cancel(job.id)
    await holder.end(a, CompleteIn(result="made it"))
    done = await stored(holder, job.id)
    assert (done.state, done.result) == (State.COMPLETED, "made it")


async def test_an_end_written_twice_is_refused_the_second_time(holder: Holder) -> None:
    """Fencing: once an attempt has ended, nothing more of it is written; counted as fenced
    (a worker's among the remote calls fenced)."""
    job = await holder.submit()
    a = await holder.take()
    await holder.end(a, CompleteIn(result=1))
    if holder.kind == "worker":
        answer = await report(holder.rt, a.token, FailIn(error="late"))
        assert answer.error == "fenced"
    else:
        assert a.claim is not None
        holder.rt.claims.failed(a.claim, Failure("late"))  # the claim is over: its end is fenced
        await holder.rt.claims.settle()
    done = await stored(holder, job.id)
    assert (done.state, done.result, done.errors) == (State.COMPLETED, 1, ())
    assert holder.rt.view.running_here() == {}  # the attempt was counted out once
    if holder.kind == "worker":
        assert holder.rt.stats()["remote"]["fenced"] == 1
    else:
        assert holder.rt.stats()["fenced"] == 1


async def test_a_cancel_after_the_attempt_ended_is_refused_and_changes_nothing(
    holder: Holder,
) -> None:
    """Completed, dead, or cancelled already: a cancel (forced or not) is refused (409 on
    the wire) and the job stays as it ended; an unknown id is not found (404)."""
    done = await holder.submit()
    await holder.end(await holder.take(), CompleteIn(result=1))
    dead = await holder.submit(max_attempts=1)
    await holder.end(await holder.take(), FailIn(error="RuntimeError: last"))
    gone = await holder.submit()
    assert (await holder.rt.cancel(gone.id)).state is State.CANCELLED
    ended = [await stored(holder, j.id) for j in (done, dead, gone)]
    assert [j.state for j in ended] == [State.COMPLETED, State.DEAD, State.CANCELLED]
    for job in ended:
        for force in (False, True):
            with pytest.raises(IllegalTransitionError):
                await holder.rt.cancel(job.id, force=force)
        assert await stored(holder, job.id) == job
    with pytest.raises(JobNotFoundError):
        await holder.rt.cancel("0" * 32)
    assert holder.rt.stats()["cancel_requested"] == 0


async def test_a_forced_cancel_cuts_the_attempt_off_at_the_grace_and_it_ends_cancelled(
    holder: Holder,
) -> None:
    """Asked for with ``force``, the cancel is heard at once, and the attempt is told it ends
    at the grace's end (a worker: its lease is held there, whatever it renews; a node: its
    deadline); still running then, it is cut off and the job ends cancelled, the attempt
    counted; whatever it reports after is fenced. What the cut records differs: a node's
    health loop says how late the attempt ran (it looks every ``hb_timeout_s / 4``), the
    server that cut a worker's lease (at once) says it was forced."""
    job = await holder.submit()
    a = await holder.take()
    asked_at = holder.clock.time()
    asked = await holder.rt.cancel(job.id, force=True)
    assert (asked.state, asked.cancel_requested_at) == (State.RUNNING, asked_at)
    if holder.kind == "worker":  # the answer shows the lease cut to the grace's end
        assert asked.lease_until == asked_at + GRACE_S
    assert await holder.heard_cancel(a)
    holder.clock.advance(GRACE_S - 1)
    assert await holder.cut_at(a) == pytest.approx(asked_at + GRACE_S, abs=0.01)
    assert (await stored(holder, job.id)).state is State.RUNNING  # the grace runs
    await holder.past_grace(a)
    cut = await stored(holder, job.id)
    assert (cut.state, cut.attempts, cut.cancel_requested_at) == (State.CANCELLED, 1, asked_at)
    look = holder.rt.config.hb_timeout_s / 4 if holder.kind == "node" else 0.0
    assert GRACE_S - 1e-3 <= cut.updated_at - asked_at <= GRACE_S + look + 0.01
    assert cut.last_error is not None
    why = "cancelled: forced after --cancel-grace" if holder.kind == "worker" else (
        "cancelled: still running")  # fmt: skip
    assert cut.last_error.startswith(why), cut.last_error
    assert holder.rt.stats()["cancelled_running"] == 1
    if holder.kind == "worker":  # counted as cut off, not as a lease that expired
        remote = holder.rt.stats()["remote"]
        assert (remote["cut_off"], remote["expired"]) == (1, 0)
    else:
        assert holder.rt.pool.stats()["timed_out"] == 1
    await holder.end_late(a, CompleteIn(result="too late"))
    assert await stored(holder, job.id) == cut


async def test_a_lease_run_out_is_rescued_through_the_retry_policy_and_a_late_end_fenced(
    holder: Holder,
) -> None:
    """A leased holder that goes silent past its lease loses its job: the rescue counts the
    attempt and requeues it with a new epoch (dead on its last attempt), and whatever the
    old holder reports after is fenced. A node on a local engine holds no lease (the queue
    is its process's): however long it is silent, its attempt holds and its end is
    written. The rescue records whose lease it was: a node's or a worker's."""
    job = await holder.submit(max_attempts=2)
    a = await holder.take()
    await holder.expire(a)
    after = await stored(holder, job.id)
    if not holder.leased:
        assert (after.state, after.epoch, after.last_error) == (State.RUNNING, a.job.epoch, None)
        await holder.end(a, CompleteIn(result="held"))
        assert (await stored(holder, job.id)).state is State.COMPLETED
        return
    why = WORKER_LEASE_LOST if holder.kind == "worker" else NODE_LEASE_LOST
    assert (after.state, after.attempts, after.holder, after.last_error) == (
        State.SCHEDULED, 1, None, why,
    )  # fmt: skip
    assert after.epoch > a.job.epoch
    assert [e.error for e in after.errors] == [why]
    await holder.end_late(a, CompleteIn(result="late"))
    assert await stored(holder, job.id) == after
    if holder.kind == "node":  # it cut its own attempt first, and reported nothing of it
        assert holder.rt.events.totals[Event.LEASE_LOST] == 1
    else:
        assert holder.rt.stats()["remote"]["expired"] == 1
    holder.clock.advance(60)  # past its backoff
    b = await holder.take()
    await holder.expire(b)
    dead = await stored(holder, job.id)
    assert (dead.state, dead.attempts, dead.last_error) == (State.DEAD, 2, why)
    assert holder.rt.stats()["jobs"]["dead"] == 1
    if holder.kind == "worker":
        assert holder.rt.stats()["remote"]["expired"] == 2
        assert [w.held for w in holder.rt.remote.workers().workers] == [0]  # none held now


async def test_an_end_from_an_attempt_whose_job_moved_on_is_fenced_and_the_new_one_stands(
    holder: Holder,
) -> None:
    """Fencing: once the job was taken from an attempt and runs again at a new epoch (a
    lease lost; a local node's attempt cut off), the old attempt's end is refused, a
    definite answer (a worker hears ``fenced``, naming the epoch), and the newer attempt's
    end is the one written."""
    job = await holder.submit(max_attempts=3)
    a = await holder.take()
    await holder.checkpoint(a, {"saved": "first"})
    await holder.lose(a)
    holder.clock.advance(60)  # past its backoff
    b = await holder.take()
    assert (b.job.id, b.job.attempts, b.job.checkpoint) == (job.id, 2, {"saved": "first"})
    assert b.job.epoch > a.job.epoch
    fenced = holder.rt.stats()["fenced"]
    for what in (CompleteIn(result="late"), FailIn(error="late"), SnoozeIn(delay_s=1)):
        detail = await holder.end_late(a, what)
        if holder.kind == "worker":
            assert detail is not None
            assert "epoch" in detail
    assert holder.rt.stats()["fenced"] == fenced + 3
    await holder.checkpoint_late(a, {"saved": "stale"})
    running = await stored(holder, job.id)
    assert (running.state, running.epoch, running.snoozes, running.checkpoint) == (
        State.RUNNING, b.job.epoch, 0, {"saved": "first"},
    )  # fmt: skip
    await holder.end(b, CompleteIn(result="fresh"))
    done = await stored(holder, job.id)
    assert (done.state, done.result, done.attempts) == (State.COMPLETED, "fresh", 2)


async def test_at_its_holders_stop_a_claim_not_started_goes_back_with_no_attempt_counted(
    holder: Holder,
) -> None:
    """A claim the holder took and never started (a worker's buffer, a node's claim still
    waiting for a process) is given back when it stops: due at once, its attempts and
    errors as before the claim, no error added."""
    job = await holder.submit(max_attempts=5)
    await holder.end(await holder.take(), FailIn(error="RuntimeError: once"))
    before = await stored(holder, job.id)
    holder.clock.advance(60)  # past its backoff
    a = await holder.take(start=False)
    after = await holder.stop()
    back = await stored(holder, job.id, after)
    assert (back.state, back.attempts, back.errors, back.last_error) == (
        State.SCHEDULED, before.attempts, before.errors, before.last_error,
    )  # fmt: skip
    assert back.ready_at <= holder.clock.time()
    assert back.epoch > a.job.epoch  # the claim's epoch is over


async def test_at_its_holders_stop_a_running_attempt_counts_and_the_job_runs_again(
    holder: Holder,
) -> None:
    """A running attempt its holder stops (past any grace) is never lost nor finished by
    the stop: the attempt counts and the job is due again through the retry policy, or
    ends cancelled if a cancel was asked for. Who writes it differs: a worker reports it
    failed as interrupted; a node reports nothing, and its job is requeued by the next life
    of a local engine's recovery, or by another node's rescue once the stopped node
    released its leases."""
    plain = await holder.submit(max_attempts=3)
    await holder.take()
    asked = await holder.submit(max_attempts=3)
    await holder.take()
    await holder.rt.cancel(asked.id)
    after = await holder.stop()
    again = await stored(holder, plain.id, after)
    node = {"local": "interrupted: the server stopped", "shared": NODE_LEASE_LOST}
    why = node[holder.engine] if holder.kind == "node" else INTERRUPTED
    assert (again.state, again.attempts, again.last_error, again.result) == (
        State.SCHEDULED, 1, why, None,
    )  # fmt: skip
    gone = await stored(holder, asked.id, after)
    assert (gone.state, gone.attempts) == (State.CANCELLED, 1)
