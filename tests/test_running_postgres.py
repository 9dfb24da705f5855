"""Shared mode's side of a running job on a real PostgreSQL: a cancel across nodes, and a
cancel of a job whose node died (its rescue ends it cancelled, not rerun).

These need the PostgreSQL store's side of issue #22 (``request_cancel``, the NOTIFY of a
cancel, the renewal's answer, the statement's cancel rule).
"""

from __future__ import annotations

import asyncio

from sqlq.common.backoff import RetryPolicy
from sqlq.common.clock import FakeClock
from sqlq.common.models import State
from sqlq.runtime.shared import SharedClaims
from tests import shared_helpers
from tests.helpers import NOW, final, wait_for
from tests.shared_helpers import STARTED, Node, kinds, submit

nodes = shared_helpers.nodes  # the fixture, by its name


async def test_a_cancel_asked_on_one_node_stops_the_job_on_another(nodes: Node) -> None:
    gate = asyncio.Event()  # never set: the job runs until it is cancelled
    asker = nodes(workers=0)
    holder = nodes(workers=1, kinds_=kinds(gate))
    await asker.start()
    await holder.start()
    [job] = await submit(asker, args={"name": "long"})
    await wait_for(lambda: STARTED == ["long"], 10, "the holder to start it")
    asked = await asker.cancel(job.id)
    assert (asked.state, asked.cancel_requested_at is not None) == (State.RUNNING, True)
    done = await final(asker, job.id, within=10)
    assert (done.state, done.attempts) == (State.CANCELLED, 1)


async def test_a_cancelled_job_whose_node_died_is_rescued_cancelled(nodes: Node) -> None:
    clock = FakeClock(NOW)
    gate = asyncio.Event()
    dying = nodes(workers=1, kinds_=kinds(gate), lease_s=1.0, clock=clock, listen=False)
    await dying.start()
    [job] = await submit(dying, args={"name": "orphan"})
    await wait_for(lambda: STARTED == ["orphan"], 10, "the job to start")
    assert isinstance(dying.claims, SharedClaims)
    dying.claims.by_hand()  # it dies: no renewal, no rescue, no NOTIFY heard
    rescuer = nodes(workers=1, lease_s=1.0, clock=clock, retry=RetryPolicy(base_s=0, cap_s=0))
    await rescuer.start()
    assert isinstance(rescuer.claims, SharedClaims)
    rescuer.claims.by_hand()
    asked = await rescuer.cancel(job.id)
    assert asked.state is State.RUNNING
    clock.advance(1.5)
    assert await rescuer.claims.rescue() == 1
    done = await final(rescuer, job.id)
    assert (done.state, done.attempts) == (State.CANCELLED, 1)  # not rerun
    assert done.last_error == "lease expired: its node died or was cut off"
    assert STARTED == ["orphan"]
    gate.set()
