"""The operations API in-process: listing, retry from dead, idempotency keys, priorities, wait."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from sqlq.common.clock import FakeClock
from sqlq.common.models import State
from sqlq.common.specs import JobSpec
from sqlq.http.app import create_app
from sqlq.runtime.events import Event
from tests import operations_helpers
from tests.helpers import NOW, ServiceFactory, final, wait_for
from tests.operations_helpers import STARTED, Client, kinds

api = operations_helpers.api  # the fixture, by its name


async def test_a_high_priority_job_behind_fifty_low_ones_starts_next(api: Client) -> None:
    _rt, c = await api(workers=1)
    r = await c.post("/jobs", json={"kind": "gate", "args": {"name": "blocker"}})
    await wait_for(lambda: STARTED == ["blocker"], 5, "the one worker to be busy")
    for i in range(50):
        await c.post("/jobs", json={"kind": "record", "args": {"name": f"low{i}"}, "priority": 0})
    await c.post("/jobs", json={"kind": "record", "args": {"name": "HIGH"}, "priority": 10})
    operations_helpers.GATE.set()  # the fixture makes a new one per test
    await wait_for(lambda: len(STARTED) == 52, 10, "every job to start")
    assert STARTED[1] == "HIGH"  # the very next to start
    assert STARTED[2:] == [f"low{i}" for i in range(50)]  # equal priorities: FIFO
    assert r.status_code == 201


async def test_listing_pages_with_an_opaque_cursor_and_filters(api: Client) -> None:
    _rt, c = await api()
    ids = []
    for i in range(7):
        body = {"kind": "record", "args": {"name": f"j{i}"}, "delay_ms": 60_000,
                "queue": "mail" if i % 2 else "default"}  # fmt: skip
        ids.append((await c.post("/jobs", json=body)).json()["id"])
    seen: list[str] = []
    url = "/jobs?limit=3"
    while url:
        page = (await c.get(url)).json()
        seen += [j["id"] for j in page["jobs"]]
        url = f"/jobs?limit=3&after={page['next']}" if page["next"] else ""
    assert seen == sorted(ids)
    mail = (await c.get("/jobs?queue=mail&state=scheduled")).json()
    assert [j["id"] for j in mail["jobs"]] == sorted([ids[1], ids[3], ids[5]])  # id order
    assert mail["next"] is None
    bad_params = [("state=nope", "state"), ("limit=0", "limit"), ("limit=1001", "limit"),
                  ("after=!!", "after"), ("queue=a b", "queue"), ("bogus=1", "bogus")]  # fmt: skip
    for bad, field in bad_params:
        r = await c.get(f"/jobs?{bad}")
        assert r.status_code == 422, bad
        assert r.json()["field"] == field


async def test_a_dead_job_is_retried_with_a_fresh_budget(api: Client) -> None:
    rt, c = await api()
    job = (await c.post("/jobs", json={"kind": "boom", "max_attempts": 2})).json()
    done = await final(rt, job["id"])
    assert (done.state, done.attempts) == (State.DEAD, 2)
    assert (await c.get("/jobs?state=dead")).json()["jobs"][0]["id"] == job["id"]
    r = await c.post(f"/jobs/{job['id']}/retry")
    assert r.status_code == 200, r.text
    assert (r.json()["state"], r.json()["attempts"], r.json()["attempts_total"]) == (
        "scheduled", 0, 2,
    )  # fmt: skip
    again = await final(rt, job["id"])
    assert (again.state, again.attempts, again.attempts_total) == (State.DEAD, 2, 2)
    ok = (await c.post("/jobs", json={"kind": "record", "args": {"name": "x"}})).json()
    await final(rt, ok["id"])
    r = await c.post(f"/jobs/{ok['id']}/retry")
    assert r.status_code == 409  # only dead or cancelled jobs
    assert (await c.post("/jobs/ffff/retry")).status_code == 404


async def test_retry_every_match_in_one_commit(api: Client) -> None:
    rt, c = await api()
    booms = [(await c.post("/jobs", json={"kind": "boom", "max_attempts": 1})).json()["id"]
             for _ in range(3)]  # fmt: skip
    other = await c.post("/jobs", json={"kind": "boom", "max_attempts": 1, "queue": "q2"})
    for job_id in [*booms, other.json()["id"]]:
        await final(rt, job_id)
    r = await c.post("/jobs/retry", json={"state": "dead", "queue": "default"})
    assert r.json() == {"retried": 3}
    assert rt.events.totals[Event.OPERATOR_RETRIED] == 3
    assert (await c.post("/jobs/retry", json={"state": "dead", "kind": "nope"})).json() == {
        "retried": 0
    }
    assert (await c.post("/jobs/retry", json={"state": "completed"})).status_code == 422


async def test_an_idempotency_key_makes_one_job(api: Client) -> None:
    _rt, c = await api()
    body = {"kind": "record", "args": {"name": "once"}, "delay_ms": 60_000}
    first = await c.post("/jobs", json=body, headers={"Idempotency-Key": "order-1"})
    again = await c.post("/jobs", json=body, headers={"Idempotency-Key": "order-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    other = await c.post(
        "/jobs", json={**body, "args": {"name": "twice"}}, headers={"Idempotency-Key": "order-1"}
    )
    assert other.status_code == 409
    assert other.json()["error"] == "idempotency_conflict"
    racing = await asyncio.gather(
        *(c.post("/jobs", json=body, headers={"Idempotency-Key": "race"}) for _ in range(20))
    )
    assert len({r.json()["id"] for r in racing}) == 1
    assert sorted(r.status_code for r in racing) == [200] * 19 + [201]
    bad = await c.post("/jobs", json=body, headers={"Idempotency-Key": "has space"})
    assert (bad.status_code, bad.json()["field"]) == (422, "Idempotency-Key")


async def test_batch_keys_return_the_original_jobs(api: Client) -> None:
    _rt, c = await api()
    job = {"kind": "record", "args": {"name": "b"}, "delay_ms": 60_000}
    r1 = await c.post("/jobs/batch", json={"jobs": [{**job, "idempotency_key": "a"}, job]})
    assert r1.status_code == 201
    assert r1.json()["created"] == [True, True]
    r2 = await c.post("/jobs/batch", json={"jobs": [{**job, "idempotency_key": "a"}]})
    assert (r2.status_code, r2.json()["ids"], r2.json()["created"]) == (
        200, r1.json()["ids"][:1], [False],
    )  # fmt: skip
    dup = await c.post(
        "/jobs/batch",
        json={"jobs": [{**job, "idempotency_key": "z"}, {**job, "idempotency_key": "z"}]},
    )
    assert (dup.status_code, dup.json()["field"]) == (422, "jobs[1].idempotency_key")


async def test_wait_returns_when_the_job_finishes(api: Client) -> None:
    rt, c = await api()
    job = (await c.post("/jobs", json={"kind": "gate"})).json()
    waiting = asyncio.ensure_future(c.get(f"/jobs/{job['id']}?wait=30"))
    await wait_for(lambda: job["id"] in rt.waiters.waited_on(), 5, "the request to wait")
    assert not waiting.done()
    operations_helpers.GATE.set()  # the fixture makes a new one per test
    r = await asyncio.wait_for(waiting, 10)
    assert (r.status_code, r.json()["state"], r.json()["result"]) == (200, "completed", "opened")
    assert not rt.waiters.waited_on()


async def test_a_wait_that_expires_returns_the_job_as_it_stands(api: Client) -> None:
    rt, c = await api()
    job = (await c.post("/jobs", json={"kind": "record", "args": {"name": "x"},
                                      "delay_ms": 60_000})).json()  # fmt: skip
    r = await c.get(f"/jobs/{job['id']}?wait=0.05")
    assert (r.status_code, r.json()["state"]) == (200, "scheduled")
    assert not rt.waiters.waited_on()
    for bad in ("-1", "61", "soon"):
        r = await c.get(f"/jobs/{job['id']}?wait={bad}")
        assert (r.status_code, r.json()["field"]) == (422, "wait")


async def test_a_wait_runs_on_the_injected_clock(services: ServiceFactory) -> None:
    """?wait= is a timeout on the service's clock: it ends when the clock says 30 s have
    passed, not half a minute of real time later."""
    clock = FakeClock(NOW)
    rt = services(clock=clock)
    await rt.start()
    [job], _ = await rt.submit([JobSpec(kind="sleep", delay_ms=3_600_000)])
    waiting = asyncio.ensure_future(rt.wait(job.id, 30))
    await wait_for(lambda: job.id in rt.waiters.waited_on(), 5, "the wait to begin")
    clock.advance(29.9)
    await asyncio.sleep(0)
    assert not waiting.done()
    clock.advance(0.1)
    got = await asyncio.wait_for(waiting, 5)
    assert got is not None
    assert got.state is State.SCHEDULED
    assert not rt.waiters.waited_on()


async def test_a_queue_cap_bounds_how_many_of_its_jobs_run_at_once(api: Client) -> None:
    rt, c = await api(workers=8, queue_caps={"mail": 2})
    peak = 0

    async def sample() -> bool:
        nonlocal peak
        peak = max(peak, (await rt.view.queue("mail")).running)
        return len(STARTED) == 8

    for i in range(6):
        await c.post("/jobs", json={"kind": "gate", "args": {"name": f"m{i}"}, "queue": "mail"})
    await c.post("/jobs", json={"kind": "gate", "args": {"name": "d0"}})
    await c.post("/jobs", json={"kind": "gate", "args": {"name": "d1"}})
    await wait_for(lambda: len(STARTED) == 4, 5, "two mail jobs and both default ones")
    assert sorted(STARTED) == ["d0", "d1", "m0", "m1"]  # the cap holds the other four back
    info = (await c.get("/queues")).json()["queues"]
    assert {q["name"]: (q["running"], q["limit"], q["depth"]) for q in info} == {
        "default": (2, None, 0),
        "mail": (2, 2, 4),
    }
    operations_helpers.GATE.set()  # the fixture makes a new one per test
    await wait_for(sample, 10, "every job to start")
    assert peak <= 2


async def test_a_paused_queue_starts_nothing_until_resumed(api: Client) -> None:
    rt, c = await api(workers=4)
    r = await c.post("/queues/mail/pause")
    assert (r.status_code, r.json()["paused"]) == (200, True)
    ids = [
        (
            await c.post(
                "/jobs", json={"kind": "record", "args": {"name": f"p{i}"}, "queue": "mail"}
            )
        ).json()["id"]
        for i in range(3)
    ]
    other = (await c.post("/jobs", json={"kind": "record", "args": {"name": "free"}})).json()
    await final(rt, other["id"])  # other queues run on
    assert STARTED == ["free"]
    assert (await rt.queues())["mail"].depth == 3
    r = await c.post("/queues/mail/resume")
    assert (r.status_code, r.json()["paused"]) == (200, False)
    for job_id in ids:
        assert (await final(rt, job_id)).state is State.COMPLETED
    assert (await c.post("/queues/bad%20name/pause")).status_code == 422


async def test_pause_survives_a_restart(durable_factory: Any, services: ServiceFactory) -> None:
    from sqlq.common.clock import SYSTEM_CLOCK

    first = services(durable_factory(clock=SYSTEM_CLOCK), kinds=kinds())
    await first.start()
    await first.pause("mail", True)
    job = (await first.submit([JobSpec(kind="record", args={"name": "x"}, queue="mail")]))[0][0]
    await first.stop(0)
    second = services(durable_factory(clock=SYSTEM_CLOCK), kinds=kinds())
    await second.start()
    mail = (await second.queues())["mail"]
    assert (mail.paused, mail.depth) == (True, 1)
    await second.pause("mail", False)
    assert (await final(second, job.id)).state is State.COMPLETED


def test_queue_flag_is_checked() -> None:
    from click.testing import CliRunner

    from sqlq.cli import main
    from sqlq.settings import queue_caps

    assert queue_caps(("mail=2", "reports=10")) == {"mail": 2, "reports": 10}
    for bad in ("mail", "mail=0", "mail=x", "bad name=2"):
        r = CliRunner().invoke(main, ["serve", "--store", "memory", "--queue", bad])
        assert r.exit_code == 2, bad
        assert "--queue" in r.output


async def test_metrics_count_events_by_kind_and_queue(api: Client) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    rt, c = await api()
    for i in range(3):
        await c.post("/jobs", json={"kind": "record", "args": {"name": f"r{i}"}, "queue": "mail"})
    dead = (await c.post("/jobs", json={"kind": "boom", "max_attempts": 2})).json()
    await c.post("/jobs", json={"kind": "record", "args": {"name": "later"}, "delay_ms": 60_000})
    await final(rt, dead["id"])
    await wait_for(lambda: rt.events.totals[Event.COMPLETED] == 3, 5, "the three to complete")
    r = await c.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }

    def get(name: str, **labels: str) -> float:
        return samples[name, tuple(sorted(labels.items()))]

    assert get("sqlq_jobs_total", event="submitted", kind="record", queue="mail") == 3
    assert get("sqlq_jobs_total", event="completed", kind="record", queue="mail") == 3
    assert get("sqlq_jobs_total", event="retried", kind="boom", queue="default") == 1
    assert get("sqlq_jobs_total", event="dead", kind="boom", queue="default") == 1
    assert get("sqlq_jobs_live", state="scheduled", queue="default") == 1
    assert get("sqlq_run_seconds_count") == 5  # 3 records + 2 attempts of boom
    assert get("sqlq_queue_wait_seconds_count") == 5
    assert get("sqlq_workers", status="live") == 4
    assert ("sqlq_recovery_seconds", ()) in samples


async def test_metrics_follow_the_token(services: ServiceFactory) -> None:
    from sqlq.http.guard import Security

    rt = services()
    await rt.start()
    app = create_app(rt, start_runtime=False, security=Security(token="t0k"))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
        assert (await c.get("/metrics")).status_code == 401
        ok = await c.get("/metrics", headers={"authorization": "Bearer t0k"})
        assert ok.status_code == 200
        assert "sqlq_workers" in ok.text


async def test_durable_engines_report_their_batches(
    durable_factory: Any, services: ServiceFactory
) -> None:
    from sqlq.common.clock import SYSTEM_CLOCK

    rt = services(durable_factory(clock=SYSTEM_CLOCK), kinds=kinds())
    await rt.start()
    jobs = (await rt.submit([JobSpec(kind="record", args={"name": f"x{i}"}) for i in range(20)]))[0]
    for job in jobs:
        await final(rt, job.id)
    text = rt.metrics.exposition().decode()
    count = next(ln for ln in text.splitlines() if ln.startswith("sqlq_store_commit_seconds_count"))
    assert float(count.split()[-1]) >= 2  # the submission, and claims and outcomes after it
    assert "sqlq_store_batch_size_bucket" in text
