"""A restart of a durable single-node engine (walq, SQLite) while remote workers hold jobs:
the remotely held job stays running under its lease and its outcome, with the token the
first life issued, is accepted after; a lease that ran out while the server was down
expires at once; a forced cancel's held lease stays held, and cuts the attempt off at the
grace's end. (That an in-process claim is requeued beside them: test_remote_runtime_leases,
with a recovery handed in.)"""

from __future__ import annotations

import dataclasses

from sqlq.common.backoff import FAST_RETRY
from sqlq.common.clock import FakeClock  # (advanced by hand: SQLite's thread looks idle)
from sqlq.common.models import State
from sqlq.common.protocol import FENCED, BeatItem, ClaimRequest, CompleteIn, HeartbeatRequest
from sqlq.common.roles import ADMIN
from sqlq.common.specs import JobSpec
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.kinds import Registry
from sqlq.runtime.remote import CUT_OFF_REASON
from sqlq.runtime.service import Service
from tests.helpers import StoreFactory

CONFIG = RuntimeConfig(workers=0, remote_queues=frozenset({"r"}), seed=1, compact_every_s=0,
                       healthcheck=False, retry=FAST_RETRY)  # fmt: skip


async def test_a_remotely_held_job_survives_a_restart_and_its_outcome_lands_after(
    clock: FakeClock, durable_factory: StoreFactory
) -> None:
    first = Service(durable_factory(clock=clock), CONFIG, kinds=Registry(),
                    clock=clock)  # fmt: skip
    await first.start()
    jobs, _ = await first.submit([JobSpec(kind="k", queue="r") for _ in range(3)])
    long = await first.remote.claim(ClaimRequest(queues=["r"], worker="w1", lease_s=60), ADMIN)
    short = await first.remote.claim(ClaimRequest(queues=["r"], worker="w2", lease_s=5), ADMIN)
    [kept], [lapsing] = long.claims, short.claims
    await first.stop(0)
    clock.advance(10)  # the server is down for 10 s: w2's lease runs out meanwhile

    second = Service(durable_factory(clock=clock), CONFIG, kinds=Registry(),
                     clock=clock)  # fmt: skip
    await second.start()
    try:
        held = await second.get(kept.job.id)
        assert held is not None
        assert (held.state, held.holder, held.lease_until) == (
            State.RUNNING, "worker:w1", kept.lease_until,
        )  # fmt: skip
        r = await second.remote.report(kept.token, CompleteIn(result="after"), ADMIN)
        assert r.state == "completed"
        done = await second.store.get(kept.job.id)
        assert done is not None
        assert (done.state, done.result, done.attempts) == (State.COMPLETED, "after", 1)
        clock.advance(0)  # the lapsed lease's expiry is due at once
        await second.claims.drain()  # (its write is over)
        lapsed = await second.store.get(lapsing.job.id)
        assert lapsed is not None
        assert (lapsed.state, lapsed.attempts, lapsed.last_error) == (
            State.SCHEDULED, 1, "lease expired: worker w2 went silent",
        )  # fmt: skip
        assert (await second.remote.report(lapsing.token, CompleteIn(), ADMIN)).error == FENCED
        clock.advance(1)  # past the retry's backoff
        again = await second.remote.claim(ClaimRequest(queues=["r"], worker="w3", max=5), ADMIN)
        assert {g.job.id for g in again.claims} == {jobs[2].id, lapsing.job.id}
    finally:
        await second.stop(0)


async def test_a_forced_cancel_holds_its_lease_through_a_restart_and_cuts_off_at_the_grace(
    clock: FakeClock, durable_factory: StoreFactory
) -> None:
    """The hold is the stored ``cancel_forced``, not a set in the first life's memory: after
    the restart the worker's heartbeat leaves the lease at the grace's end, and there the job
    ends cancelled, counted as cut off by the forced cancel (not as an expiry)."""
    config = dataclasses.replace(CONFIG, cancel_grace_s=5.0)
    first = Service(durable_factory(clock=clock), config, kinds=Registry(),
                    clock=clock)  # fmt: skip
    await first.start()
    [job], _ = await first.submit([JobSpec(kind="k", queue="r")])
    answer = await first.remote.claim(ClaimRequest(queues=["r"], worker="w1", lease_s=60), ADMIN)
    [g] = answer.claims
    forced = await first.cancel(job.id, force=True)
    grace_end = clock.time() + 5.0
    assert (forced.cancel_forced, forced.lease_until) == (True, grace_end)
    await first.stop(0)
    clock.advance(1)  # down for 1 s: the grace is not over

    second = Service(durable_factory(clock=clock), config, kinds=Registry(),
                     clock=clock)  # fmt: skip
    await second.start()
    try:
        held = await second.get(job.id)
        assert held is not None
        assert (held.state, held.cancel_forced, held.lease_until) == (
            State.RUNNING, True, grace_end,
        )  # fmt: skip
        [hb] = (await second.remote.heartbeat(
            HeartbeatRequest(items=[BeatItem(token=g.token)]), ADMIN)).items  # fmt: skip
        assert (hb.error, hb.lease_until, hb.cancel_requested) == (None, grace_end, True)
        stays = await second.store.get(job.id)
        assert stays is not None
        assert stays.lease_until == grace_end  # (renewed to 60 s, it would end far later)
        clock.advance(grace_end - clock.time())  # the grace's end: the held lease runs out
        await second.claims.drain()  # (the cut-off's write is over)
        done = await second.store.get(job.id)
        assert done is not None
        assert (done.state, done.attempts, done.last_error, done.cancel_forced) == (
            State.CANCELLED, 1, CUT_OFF_REASON, False,
        )  # fmt: skip
        assert (second.remote.counts["cut_off"], second.remote.counts["expired"]) == (1, 0)
        assert (await second.remote.report(g.token, CompleteIn(), ADMIN)).error == FENCED
    finally:
        await second.stop(0)
