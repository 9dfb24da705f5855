"""``sqlq.Worker`` against the real runtime (``Service.remote``: its fences, leases, expiry
and retry policy) on the memory engine and the fake clock, with nothing between them but
the protocol's structs encoded and decoded as HTTP would: outcomes, progress and
checkpoints land; heartbeats lost until the lease runs out get the attempt expired and
its late outcome fenced, and the rerun completes; a cancel reaches a running remote job;
a stop gives back what it had not started."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import pytest

import sqlq
from sqlq import JobContext, Snooze, task
from sqlq.calls import FencedError, Invalid, Unavailable
from sqlq.common.clock import FakeClock
from sqlq.common.models import State
from sqlq.common.protocol import (
    DEFAULT_LEASE_S,
    Beat,
    BeatItem,
    CheckpointIn,
    ClaimAnswer,
    ClaimRequest,
    Granted,
    HeartbeatRequest,
    Outcome,
    OutcomesRequest,
    ParentsPage,
    Reported,
)
from sqlq.common.roles import ADMIN
from sqlq.runtime.kinds import Registry
from sqlq.runtime.service import Service
from sqlq.worker import Worker
from tests.helpers import ServiceFactory, final
from tests.remote_helpers import remote_service

_decode_outcome = msgspec.json.Decoder(Outcome).decode


def _wire(value: Any, into: type[Any]) -> Any:
    """``value`` through JSON, as the HTTP routes read it."""
    return msgspec.json.decode(msgspec.json.encode(value), type=into)


class Direct:
    """``sqlq.worker.PullClient`` straight onto ``Service.remote``; ``deaf``: heartbeats fail."""

    def __init__(self, rt: Service) -> None:
        self.rt = rt
        self.deaf = False

    async def claim(
        self,
        queues: Sequence[str],
        *,
        worker: str,
        kinds: Sequence[str] | None = None,
        max: int = 1,
        wait_s: float = 0.0,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> list[Granted]:
        named = None if kinds is None else list(kinds)
        req = ClaimRequest(queues=list(queues), worker=worker, kinds=named, max=max,
                           wait_s=wait_s, lease_s=lease_s)  # fmt: skip
        answer = await self.rt.remote.claim(_wire(req, ClaimRequest), ADMIN)
        return list(_wire(answer, type(answer)).claims)

    async def report_and_claim(
        self,
        outcomes: Sequence[Outcome | msgspec.Raw],
        queues: Sequence[str],
        *,
        worker: str,
        kinds: Sequence[str] | None = None,
        max: int = 1,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> ClaimAnswer:
        said = [i if isinstance(i, Outcome) else _decode_outcome(bytes(i)) for i in outcomes]
        named = None if kinds is None else list(kinds)
        req = ClaimRequest(queues=list(queues), worker=worker, kinds=named, max=max,
                           lease_s=lease_s, outcomes=said)  # fmt: skip
        answer = await self.rt.remote.claim(_wire(req, ClaimRequest), ADMIN)
        got: ClaimAnswer = _wire(answer, ClaimAnswer)
        return got

    async def heartbeat(self, items: Sequence[str | BeatItem]) -> list[Beat]:
        if self.deaf:
            raise Unavailable(0, "unreachable", "heartbeats lost (test)")
        beats = [BeatItem(token=i) if isinstance(i, str) else i for i in items]
        answer = await self.rt.remote.heartbeat(
            _wire(HeartbeatRequest(items=beats), HeartbeatRequest), ADMIN
        )
        return list(answer.items)

    async def checkpoint(self, token: str, data: Any) -> Reported:
        reported = await self.rt.remote.report(token, CheckpointIn(data=data), ADMIN)
        if reported.error == "fenced":
            raise FencedError(409, "fenced", "stale")
        if reported.error is not None:
            raise Invalid(422, reported.error, reported.detail or "")
        return reported

    async def parents(self, token: str, start: int = 0) -> ParentsPage:
        got = await self.rt.remote.parents(token, start, ADMIN)
        if isinstance(got, ParentsPage):
            return got
        if got.error == "fenced":
            raise FencedError(409, "fenced", "stale")
        raise Invalid(422, got.error or "invalid", got.detail or "")

    async def outcomes(self, items: Sequence[Outcome | msgspec.Raw]) -> list[Reported]:
        said = [i if isinstance(i, Outcome) else _decode_outcome(bytes(i)) for i in items]
        answer = await self.rt.remote.outcomes(OutcomesRequest(outcomes=said), ADMIN)
        return list(answer.outcomes)


@asynccontextmanager
async def working(
    rt: Service, reg: Registry, clock: FakeClock, **options: Any
) -> AsyncIterator[tuple[Worker, Direct]]:
    direct = Direct(rt)
    worker = Worker(direct, ["r"], registry=reg, clock=clock, rng=random.Random(5),
                    name="rw", **options)  # fmt: skip
    run = asyncio.create_task(worker.run())
    try:
        yield worker, direct
    finally:
        worker.stop()
        await run


async def submit(rt: Service, kind: str, **spec: Any) -> str:
    from sqlq.common.specs import JobSpec

    [job] = (await rt.submit([JobSpec(kind=kind, queue="r", **spec)]))[0]
    return job.id


async def test_outcomes_progress_and_checkpoints_land_in_the_store(
    services: ServiceFactory, fake_clock: FakeClock
) -> None:
    reg = Registry()

    @task(registry=reg)
    async def steps(args: Any, ctx: JobContext) -> Any:
        start = ctx.checkpoint_data or 0
        ctx.progress(40, f"step {start}")
        await ctx.checkpoint(start + 1)
        if start == 0:
            raise Snooze(30)
        return {"from": start}

    @task(registry=reg)
    def boom(args: Any) -> None:
        raise RuntimeError("no")

    rt = await remote_service(services, fake_clock)
    a = await submit(rt, "steps")
    b = await submit(rt, "boom", max_attempts=2)
    async with working(rt, reg, fake_clock):
        done, dead = await final(rt, a, 3600), await final(rt, b, 3600)
    assert (done.state, done.result, done.snoozes, done.checkpoint) == (
        State.COMPLETED, {"from": 1}, 1, None)  # fmt: skip
    assert done.progress is not None
    assert (done.progress.percent, done.progress.message) == (40, "step 1")
    assert (dead.state, dead.attempts, dead.last_error) == (State.DEAD, 2, "RuntimeError: no")
    assert done.holder is None


async def test_lost_heartbeats_stop_the_attempt_at_its_lease_and_the_rerun_stands(
    services: ServiceFactory, fake_clock: FakeClock
) -> None:
    reg = Registry()
    runs: list[int] = []

    @task(registry=reg)
    async def slow(args: Any, ctx: JobContext) -> int:
        runs.append(ctx.job.attempts)
        await ctx.clock.sleep(60 if len(runs) == 1 else 1)  # the first outlives its lease
        return len(runs)

    rt = await remote_service(services, fake_clock)
    job = await submit(rt, "slow", max_attempts=3)
    async with working(rt, reg, fake_clock, lease_s=10.0) as (worker, direct):
        direct.deaf = True  # no heartbeat gets through: the server expires the lease
        done = await final(rt, job, 3600)
        direct.deaf = False
    assert (done.state, done.result) == (State.COMPLETED, 2)  # the rerun's
    assert runs == [1, 2]
    assert any("lease expired" in e.error for e in done.errors)
    # The worker stopped the first attempt itself, before the server's lease ran out, and
    # reported nothing of it (before, it ran on and its late outcome was fenced).
    assert worker.stats["lease_lost"] == 1


async def test_a_cancel_reaches_a_running_remote_job(
    services: ServiceFactory, fake_clock: FakeClock
) -> None:
    reg = Registry()

    @task(registry=reg)
    async def forever(args: Any) -> None:
        await asyncio.Event().wait()

    rt = await remote_service(services, fake_clock)
    job = await submit(rt, "forever")
    async with working(rt, reg, fake_clock) as (worker, _):
        while worker.held == 0:
            await fake_clock.sleep(0.5)
        asked = await rt.cancel(job)
        assert asked.state is State.RUNNING
        done = await final(rt, job, 3600)
    assert done.state is State.CANCELLED


async def test_a_stop_releases_what_it_had_not_started(
    services: ServiceFactory, fake_clock: FakeClock
) -> None:
    reg = Registry()

    @task(registry=reg)
    async def never(args: Any) -> None:
        raise AssertionError("released jobs never start")

    rt = await remote_service(services, fake_clock)
    direct = Direct(rt)
    worker = Worker(direct, ["r"], registry=reg, clock=fake_clock, name="rw", wait_s=20.0)
    run = asyncio.create_task(worker.run())
    while not rt.remote.waiting():  # its claim long-polls in the server
        await fake_clock.sleep(0.1)
    worker.stop()
    ids = [await submit(rt, "never") for _ in range(3)]
    await run
    for job_id in ids:
        job = await rt.get(job_id)
        assert job is not None
        assert (job.state, job.attempts, job.holder) == (State.SCHEDULED, 0, None)
    assert worker.stats["released"] == 3


async def test_a_remote_workers_member_reads_its_parents_as_a_servers_would(
    services: ServiceFactory, fake_clock: FakeClock
) -> None:
    """``ctx.parents`` through ``POST /claims/parents``'s work: the same page, fenced on the
    claim's token (a stale one is refused, and so is a token this server never signed)."""
    from sqlq.common.specs import MemberSpec

    reg = Registry()
    seen: dict[str, Any] = {}

    @task(registry=reg)
    async def step(args: Any, ctx: JobContext) -> Any:
        seen[args["n"]] = {ref: (p.state, p.result) for ref, p in ctx.parents.items()}
        return args["n"] * 2

    rt = await remote_service(services, fake_clock)

    def spec(n: str, *after: str) -> MemberSpec:
        return MemberSpec(kind="step", queue="r", args={"n": n}, ref=n, depends_on=after)

    jobs, _ = await rt.submit([spec("a"), spec("b", "a"), spec("c", "a"), spec("d", "b", "c")],
                              batch=True, workflow=True)  # fmt: skip
    async with working(rt, reg, fake_clock) as (_, direct):
        done = [await final(rt, j.id, 3600) for j in jobs]
        assert [j.state for j in done] == [State.COMPLETED] * 4
        assert seen["a"] == {}
        assert seen["b"] == {"a": (State.COMPLETED, "aa")}
        assert seen["d"] == {"b": (State.COMPLETED, "bb"), "c": (State.COMPLETED, "cc")}
        granted = await direct.claim(["r"], worker="w2")
        assert granted == []
        with pytest.raises(Invalid):
            await direct.parents("not-a-token")


async def test_a_remote_workers_spawn_lands_in_its_completions_commit(
    services: ServiceFactory, fake_clock: FakeClock
) -> None:
    """``sqlq.spawn`` from a remote worker: the jobs ride its ``complete`` and are stored
    with it; one the server refuses fails the attempt instead, as in process."""
    from sqlq.common.specs import MemberSpec

    reg = Registry()

    @task(registry=reg)
    async def leaf(n: int) -> int:
        return n + 1

    @task(registry=reg)
    async def fan(bad: bool = False) -> sqlq.Spawn:
        if bad:
            return sqlq.Spawn(jobs=[{"kind": "leaf", "queue": "r", "priority": "high"}])
        here = leaf.options(queue="r")
        return sqlq.spawn([here.s(n=1), here.s(n=2)], result="spawned")

    rt = await remote_service(services, fake_clock)
    bad = {"bad": True}
    specs = [MemberSpec(kind="fan", queue="r", ref="fan"),
             MemberSpec(kind="fan", queue="r", ref="bad", args=bad, max_attempts=1)]  # fmt: skip
    (fanned, refusing), _ = await rt.submit(specs, batch=True, workflow=True)
    async with working(rt, reg, fake_clock):
        done = await final(rt, fanned.id, 3600)
        assert (done.state, done.result) == (State.COMPLETED, "spawned")
        assert fanned.flow is not None
        members = await rt.store.workflow(fanned.flow.workflow_id)
        leaves = [await final(rt, j.id, 3600) for j in members if j.kind == "leaf"]
        assert sorted(j.result for j in leaves) == [2, 3]
        assert [j.flow.parents if j.flow else () for j in leaves] == [(fanned.id,)] * 2
        refused = await final(rt, refusing.id, 3600)
        assert refused.state is State.DEAD
        assert refused.errors[-1].error.startswith("spawn refused: spawn[0].priority")
