"""A remote worker's leases in local mode: heartbeats renew them, item by item; recovery
keeps a remotely held job running; one job's writes take turns; the workers seen, and
what /stats and /metrics count. (A cancel a heartbeat tells, a forced cancel's grace and
a lease that runs out, the same for every holder: ``test_claims_contract.py``.)"""

from __future__ import annotations

import asyncio

from sqlq.common.clock import FakeClock
from sqlq.common.engine.memory import MemoryStore
from sqlq.common.models import Job, State
from sqlq.common.protocol import FENCED, CheckpointIn, CompleteIn, ProgressIn
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
