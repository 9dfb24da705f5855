"""A model-style check of remote workers in local mode: random claims, heartbeats, outcomes
(stale ones too), cancels and clock jumps, seeded; after every step what was acknowledged
holds in the store, and at the end the live view is the store.

- every acknowledged outcome is durable: the job is in the answered state (a terminal one
  for good), or past it (a new epoch);
- a fenced answer is true: the job was not running at that epoch under a lease;
- no claim is ever granted twice (a job and an epoch);
- an acknowledged heartbeat's lease is the stored one.
"""

from __future__ import annotations

import asyncio
import contextlib
import random

import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.errors import IllegalTransitionError
from sqlq.common.models import TERMINAL, State
from sqlq.common.protocol import (
    FENCED,
    CheckpointIn,
    CompleteIn,
    FailIn,
    Granted,
    ReleaseIn,
    SnoozeIn,
    What,
)
from sqlq.common.specs import JobSpec
from tests.helpers import ServiceFactory
from tests.remote_helpers import beat, claim, remote_service, report, stored

STEPS = 300


def _what(rng: random.Random, n: int) -> What:
    pick = rng.randrange(6)
    if pick == 0:
        return FailIn(error=f"e{n}", retry=rng.random() < 0.7)
    if pick == 1:
        return SnoozeIn(delay_s=rng.choice([0, 1, 5]))
    if pick == 2:
        return ReleaseIn()
    if pick == 3:
        return CheckpointIn(data={"n": n})
    return CompleteIn(result={"n": n})


@pytest.mark.parametrize("seed", range(6))
async def test_every_acknowledged_remote_outcome_is_in_the_store(
    fake_clock: FakeClock, services: ServiceFactory, seed: int
) -> None:
    rng = random.Random(seed)
    rt = await remote_service(services, fake_clock, max_attempts=3, cancel_grace_s=3.0)
    granted: list[Granted] = []
    issued: set[tuple[str, int]] = set()
    ids: list[str] = []
    for n in range(STEPS):
        op = rng.randrange(10)
        if op <= 1:
            specs = [JobSpec(kind=rng.choice("ab"), queue=rng.choice(["r", "r2"]),
                             delay_ms=rng.choice([None, None, 2000]))
                     for _ in range(rng.randint(1, 4))]  # fmt: skip
            jobs, _ = await rt.submit(specs)
            ids += [j.id for j in jobs]
        elif op <= 3:
            got = await claim(rt, rng.sample(["r", "r2"], rng.randint(1, 2)),
                              worker_name=f"w{rng.randrange(3)}", max=rng.randint(1, 4),
                              lease_s=rng.choice([5.0, 10.0, 20.0]),
                              kinds=rng.choice([None, ["a"]]))  # fmt: skip
            for g in got:
                assert (g.job.id, g.job.epoch) not in issued  # never granted twice
                issued.add((g.job.id, g.job.epoch))
                job = await stored(rt, g.job.id)
                assert (job.state, job.epoch, job.lease_until) == (
                    State.RUNNING, g.job.epoch, g.lease_until,
                )  # fmt: skip
            granted += got
        elif op <= 4 and granted:
            some = rng.sample(granted, min(len(granted), rng.randint(1, 5)))
            for g, b in zip(some, await beat(rt, *(g.token for g in some)), strict=True):
                job = await stored(rt, g.job.id)
                if b.error is None:
                    assert (job.state, job.epoch, job.lease_until) == (
                        State.RUNNING, g.job.epoch, b.lease_until,
                    )  # fmt: skip
                else:
                    assert b.error == FENCED
                    assert job.state is not State.RUNNING or job.epoch != g.job.epoch
        elif op <= 7 and granted:
            g = rng.choice(granted)
            what = _what(rng, n)
            r = await report(rt, g.token, what)
            job = await stored(rt, g.job.id)
            if r.error is None:
                assert r.state is not None
                if r.state in {s.value for s in TERMINAL}:
                    assert job.state.value == r.state
                    if isinstance(what, CompleteIn):
                        assert job.result == what.result
                elif r.state == State.RUNNING.value:
                    assert (job.state, job.epoch) == (State.RUNNING, g.job.epoch)
                    assert isinstance(what, CheckpointIn)
                    assert job.checkpoint == what.data
                else:
                    assert job.epoch > g.job.epoch  # given back or retried: a new epoch
            else:
                assert r.error == FENCED, r
                now = fake_clock.time()
                assert not (job.state is State.RUNNING and job.epoch == g.job.epoch
                            and (job.lease_until or 0) >= now)  # fmt: skip
        elif op == 8 and ids:
            job_id = rng.choice(ids)
            with contextlib.suppress(IllegalTransitionError):  # finished: refused, as in process
                await rt.cancel(job_id, force=rng.random() < 0.5)
        else:
            fake_clock.advance(rng.choice([0.5, 1.0, 2.0, 6.0, 12.0]))
            for _ in range(3):
                await asyncio.sleep(0)  # expiries run
    await rt.remote.drain()
    counted = rt.stats()["remote"]
    assert (counted["claimed"] > 20, counted["complete"] > 2, counted["fenced"] > 0) == (
        True, True, True,
    )  # fmt: skip
    for job_id in ids:
        job = await stored(rt, job_id)
        live = rt.live.get(job_id)
        if job.terminal:
            assert live is None
        else:
            assert live == job  # the view is the store
