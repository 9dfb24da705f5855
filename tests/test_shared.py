"""Shared mode: several nodes (``Service``s, each with its own store and connections) on one
real PostgreSQL database. What only a shared queue has to get right: claims, leases,
fencing, waking, priorities and caps across nodes, and connections that drop.

The kill -9 of whole nodes and of PostgreSQL itself is in ``test_shared_crash.py``.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import asyncpg
import pytest

from sqlq.common.backoff import RetryPolicy
from sqlq.common.clock import SYSTEM_CLOCK, FakeClock
from sqlq.common.errors import StaleEpochError, UnencodableError
from sqlq.common.models import Job, State
from sqlq.common.specs import JobSpec
from sqlq.common.store import Fence, Recovery
from sqlq.engines.postgres.store import PostgresStore
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.events import Event
from sqlq.runtime.kinds import JobContext, Registry, task
from sqlq.runtime.parts import Parts
from sqlq.runtime.service import Service
from sqlq.runtime.shared import SharedClaims
from tests.helpers import NOW, ServiceFactory, final, wait_for

Node = Callable[..., Service]


def new_job(n: int = 0, **kw: Any) -> Job:
    return Job.new(kind="sleep", args={"n": n}, now=NOW, **kw)


@pytest.fixture
async def stores(pg_db: str) -> AsyncIterator[Callable[..., PostgresStore]]:
    """Open ``PostgresStore``s on one database; closed at teardown."""
    made: list[PostgresStore] = []

    async def make(**options: Any) -> PostgresStore:
        store = PostgresStore(pg_db, **options)
        await store.open()
        made.append(store)
        return store

    yield make  # type: ignore[misc]
    for s in made:
        await s.close()


# -- the store's shared calls ---------------------------------------------------------------


async def test_no_job_is_claimed_twice_by_concurrent_claimers(stores: Any) -> None:
    first = await stores()
    jobs = [new_job(i) for i in range(3000)]
    await first.commit(jobs)
    claimers = [first, *[await stores() for _ in range(7)]]
    got: Counter[str] = Counter()

    async def drain(store: PostgresStore, rng: random.Random) -> None:
        while batch := await store.claim(rng.randint(1, 60), NOW, NOW + 60, {}):
            got.update(j.id for j in batch)
            assert all(j.state is State.RUNNING and j.epoch == 1 for j in batch)

    await asyncio.gather(*(drain(s, random.Random(i)) for i, s in enumerate(claimers)))
    assert set(got) == {j.id for j in jobs}
    assert max(got.values()) == 1, "a job was claimed twice"
    conn = await asyncpg.connect(first.dsn)
    try:
        nodes = await conn.fetchval("SELECT count(DISTINCT node) FROM jobs")
        unowned = await conn.fetchval("SELECT count(*) FROM jobs WHERE node IS NULL")
    finally:
        await conn.close()
    assert (nodes, unowned) == (8, 0)  # every claimer took some, every job has its claimer


async def test_a_claim_takes_priority_then_age_within_a_queue(stores: Any) -> None:
    s = await stores()
    low = [new_job(i, priority=0, ready_at=NOW - 10 + i) for i in range(5)]  # oldest first
    high = new_job(99, priority=5)
    await s.commit([*low, high])
    claimed = await s.claim(3, NOW, NOW + 60, {})
    assert [j.id for j in claimed] == [high.id, low[0].id, low[1].id]


async def test_an_expired_lease_is_rescued_and_the_late_outcome_is_fenced(stores: Any) -> None:
    a, b = await stores(), await stores()
    job = new_job(max_attempts=2)
    await a.commit([job])
    [held] = await a.claim(1, NOW, NOW + 5, {})
    assert await b.expired(NOW + 4, 10) == []  # still leased
    [late] = await b.expired(NOW + 6, 10)
    requeue = late.retry("lease expired", NOW + 6, NOW + 6)
    await b.commit_fenced([requeue], Fence(lease_before=NOW + 6))
    again = await a.get(job.id)
    assert again is not None
    assert (again.state, again.epoch, again.attempts) == (State.SCHEDULED, 2, 1)
    with pytest.raises(StaleEpochError):  # node a comes back with its result: refused
        await a.commit_fenced(
            [held.complete("late", NOW + 7)], Fence(holder=a.node, lease_from=NOW + 7)
        )
    [second] = await b.claim(1, NOW + 7, NOW + 12, {})
    assert (second.epoch, second.attempts) == (3, 2)
    with pytest.raises(StaleEpochError):  # b's lease has run out: its outcome is refused too
        await b.commit_fenced(
            [second.complete(1, NOW + 20)], Fence(holder=b.node, lease_from=NOW + 20)
        )
    await b.commit_fenced([second.complete(1, NOW + 8)], Fence(holder=b.node, lease_from=NOW + 8))
    done = await a.get(job.id)
    assert done is not None
    assert (done.state, done.result) == (State.COMPLETED, 1)


async def test_a_renewed_lease_is_not_rescued(stores: Any) -> None:
    a, b = await stores(), await stores()
    job = new_job()
    await a.commit([job])
    [held] = await a.claim(1, NOW, NOW + 5, {})
    [stale_view] = await b.expired(NOW + 6, 10)
    assert await a.renew(NOW + 4, NOW + 20, [job.id]) == 1  # it lands before the rescue
    with pytest.raises(StaleEpochError):
        await b.commit_fenced(
            [stale_view.retry("lease expired", NOW + 6, NOW + 6)], Fence(lease_before=NOW + 6)
        )
    got = await a.get(job.id)
    assert got is not None
    assert got.state is State.RUNNING
    assert got.epoch == held.epoch


async def test_a_nul_in_a_text_column_fails_only_its_caller(stores: Any) -> None:
    s = await stores()
    good = [new_job(i) for i in range(5)]
    bad = Job.new(kind="nul\x00kind", args={}, now=NOW)
    outcomes = await asyncio.gather(
        *(s.commit([j]) for j in [*good[:2], bad, *good[2:]]), return_exceptions=True
    )
    assert isinstance(outcomes[2], UnencodableError), outcomes
    assert [o for i, o in enumerate(outcomes) if i != 2] == [None] * 5
    assert s.stats().failed is None
    assert await s.get(bad.id) is None


# -- nodes ----------------------------------------------------------------------------------

STARTED: list[str] = []
RUNNING: Counter[str] = Counter()
PEAK: Counter[str] = Counter()


def kinds(gate: asyncio.Event | None = None) -> Registry:
    reg = Registry()

    @task(registry=reg, hb_timeout=None)
    async def work(args: Any, ctx: JobContext) -> Any:
        queue = ctx.job.queue
        STARTED.append(args.get("name", ctx.job.id))
        RUNNING[queue] += 1
        PEAK[queue] = max(PEAK[queue], RUNNING[queue])
        try:
            if gate is not None and args.get("gated", True):
                await gate.wait()
            await asyncio.sleep(args.get("sleep", 0))
        finally:
            RUNNING[queue] -= 1
        return args.get("name", "done")

    return reg


@pytest.fixture
def nodes(services: ServiceFactory, pg_db: str) -> Node:
    STARTED.clear()
    RUNNING.clear()
    PEAK.clear()

    def make(*, kinds_: Registry | None = None, **config: Any) -> Service:
        config.setdefault("retry", RetryPolicy(base_s=0.001, cap_s=0.002))
        config.setdefault("lease_s", 2.0)
        config.setdefault("poll_s", 0.2)
        clock = config.pop("clock", SYSTEM_CLOCK)
        return services(PostgresStore(pg_db, clock=clock), kinds=kinds_ or kinds(), clock=clock,
                        **config)  # fmt: skip

    return make


async def submit(rt: Service, n: int = 1, **spec: Any) -> list[Job]:
    args = spec.pop("args", {})
    return (await rt.submit([JobSpec(kind="work", args=args, **spec) for _ in range(n)]))[0]


async def test_jobs_submitted_to_any_node_run_once_each_across_nodes(nodes: Node) -> None:
    a, b, c = nodes(workers=4), nodes(workers=4), nodes(workers=4)
    for rt in (a, b, c):
        await rt.start()
    jobs = [j for rt in (a, b, c) for j in await submit(rt, 60, args={"sleep": 0.001})]
    for job in jobs:
        assert (await final(a, job.id)).state is State.COMPLETED
    assert len(STARTED) == len(jobs) == len(set(STARTED))  # every job ran, and once
    ran = [rt.claims.stats()["shared"]["claimed"] for rt in (a, b, c)]
    assert sum(ran) == len(jobs), ran


async def test_a_partitioned_node_loses_its_job_and_its_late_result_is_fenced(
    nodes: Node,
) -> None:
    """On the injected clock: the lease runs out when the test says so, not a second later."""
    clock = FakeClock(NOW)
    gate = asyncio.Event()
    a = nodes(workers=1, kinds_=kinds(gate), lease_s=1.0, clock=clock)
    await a.start()
    [job] = await submit(a, args={"name": "first"})
    await wait_for(lambda: STARTED == ["first"], 10, "node a to start the job")
    assert isinstance(a.claims, SharedClaims)
    a.claims.by_hand()  # a is cut off: it keeps working but can no longer renew (nor rescue)
    now = RetryPolicy(base_s=0.0, cap_s=0.0)  # b requeues it due at once: the clock stands
    b = nodes(workers=1, lease_s=1.0, clock=clock, retry=now)  # ungated: b finishes at once
    await b.start()
    assert isinstance(b.claims, SharedClaims)
    b.claims.by_hand()  # b's rescue runs when the test says
    clock.advance(0.9)
    assert await b.claims.rescue() == 0  # a's lease still holds
    clock.advance(0.2)
    assert await b.claims.rescue() == 1  # now it has run out
    done = await final(b, job.id)
    assert (done.state, done.attempts, done.epoch) == (State.COMPLETED, 2, 3)
    gate.set()  # a's handler returns now, long after its lease ran out
    await wait_for(lambda: a.events.totals[Event.FENCED] == 1, 10, "a's late outcome to be fenced")
    again = await b.get(job.id)
    assert again == done  # b's result stands
    requeued = [rt.events.totals[Event.REQUEUED_EXPIRED_LEASE] for rt in (a, b)]
    assert sum(requeued) == 1


async def test_a_job_past_max_attempts_on_expired_leases_is_dead(nodes: Node) -> None:
    clock = FakeClock(NOW)
    gate = asyncio.Event()
    a = nodes(workers=1, kinds_=kinds(gate), clock=clock, lease_s=5.0, max_attempts=1)
    await a.start()
    [job] = await submit(a)
    await wait_for(lambda: len(STARTED) == 1, 10, "the job to start")
    clock.advance(60)  # every lease a holds is long gone, and a cannot have renewed since
    assert isinstance(a.claims, SharedClaims)
    await a.claims.rescue()  # (or its own loop got there first)
    dead = await final(a, job.id)
    assert dead.state is State.DEAD
    assert "lease expired" in (dead.last_error or "")
    assert a.stats()["jobs"]["dead"] == 1
    assert a.events.totals[Event.REQUEUED_EXPIRED_LEASE] == 0  # dead, so not requeued
    gate.set()
    await wait_for(lambda: a.events.totals[Event.FENCED] == 1, 10, "the late outcome to be fenced")


async def test_notify_wakes_an_idle_node_long_before_its_poll(nodes: Node, pg_db: str) -> None:
    a = nodes(workers=2, poll_s=30.0)
    await a.start()
    other = PostgresStore(pg_db)
    await other.open()
    try:
        await wait_for(lambda: a.store._listener is not None, 10, "a to LISTEN")  # type: ignore[attr-defined]
        heard = a.claims.stats()["shared"]["notifications"]
        job = Job.new(kind="work", args={"name": "woken"}, now=SYSTEM_CLOCK.time())
        await other.commit([job])  # another node's submission: only the NOTIFY tells a
        await wait_for(lambda: STARTED == ["woken"], 10, "a to be woken by NOTIFY")
        assert a.claims.stats()["shared"]["notifications"] > heard
    finally:
        await other.close()


async def test_the_poll_finds_work_when_notify_is_lost(nodes: Node, pg_db: str) -> None:
    a = nodes(workers=2, poll_s=0.2, listen=False)  # hears no NOTIFY at all
    await a.start()
    other = PostgresStore(pg_db)
    await other.open()
    try:
        job = Job.new(kind="work", args={"name": "polled"}, now=SYSTEM_CLOCK.time())
        await other.commit([job])
        await wait_for(lambda: STARTED == ["polled"], 10, "a's poll to find the job")
        assert a.claims.stats()["shared"]["notifications"] == 0
    finally:
        await other.close()


async def test_a_delayed_job_runs_when_due_without_waiting_for_the_poll(nodes: Node) -> None:
    """On the injected clock: the claimer arms a timer for the due time (the first deadline,
    before every loop's), and the job runs when the clock reaches it."""
    clock = FakeClock(NOW)
    a = nodes(workers=1, poll_s=30.0, clock=clock)
    await a.start()
    [job] = await submit(a, args={"name": "later"}, delay_ms=300)

    def due_timer() -> bool:
        deadline = clock.next_deadline()
        return deadline is not None and deadline <= clock.monotonic() + 0.3

    await wait_for(due_timer, 10, "the claimer to arm its timer for the due time")
    assert STARTED == []
    clock.advance(0.3)
    done = await final(a, job.id, within=10)
    assert done.started_at is not None
    assert done.started_at >= job.ready_at


async def test_priority_orders_jobs_across_nodes(nodes: Node) -> None:
    a, b = nodes(workers=1), nodes(workers=1)
    for rt in (a, b):
        await rt.start()
    await a.pause("q", True)
    low = [j for i in range(20) for j in await submit(a, queue="q", args={"name": f"low{i}"})]
    [high] = await submit(b, queue="q", priority=9, args={"name": "high"})
    await b.pause("q", False)
    for job in [*low, high]:
        await final(a, job.id)
    assert "high" in STARTED[:2]  # the first claim on either node took it


async def test_a_queue_cap_holds_across_nodes(nodes: Node) -> None:
    a = nodes(workers=4, queue_caps={"mail": 2})
    b = nodes(workers=4, queue_caps={"mail": 2})
    for rt in (a, b):
        await rt.start()
    jobs = [*await submit(a, 8, queue="mail", args={"sleep": 0.05}),
            *await submit(b, 8, queue="mail", args={"sleep": 0.05})]  # fmt: skip
    for job in jobs:
        assert (await final(a, job.id)).state is State.COMPLETED
    assert PEAK["mail"] == 2  # never more than the cap at once, counting both nodes


async def test_a_paused_queue_holds_its_jobs_on_every_node(nodes: Node) -> None:
    a, b = nodes(workers=2), nodes(workers=2)
    for rt in (a, b):
        await rt.start()
    info = await a.pause("reports", True)
    assert info.paused
    jobs = await submit(b, 3, queue="reports")
    [other] = await submit(b, queue="default", args={"name": "free"})
    await final(b, other.id)
    assert STARTED == ["free"]
    assert (await b.queues())["reports"].depth == 3
    await b.pause("reports", False)
    for job in jobs:
        await final(a, job.id)


async def test_a_node_survives_its_connections_being_cut(nodes: Node, pg_db: str) -> None:
    """Every connection of the node is terminated while it works; nothing acknowledged is lost."""
    a = nodes(workers=4)
    await a.start()
    acked: list[Job] = []
    admin = await asyncpg.connect(pg_db)

    async def load() -> None:
        for _ in range(60):
            try:
                acked.extend(await submit(a, 5, args={"sleep": 0.002}))
            except Exception:  # a 503 while the connection is down: not acknowledged
                pass
            await asyncio.sleep(0.01)

    async def cut() -> None:
        for _ in range(3):
            await asyncio.sleep(0.15)
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )

    try:
        await asyncio.gather(load(), cut())
    finally:
        await admin.close()
    assert len(acked) >= 100
    for job in acked:
        assert (await final(a, job.id, within=30)).state is State.COMPLETED
    assert a.store.stats().detail["reconnects"] >= 1
    assert a.readiness()[0]


# -- the operations API across nodes --------------------------------------------------------


async def _api(rt: Service) -> Any:
    import httpx

    from sqlq.http.app import create_app

    transport = httpx.ASGITransport(app=create_app(rt, start_runtime=False))
    return httpx.AsyncClient(transport=transport, base_url="http://localhost")


def failing() -> Registry:
    reg = Registry()

    @task(registry=reg)
    def boom(args: Any) -> Any:
        if args.get("fail", True):
            raise RuntimeError("boom")
        return "fine"

    return reg


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


async def test_cancel_across_nodes_and_a_running_job_is_refused(nodes: Node) -> None:
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
        r = await cb.delete(f"/jobs/{running['id']}")
        assert r.status_code == 409
        gate.set()
        r = await cb.get(f"/jobs/{running['id']}", params={"wait": "10"})
        assert r.json()["state"] == "completed"  # finished on a, waited for on b


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
    assert (back.state, back.last_error) == (State.SCHEDULED, "not started: the node stopped")
