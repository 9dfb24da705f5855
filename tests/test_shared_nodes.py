"""Shared mode: nodes on one database run each job once, fence late results, share caps."""

from __future__ import annotations

import asyncio

import asyncpg

from sqlq.common.backoff import RetryPolicy
from sqlq.common.clock import SYSTEM_CLOCK, FakeClock
from sqlq.common.models import Job, State
from sqlq.engines.postgres.store import PostgresStore
from sqlq.runtime.events import Event
from sqlq.runtime.shared import SharedClaims
from tests import shared_helpers
from tests.helpers import NOW, final, wait_for
from tests.shared_helpers import PEAK, STARTED, Node, kinds, submit

nodes = shared_helpers.nodes  # the fixture, by its name


async def test_jobs_submitted_to_any_node_run_once_each_across_nodes(nodes: Node) -> None:
    a, b, c = nodes(workers=4), nodes(workers=4), nodes(workers=4)
    for rt in (a, b, c):
        await rt.start()
    jobs = [j for rt in (a, b, c) for j in await submit(rt, 60, args={"sleep": 0.001})]
    for job in jobs:
        assert (await final(a, job.id)).state is State.COMPLETED
    assert len(STARTED) == len(jobs) == len(set(STARTED))  # every job ran, and once
    ran = [rt.view.stats()["shared"]["claimed"] for rt in (a, b, c)]
    assert sum(ran) == len(jobs), ran


async def test_a_partitioned_node_cuts_its_attempt_at_its_lease_and_reports_nothing(
    nodes: Node,
) -> None:
    """On the injected clock: the lease runs out when the test says so, not a second later.
    A node that cannot renew stops its own attempt before any other node may rescue the job
    (``common.lease``), so the job never runs in two places past a lease."""
    clock = FakeClock(NOW)
    gate = asyncio.Event()
    a = nodes(workers=1, kinds_=kinds(gate), lease_s=1.0, clock=clock)
    await a.start()
    [job] = await submit(a, args={"name": "first"})
    await wait_for(lambda: STARTED == ["first"], 10, "node a to start the job")
    assert isinstance(a.claims, SharedClaims)
    a.claims.by_hand()  # a is cut off: it keeps working but can no longer renew (nor rescue)
    await a.claims.stop()  # nor claim
    now = RetryPolicy(base_s=0.0, cap_s=0.0)  # b requeues it due at once: the clock stands
    b = nodes(workers=1, lease_s=1.0, clock=clock, retry=now)  # ungated: b finishes at once
    await b.start()
    assert isinstance(b.claims, SharedClaims)
    b.claims.by_hand()  # b's rescue runs when the test says
    clock.advance(0.85)
    assert await b.claims.rescue() == 0  # a's lease still holds
    assert a.events.totals[Event.LEASE_LOST] == 0  # and a still runs it
    clock.advance(0.1)  # past a's own end of its lease (0.9 s), not yet the store's (1 s)
    await wait_for(lambda: a.events.totals[Event.LEASE_LOST] == 1, 10, "a to cut its attempt")
    assert await b.claims.rescue() == 0  # the store's lease is still a's
    clock.advance(0.1)
    assert await b.claims.rescue() == 1  # now it has run out
    done = await final(b, job.id)
    assert (done.state, done.attempts, done.epoch) == (State.COMPLETED, 2, 3)
    gate.set()  # nothing of a's attempt is left to return
    assert a.events.totals[Event.FENCED] == 0  # a reported nothing
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
    await wait_for(lambda: a.events.totals[Event.LEASE_LOST] == 1, 10, "a to cut its attempt")
    gate.set()
    assert a.events.totals[Event.FENCED] == 0  # the attempt it cut reports nothing


async def test_notify_wakes_an_idle_node_long_before_its_poll(nodes: Node, pg_db: str) -> None:
    a = nodes(workers=2, poll_s=30.0)
    await a.start()
    other = PostgresStore(pg_db)
    await other.open()
    try:
        await wait_for(lambda: a.store._listener is not None, 10, "a to LISTEN")  # type: ignore[attr-defined]
        heard = a.view.stats()["shared"]["notifications"]
        job = Job.new(kind="work", args={"name": "woken"}, now=SYSTEM_CLOCK.time())
        await other.commit([job])  # another node's submission: only the NOTIFY tells a
        await wait_for(lambda: STARTED == ["woken"], 10, "a to be woken by NOTIFY")
        assert a.view.stats()["shared"]["notifications"] > heard
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
        assert a.view.stats()["shared"]["notifications"] == 0
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
