"""Shared mode's side of a running job, on a fake shared store (``tests/fake_shared.py``).

Two nodes over one database: a cancel asked on one reaches the attempt on the other
by NOTIFY, or by its next renewal when the NOTIFY is lost; progress rides on the
renewal. (What a running job does on one node, checkpoints and a cancel asked on the
holding node among it, is the claims contract's: ``test_claims_contract.py``.) The same
on a real PostgreSQL is ``test_running_postgres.py``.
"""

from __future__ import annotations

from typing import Any

from sqlq.common.clock import FakeClock
from sqlq.common.models import State
from sqlq.runtime.kinds import JobContext, Registry, task
from sqlq.runtime.service import Service
from sqlq.runtime.shared import SharedClaims
from tests.fake_shared import Database, FakeSharedStore
from tests.helpers import ServiceFactory, final, submit, wait_for
from tests.remote_fake_shared import LeasedDatabase, LeasedStore
from tests.running_helpers import running


def kinds() -> Registry:
    reg = Registry()

    @task(registry=reg, timeout=None)
    async def long(args: Any, ctx: JobContext) -> Any:
        for i in range(args.get("steps", 10**6)):
            ctx.progress(min(100.0, i / 10))
            await ctx.clock.sleep(0.1)
        return "done"

    return reg


async def two_nodes(
    services: ServiceFactory, clock: FakeClock, db: Database, **config: Any
) -> tuple[Service, Service]:
    """``asker`` has no workers (it only asks); ``holder`` runs every job."""
    asker = services(FakeSharedStore(db, "asker"), clock=clock, kinds=kinds(), workers=0,
                     **config)  # fmt: skip
    holder = services(FakeSharedStore(db, "holder"), clock=clock, kinds=kinds(), workers=2,
                      **config)  # fmt: skip
    await asker.start()
    await holder.start()
    assert isinstance(holder.claims, SharedClaims)
    return asker, holder


async def test_a_cancel_asked_on_one_node_reaches_the_attempt_on_another_by_notify(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    db = Database()
    asker, holder = await two_nodes(services, fake_clock, db, lease_s=60.0)
    job = await submit(asker, "long")
    await running(asker, job.id)
    await wait_for(lambda: holder.pool.holding(job.id) is not None, 10, "a worker holding it")
    asked = await asker.cancel(job.id)
    assert (asked.state, asked.cancel_requested_at is not None) == (State.RUNNING, True)
    done = await final(asker, job.id)
    assert (done.state, done.attempts) == (State.CANCELLED, 1)
    assert done.updated_at - (asked.cancel_requested_at or 0) < 1.0  # not a renewal (15 s)
    assert asker.stats()["cancel_requested"] == 1
    assert holder.stats()["cancelled_running"] == 1


async def test_a_lost_notify_is_made_up_for_by_the_renewal(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    db = Database(notify=False)
    asker, holder = await two_nodes(services, fake_clock, db, lease_s=8.0)
    job = await submit(asker, "long")
    await running(asker, job.id)
    await wait_for(lambda: holder.pool.holding(job.id) is not None, 10, "a worker holding it")
    asked = await asker.cancel(job.id)
    done = await final(asker, job.id)
    assert done.state is State.CANCELLED
    waited = done.updated_at - (asked.cancel_requested_at or 0)
    assert 0 < waited <= 8.0 / 4 + 0.2  # the next renewal (every lease_s / 4), then a beat


async def test_progress_rides_on_the_renewal_and_the_outcome(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    db = Database()
    asker, _ = await two_nodes(services, fake_clock, db, lease_s=4.0)
    job = await submit(asker, "long", args={"steps": 100})  # 10 s, progress every 100 ms
    done = await final(asker, job.id)
    assert done.state is State.COMPLETED
    assert done.progress is not None
    assert done.progress.percent == 9.9  # the latest, with the outcome
    sent = [r[job.id].percent or 0.0 for r in db.renewals if job.id in r]
    assert 3 <= len(sent) <= 10  # one renewal a second at most carried it, not 100 writes
    assert sent == sorted(sent)


async def test_a_renewal_that_finds_the_lease_run_out_stops_the_attempt_at_once(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """The node's lease on a running job lapsed in the database (a pause, a partition
    that healed): its next renewal extends nothing for it and says so, and the attempt
    is cut off then, reporting nothing, not at the end of the lease it thinks it has."""
    db = LeasedDatabase()
    holder = services(LeasedStore(db, "holder"), clock=fake_clock, kinds=kinds(), workers=1,
                      lease_s=60.0)  # fmt: skip
    await holder.start()
    assert isinstance(holder.claims, SharedClaims)
    job = await submit(holder, "long")
    await running(holder, job.id)
    db.node_leases[job.id] = fake_clock.time() - 1  # (the database's view: run out)
    await holder.claims.renew()
    assert holder.pool.busy() == 0  # cut at once
    assert holder.stats()["lease_lost"] == 1
    still = await holder.get(job.id)
    assert still is not None
    assert still.state is State.RUNNING  # nothing reported: the job is a rescuer's now
