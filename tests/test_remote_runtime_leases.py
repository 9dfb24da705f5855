"""A remote worker's leases in local mode: heartbeats renew them (and say when a cancel was
asked for), a lease that runs out goes through the retry policy, a forced cancel holds
the lease to its grace; recovery keeps a remotely held job running; one job's writes take
turns; the workers seen, and what /stats and /metrics count."""

from __future__ import annotations

import asyncio

from sqlq.common.clock import FakeClock
from sqlq.common.engine.memory import MemoryStore
from sqlq.common.models import Job, State
from sqlq.common.protocol import FENCED, CheckpointIn, CompleteIn, FailIn, ProgressIn
from sqlq.common.roles import ADMIN
from sqlq.common.store import Recovery
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.local import LocalClaims
from sqlq.runtime.parts import Parts
from sqlq.runtime.remote import Remote
from sqlq.runtime.seen import WorkersSeen
from tests.helpers import ServiceFactory, submit
from tests.remote_helpers import beat, claim, claim_one, remote_service, report, stored, worker
from tests.running_helpers import HeldStore


async def test_a_heartbeat_renews_the_lease_and_stores_progress(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    job = await submit(rt, "k", queue="r")
    g = await claim_one(rt, lease_s=10)
    for _ in range(5):  # 40 s of 8 s beats under a 10 s lease: it holds throughout
        fake_clock.advance(8)
        [b] = await beat(rt, g.token, progress=ProgressIn(percent=50, message="half"))
        assert (b.lease_until, b.cancel_requested, b.error) == (fake_clock.time() + 10, False, None)
    held = await stored(rt, job.id)
    assert (held.state, held.lease_until) == (State.RUNNING, fake_clock.time() + 10)
    assert held.progress is not None
    assert (held.progress.percent, held.progress.message) == (50.0, "half")
    assert (await report(rt, g.token, CompleteIn())).state == "completed"


async def test_a_heartbeat_answers_each_item_fenced_invalid_or_forbidden(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    await submit(rt, "k", queue="r")
    await submit(rt, "k", queue="r")
    g1, g2 = await claim(rt, max=2)
    await report(rt, g2.token, CompleteIn())
    answers = await beat(rt, g1.token, g2.token, "junk", g1.token)
    assert [(a.token, a.error) for a in answers] == [
        (g1.token, None), (g2.token, FENCED), ("junk", "invalid"), (g1.token, None),
    ]  # fmt: skip
    [other] = await beat(rt, g1.token, who=worker("x", "r2"))
    assert other.error == "forbidden"


async def test_a_heartbeat_reports_a_cancel_asked_for_and_the_outcome_takes_it(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    job = await submit(rt, "k", queue="r")
    g = await claim_one(rt)
    asked = await rt.cancel(job.id)
    assert (asked.state, asked.cancel_requested_at is not None) == (State.RUNNING, True)
    assert (await stored(rt, job.id)).cancel_requested_at is not None  # durable
    [b] = await beat(rt, g.token)
    assert b.cancel_requested
    assert (await report(rt, g.token, FailIn(error="stopped"))).state == "cancelled"
    stats = rt.stats()
    assert (stats["cancel_requested"], stats["cancelled_running"]) == (1, 1)


async def test_a_cancel_of_a_remote_queues_scheduled_job_cancels_it(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    job = await submit(rt, "k", queue="r")
    assert (await rt.cancel(job.id)).state is State.CANCELLED
    assert (await rt.claims.queue("r")).depth == 0
    assert await claim(rt) == []


async def test_a_forced_cancel_holds_the_lease_to_the_grace_and_the_job_ends_cancelled(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock, cancel_grace_s=5.0)
    job = await submit(rt, "k", queue="r")
    g = await claim_one(rt, lease_s=60)
    now = fake_clock.time()
    forced = await rt.cancel(job.id, force=True)
    assert forced.lease_until == now + 5
    fake_clock.advance(2)
    [b] = await beat(rt, g.token)
    assert (b.lease_until, b.cancel_requested) == (now + 5, True)  # not renewed past the grace
    fake_clock.advance(4)
    await asyncio.sleep(0)
    done = await stored(rt, job.id)
    assert (done.state, done.attempts) == (State.CANCELLED, 1)
    assert done.last_error == "cancelled: forced after --cancel-grace"
    assert (rt.stats()["remote"]["cut_off"], rt.stats()["remote"]["expired"]) == (1, 0)
    assert (await report(rt, g.token, CompleteIn())).error == FENCED


async def test_an_expired_lease_counts_an_attempt_and_dead_letters_past_max_attempts(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock, max_attempts=2)
    job = await submit(rt, "k", queue="r")
    await claim_one(rt, lease_s=10)
    fake_clock.advance(10.5)
    await asyncio.sleep(0)
    again = await stored(rt, job.id)
    assert (again.state, again.attempts, again.epoch, again.holder) == (
        State.SCHEDULED, 1, 1, None,
    )  # fmt: skip
    assert again.last_error == "lease expired: worker w1 went silent"
    fake_clock.advance(10)
    await claim_one(rt, worker_name="w2", lease_s=10)
    fake_clock.advance(10.5)
    await asyncio.sleep(0)
    dead = await stored(rt, job.id)
    assert (dead.state, dead.attempts) == (State.DEAD, 2)
    assert dead.last_error == "lease expired: worker w2 went silent"
    stats = rt.stats()
    assert (stats["remote"]["expired"], stats["jobs"]["dead"]) == (2, 1)
    assert stats["retried"] == 1
    assert {w.name: w.held for w in rt.remote.workers().workers} == {"w1": 0, "w2": 0}


def _running(job: Job, holder: str | None, lease_until: float | None, now: float) -> Job:
    return job.apply(job.start(now, holder=holder, lease_until=lease_until))


async def test_recovery_keeps_a_remotely_held_job_running_and_requeues_an_in_process_one(
    fake_clock: FakeClock,
) -> None:
    """A store's recovery handed in: a remote claim with its lease to run, one whose lease
    ran out while the server was down, and an in-process claim."""
    now = fake_clock.time()
    store = MemoryStore(clock=fake_clock)
    await store.open()
    jobs = [Job.new(kind="k", args={}, now=now - 100, queue="r") for _ in range(3)]
    await store.commit(jobs)
    held = _running(jobs[0], "worker:w1", now + 20, now - 10)
    lapsed = _running(jobs[1], "worker:w1", now - 1, now - 31)
    local = _running(jobs[2], None, None, now - 5)
    for before, after in zip(jobs, (held, lapsed, local), strict=True):
        await store.commit([before.start(after.started_at or now, holder=after.holder,
                                         lease_until=after.lease_until)])  # fmt: skip
    config = RuntimeConfig(workers=0, all_remote=False, remote_queues=frozenset({"r"}), seed=1)
    parts = Parts.of(store, config, clock=fake_clock, rng=__import__("random").Random(1))
    claims = LocalClaims(parts)
    remote = Remote(claims.remote_side, parts)
    found = [held, lapsed, local]
    await claims.start(Recovery(jobs=found, running=[j.id for j in found], records=3))
    await remote.start()
    assert (await store.get(held.id) or held).state is State.RUNNING
    assert (await store.get(local.id) or local).state is State.SCHEDULED  # requeued
    assert claims.remote_side.leases.__len__() >= 1
    fake_clock.advance(0)  # the lapsed lease's timer is due at once
    for _ in range(3):
        await asyncio.sleep(0)
    gone = await store.get(lapsed.id)
    assert gone is not None
    assert (gone.state, gone.last_error) == (State.SCHEDULED, "lease expired: worker w1 went "
                                             "silent")  # fmt: skip
    assert remote.workers().workers == []  # (none heard of since the start)
    assert claims.remote_side.lanes.depth("r") == 2  # the requeued ones wait for a worker
    await claims.stop()
    await claims.drain()


async def test_one_jobs_heartbeat_and_checkpoint_take_turns_and_neither_undoes_the_other(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    store = HeldStore(lambda t: t.state is State.RUNNING and t.checkpoint is None
                      and t.lease_until is not None and t.attempts == 1
                      and t.started_at != t.updated_at, clock=fake_clock)  # fmt: skip
    rt = services(store, clock=fake_clock, remote_queues=frozenset({"r"}), workers=0,
                  all_remote=False)  # fmt: skip
    await rt.start()
    job = await submit(rt, "k", queue="r")
    g = await claim_one(rt, lease_s=10)
    fake_clock.advance(1)
    beating = asyncio.create_task(beat(rt, g.token))
    await store.held.wait()  # the heartbeat's renewal is being written
    saving = asyncio.create_task(report(rt, g.token, CheckpointIn(data={"at": 1})))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not saving.done()  # its turn comes after the heartbeat's
    store.pick = None
    store.gate.set()
    [b] = await beating
    assert (await saving).state == "running"
    final = await stored(rt, job.id)
    assert final.checkpoint == {"at": 1}
    assert final.lease_until == b.lease_until  # the checkpoint kept the renewed lease


async def test_a_stop_leaves_remotely_held_jobs_running(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    job = await submit(rt, "k", queue="r")
    await claim_one(rt, lease_s=10)
    store = rt.store
    await rt.stop(0)
    assert isinstance(store, MemoryStore)
    held = store._index.get(job.id)
    assert held is not None
    assert (held.state, held.holder) == (State.RUNNING, "worker:w1")


async def test_workers_seen_are_bounded_and_counted(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    for _ in range(3):
        await submit(rt, "k", queue="r")
    await claim(rt, max=2, worker_name="a")
    fake_clock.advance(1)
    [g] = await claim(rt, ("r", "r2"), worker_name="b", who=worker("pi", "r", "r2"))
    seen = rt.remote.workers().workers
    assert [(w.name, w.principal, w.role, w.held, w.queues) for w in seen] == [
        ("b", "pi", "worker", 1, ["r", "r2"]), ("a", "admin", "admin", 2, ["r"]),
    ]  # fmt: skip
    await report(rt, g.token, CompleteIn())
    assert rt.remote.workers().workers[0].held == 0
    bounded = WorkersSeen(limit=3)
    for i in range(10):
        bounded.saw(f"w{i}", ADMIN, float(i))
    assert [w.name for w in bounded.view().workers] == ["w9", "w8", "w7"]
    assert (bounded.active(60.0), bounded.active(68.5), bounded.active(200.0)) == (3, 1, 0)


async def test_metrics_show_the_remote_calls_and_workers(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    await submit(rt, "k", queue="r")
    g = await claim_one(rt)
    await beat(rt, g.token)
    await report(rt, g.token, CompleteIn())
    text = rt.metrics.exposition().decode()
    assert 'sqlq_remote_total{what="claimed"} 1.0' in text
    assert 'sqlq_remote_total{what="heartbeats"} 1.0' in text
    assert 'sqlq_remote_total{what="complete"} 1.0' in text
    assert 'sqlq_remote_workers{status="seen"} 1.0' in text
    assert 'sqlq_jobs_total{event="remote_claimed",kind="k",queue="r"} 1.0' in text
    remote = rt.stats()["remote"]
    assert (remote["queues"], remote["workers_seen"], remote["claims"]) == (["r", "r2"], 1, 1)


def test_a_forgotten_worker_takes_its_held_count_with_it() -> None:
    seen = WorkersSeen(limit=2)
    for name in ("w1", "w2", "w3"):
        seen.saw(name, ADMIN, 0.0)
        seen.took(name, 2)
    assert dict(seen.held) == {"w2": 2, "w3": 2}
    assert [w.name for w in seen.view().workers] == ["w3", "w2"]
