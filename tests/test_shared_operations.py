"""Shared mode: the operations API and the dashboard across nodes, and waiting on a job."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

from sqlq.common.clock import SYSTEM_CLOCK
from sqlq.common.models import Job, State
from sqlq.common.store import Fence, Recovery
from sqlq.engines.postgres.store import PostgresStore
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.parts import Parts
from sqlq.runtime.shared import SharedClaims
from tests import shared_helpers
from tests.helpers import final, wait_for
from tests.shared_helpers import STARTED, Node, _api, failing, kinds, submit

nodes = shared_helpers.nodes  # the fixture, by its name
stores = shared_helpers.stores  # the fixture, by its name


async def test_dead_jobs_listed_and_retried_from_another_node(nodes: Node) -> None:
    a = nodes(workers=2, kinds_=failing(), max_attempts=1)
    b = nodes(workers=2, kinds_=failing(), max_attempts=1)
    for rt in (a, b):
        await rt.start()
    async with await _api(a) as ca, await _api(b) as cb:
        ids = [(await ca.post("/jobs", json={"kind": "boom", "args": {}})).json()["id"]
               for _ in range(3)]  # fmt: skip
        for job_id in ids:
            assert (await final(a, job_id)).state is State.DEAD
        listed = (await cb.get("/jobs", params={"state": "dead"})).json()["jobs"]
        assert sorted(j["id"] for j in listed) == sorted(ids)
        r = await cb.post(f"/jobs/{ids[0]}/retry")
        assert (r.status_code, r.json()["state"]) == (200, "scheduled")
        r = await cb.post("/jobs/retry", json={"state": "dead"})
        assert (r.status_code, r.json()["retried"]) == (200, 2)
        for job_id in ids:
            again = await final(b, job_id)
            assert (again.state, again.attempts_total) == (State.DEAD, 1)


async def test_cancel_across_nodes_and_a_running_job_is_asked_to_stop(nodes: Node) -> None:
    gate = asyncio.Event()
    a = nodes(workers=1, kinds_=kinds(gate))
    b = nodes(workers=1, kinds_=kinds(gate))
    for rt in (a, b):
        await rt.start()
    async with await _api(a) as ca, await _api(b) as cb:
        running = (await ca.post("/jobs", json={"kind": "work", "args": {"name": "r1"}})).json()
        await wait_for(lambda: "r1" in STARTED, 10, "r1 to start")
        later = (await ca.post("/jobs", json={"kind": "work", "args": {},
                                              "delay_ms": 60_000})).json()  # fmt: skip
        r = await cb.delete(f"/jobs/{later['id']}")
        assert (r.status_code, r.json()["state"]) == (200, "cancelled")
        r = await cb.delete(f"/jobs/{running['id']}")  # b asks; a holds it, and hears
        assert (r.status_code, r.json()["state"], r.json()["cancel_requested"]) == (
            202, "running", True,
        )  # fmt: skip
        r = await cb.get(f"/jobs/{running['id']}", params={"wait": "10"})
        assert r.json()["state"] == "cancelled"  # its task cancelled on a, waited for on b
        gate.set()


async def test_one_idempotency_key_makes_one_job_across_nodes(nodes: Node) -> None:
    a, b = nodes(workers=1), nodes(workers=1)
    for rt in (a, b):
        await rt.start()
    async with await _api(a) as ca, await _api(b) as cb:
        spec = {"kind": "work", "args": {"name": "once"}, "delay_ms": 60_000}
        sent = [c.post("/jobs", json=spec, headers={"Idempotency-Key": "k-1"})
                for c in (ca, cb, ca, cb, ca, cb)]  # fmt: skip
        replies = await asyncio.gather(*sent)
        assert sorted(r.status_code for r in replies) == [200] * 5 + [201]
        assert len({r.json()["id"] for r in replies}) == 1
        other = {**spec, "args": {"name": "different"}}
        r = await cb.post("/jobs", json=other, headers={"Idempotency-Key": "k-1"})
        assert r.status_code == 409


async def test_the_dashboard_shows_the_nodes_that_share_the_queue(nodes: Node) -> None:
    import httpx

    from sqlq.http.app import create_app

    a, b = nodes(workers=2), nodes(workers=2)
    for rt in (a, b):
        await rt.start()
    await submit(b, 3, delay_ms=60_000, queue="mail")  # on the other node
    app = create_app(a, start_runtime=False)
    transport = httpx.ASGITransport(app=app)
    names = [rt.store.node for rt in (a, b)]  # type: ignore[attr-defined]
    page: list[str] = [""]
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:

        async def both_listed() -> bool:  # a node's row comes with its first lease renewal
            page[0] = (await c.get("/ui/")).text
            return all(f">{name}" in page[0] for name in names)

        await wait_for(both_listed, what="both nodes on the overview")
    html = page[0]
    assert "Nodes sharing the queue" in html
    assert f"{names[0]} (this)" in html
    assert 'id="count-scheduled">3<' in html  # the queue's count, not this node's


# -- waiting on a job (GET /jobs/{id}?wait=) ----------------------------------------------------


async def test_waiters_share_one_poll_and_wake_when_another_node_finishes(
    nodes: Node, pg_db: str
) -> None:
    """Many requests waiting on a node cost one statement per poll between them (not one
    each, every 0.1 s), and each wakes when another node finishes its job."""
    b = nodes(workers=1)
    await b.start()
    other = PostgresStore(pg_db)  # the node that finishes the jobs
    await other.open()
    try:
        now = SYSTEM_CLOCK.time()
        jobs = [Job.new(kind="work", args={}, now=now, ready_at=now + 3600) for _ in range(20)]
        await other.commit(jobs)  # due in an hour: b's claimer leaves them alone
        claimed = {j.id: j for j in await other.claim(20, now + 7200, now + 7200, {})}
        held = [claimed[j.id] for j in jobs]  # other claims them early, for an hour
        gets: Counter[str] = Counter()
        polled: list[int] = []
        get = b.store.get

        async def counted_get(job_id: str) -> Job | None:
            gets[job_id] += 1
            return await get(job_id)

        b.store.get = counted_get  # type: ignore[method-assign]
        store = b.store
        assert isinstance(store, PostgresStore)
        finished = store.finished

        async def counted_finished(ids: Sequence[str]) -> list[Job]:
            polled.append(len(ids))
            return await finished(ids)

        store.finished = counted_finished  # type: ignore[method-assign]
        waited = [*jobs, *jobs[:5]]  # five jobs with two waiters each
        waiters = [asyncio.create_task(b.wait(j.id, 30)) for j in waited]
        await wait_for(lambda: len(polled) >= 3 or max(gets.values(), default=0) > 2, 10,
                       "the waiters to poll a few times")  # fmt: skip
        done = [j.apply(j.complete("elsewhere", now)) for j in held[:10]]
        await other.commit_fenced(
            [j.complete("elsewhere", now) for j in held[:10]], Fence(holder=other.node)
        )
        woken = [j for j in await asyncio.gather(*waiters[:10]) if j is not None]
        assert [(j.state, j.result) for j in woken] == [(State.COMPLETED, "elsewhere")] * 10
        assert {j.id for j in woken} == {j.id for j in done}
        await other.commit_fenced(
            [j.complete("later", now) for j in held[10:]], Fence(holder=other.node)
        )
        rest = await asyncio.gather(*waiters[10:])
        assert all(j is not None and j.state is State.COMPLETED for j in rest)
        assert max(gets.values()) <= 2, gets  # its waiters' own first looks, no more
        assert max(polled, default=0) == 20  # one statement for every job waited on
    finally:
        await other.close()


async def test_a_claim_no_worker_took_is_given_back_and_uncounted_at_stop(stores: Any) -> None:
    """A claim whose worker went away while it was in flight waits for the next taker; a stop
    gives it back, and no longer counts it as running here (or against its queue's cap)."""
    store: PostgresStore = await stores()
    config = RuntimeConfig(lease_s=2.0, poll_s=30.0, listen=False)
    claims = SharedClaims(Parts.of(store, config, clock=SYSTEM_CLOCK, rng=random.Random(1)))
    in_flight, gate = asyncio.Event(), asyncio.Event()
    claim = store.claim

    async def held_claim(*args: Any) -> list[Job]:
        jobs = await claim(*args)
        if jobs:
            in_flight.set()
            await gate.wait()
        return jobs

    store.claim = held_claim  # type: ignore[method-assign,assignment]
    await claims.start(Recovery(jobs=[], running=[], records=0))
    job = Job.new(kind="work", args={}, now=SYSTEM_CLOCK.time())
    await store.commit([job])
    worker = asyncio.create_task(claims.next())
    await asyncio.wait_for(in_flight.wait(), 10)
    worker.cancel()  # the worker is gone before its claim arrives
    gate.set()
    await wait_for(lambda: claims.stats()["shared"]["running_here"] == 1, 10, "the claim")
    await claims.stop()
    assert claims.stats()["shared"]["running_here"] == 0
    await claims.drain()
    back = await store.get(job.id)
    assert back is not None
    # It never started: no attempt counted and no error added (as before the claim).
    assert (back.state, back.attempts, back.last_error, back.errors) == (
        State.SCHEDULED, 0, None, job.errors,
    )  # fmt: skip
    assert back.ready_at == job.ready_at  # its place in line
