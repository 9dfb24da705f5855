"""A restart of a durable single-node engine (walq, SQLite) while remote workers hold jobs:
the remotely held job stays running under its lease and its outcome, with the token the
first life issued, is accepted after; a lease that ran out while the server was down
expires at once. (That an in-process claim is requeued beside them: test_remote_runtime_leases,
with a recovery handed in.)"""

from __future__ import annotations

from sqlq.common.clock import FakeClock  # (advanced by hand: SQLite's thread looks idle)
from sqlq.common.models import State
from sqlq.common.protocol import FENCED, ClaimRequest, CompleteIn
from sqlq.common.roles import ADMIN
from sqlq.common.specs import JobSpec
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.kinds import Registry
from sqlq.runtime.service import Service
from tests.helpers import StoreFactory

CONFIG = RuntimeConfig(workers=0, remote_queues=frozenset({"r"}), seed=1, compact_every_s=0,
                       healthcheck=False)  # fmt: skip


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
