"""``/schedules`` through the ASGI app, and the schedule and tick every job carries:
statuses, bodies and the fields errors name, the token, the ``?schedule=`` filter,
the keys a client may not use, and ``AsyncClient``'s round trip."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from sqlq.calls import Invalid, NotFound
from sqlq.client import AsyncClient
from sqlq.common import schedule, specs
from sqlq.common.engine.memory import MemoryStore
from sqlq.common.models import Job
from sqlq.common.schedule import AdvanceSchedule, tick_key
from sqlq.common.wire import JobView
from sqlq.http.app import create_app
from sqlq.http.guard import Security
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.service import Service

TOKEN = "a-token-for-the-tests"
EVERY_HOUR = {"kind": "sleep", "every_s": 3600}
TICK = 1_800_000_000  # a whole hour (unix seconds)


@pytest.fixture
async def rt() -> AsyncIterator[Service]:
    service = Service(MemoryStore(), RuntimeConfig(workers=1, seed=1))
    await service.start()
    yield service
    await service.stop(0)


def _client(rt: Service, **headers: str) -> httpx.AsyncClient:
    app = create_app(rt, start_runtime=False, security=Security(token=TOKEN), ui=None)
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://localhost",
        headers={"authorization": f"Bearer {TOKEN}", **headers},
    )


@pytest.fixture
async def c(rt: Service) -> AsyncIterator[httpx.AsyncClient]:
    async with _client(rt) as client:
        yield client


async def _tick_job(rt: Service, name: str, tick: int) -> Job:
    """The job of ``name``'s ``tick``, committed as the evaluator commits one: the cursor
    moved to the tick and the job, in one call."""
    current = await rt.store.get_schedule(name)
    assert current is not None
    now = rt.clock.time()
    key = tick_key(name, tick)
    job = Job.new(kind="sleep", args={}, now=now, ready_at=now + 3600, idempotency_key=key)
    advance = AdvanceSchedule(name=name, expect_version=current.version,
                              expect_cursor=current.cursor, cursor=tick, job=job.id)  # fmt: skip
    await rt.store.commit([advance, job])
    return job


def _error(r: httpx.Response, status: int, field: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body: dict[str, Any] = r.json()
    assert set(body) >= {"error", "message"}
    if field is not None:
        assert body.get("field") == field, body
    return body


async def test_put_creates_then_replaces_and_get_list_delete_answer(
    c: httpx.AsyncClient,
) -> None:
    r = await c.put("/schedules/nightly", json={**EVERY_HOUR, "args": {"work_ms": 1}})
    assert r.status_code == 201, r.text
    view = r.json()
    assert view["name"] == "nightly"
    assert view["spec"]["every_s"] == 3600
    assert view["spec"]["args"] == {"work_ms": 1}
    assert view["spec"]["catch_up"] == "latest"
    assert view["spec"]["tz"] == "UTC"
    assert view["next_at"] is not None
    assert view["next_at"] % 3600 == 0
    assert (view["last_tick"], view["last_job"]) == (None, None)
    r = await c.put("/schedules/nightly", json={**EVERY_HOUR, "queue": "reports"})
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["queue"] == "reports"
    await c.put("/schedules/a.first", json=EVERY_HOUR)
    r = await c.get("/schedules")
    assert r.status_code == 200
    assert [s["name"] for s in r.json()["schedules"]] == ["a.first", "nightly"]  # name order
    assert (await c.get("/schedules/nightly")).json()["spec"]["queue"] == "reports"
    r = await c.delete("/schedules/nightly")
    assert r.status_code == 200
    assert r.json()["name"] == "nightly"
    assert "not found" in _error(await c.get("/schedules/nightly"), 404)["message"]
    _error(await c.delete("/schedules/nightly"), 404)
    assert [s["name"] for s in (await c.get("/schedules")).json()["schedules"]] == ["a.first"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "sleep"}, "cron"),  # neither cron nor every_s
        ({"kind": "sleep", "cron": "0 * * * *", "every_s": 60}, "cron"),  # both
        ({"kind": "sleep", "every_s": 0}, "every_s"),
        ({"kind": "sleep", "every_s": 60, "tz": "Mars/Olympus"}, "tz"),
        ({"kind": "sleep", "every_s": 60, "catch_up": "some"}, "catch_up"),
        ({"kind": "sleep", "every_s": 60, "overlap": "maybe"}, "overlap"),
        ({"kind": "sleep", "every_s": 60, "queue": "bad queue"}, "queue"),
        ({"kind": "sleep", "every_s": 60, "surprise": 1}, "body"),  # as a job's
        ({"kind": "no-such-kind", "every_s": 60}, "kind"),
        ({"kind": "sleep", "every_s": 60, "args": {"work_ms": "long"}}, "args.work_ms"),
        ({"every_s": 60}, "kind"),
    ],
)
async def test_a_bad_spec_is_a_422_naming_the_field(
    c: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    _error(await c.put("/schedules/s", json=body), 422, field)
    _error(await c.get("/schedules/s"), 404)  # nothing was stored


async def test_a_bad_name_is_a_422_naming_it_on_every_route(c: httpx.AsyncClient) -> None:
    for name in ("a:b", "x" * 65, "sp ace", "é"):
        for method, path in (("PUT", ""), ("GET", ""), ("DELETE", ""), ("POST", "/pause"),
                             ("POST", "/resume"), ("POST", "/trigger")):  # fmt: skip
            body = EVERY_HOUR if method == "PUT" else None
            r = await c.request(method, f"/schedules/{name}{path}", json=body)
            _error(r, 422, "name")
    _error(await c.get("/schedules/a%2Fb"), 404)  # a slash is no name: no route


async def test_bodies_are_bounded_json_like_every_write(c: httpx.AsyncClient) -> None:
    json = {"content-type": "application/json"}
    _error(await c.put("/schedules/s", content=b"{nope", headers=json), 400, "body")
    _error(await c.put("/schedules/s", content=b"[]", headers=json), 422)
    r = await c.put("/schedules/s", content=b"kind=sleep", headers={"content-type": "text/plain"})
    _error(r, 415, "content-type")
    big = {**EVERY_HOUR, "args": {"pad": "x" * specs.MAX_JOB_BYTES}}
    _error(await c.put("/schedules/s", json=big), 413, "body")
    _error(await c.get("/schedules/s"), 404)


async def test_every_route_needs_the_token_and_refuses_other_origins(rt: Service) -> None:
    routes = (("GET", "/schedules"), ("PUT", "/schedules/s"), ("GET", "/schedules/s"),
              ("DELETE", "/schedules/s"), ("POST", "/schedules/s/pause"),
              ("POST", "/schedules/s/resume"), ("POST", "/schedules/s/trigger"))  # fmt: skip
    async with _client(rt, authorization="") as anonymous, _client(rt) as c:
        for method, path in routes:
            body = EVERY_HOUR if method == "PUT" else None
            r = await anonymous.request(method, path, json=body)
            _error(r, 401, "authorization")
            r = await c.request(method, path, json=body, headers={"origin": "https://evil.example"})
            _error(r, 403, "origin")
        assert (await c.get("/schedules")).json() == {"schedules": []}  # nothing got through


async def test_pause_and_resume_are_shown_and_404_when_missing(c: httpx.AsyncClient) -> None:
    await c.put("/schedules/s", json=EVERY_HOUR)
    r = await c.post("/schedules/s/pause")
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["paused"] is True
    assert r.json()["next_at"] is None
    assert (await c.get("/schedules/s")).json()["spec"]["paused"] is True  # it stays
    r = await c.post("/schedules/s/resume")
    assert r.json()["spec"]["paused"] is False
    assert r.json()["next_at"] is not None
    for action in ("pause", "resume", "trigger"):
        _error(await c.post(f"/schedules/missing/{action}"), 404)


async def test_jobs_carry_their_schedule_and_tick_and_the_filter_finds_them(
    rt: Service, c: httpx.AsyncClient
) -> None:
    for name in ("nightly", "nightly2"):  # a name that starts with another's
        await c.put(f"/schedules/{name}", json=EVERY_HOUR)
    ticked = await _tick_job(rt, "nightly", TICK)
    await _tick_job(rt, "nightly2", TICK)
    r = await c.post("/schedules/nightly/trigger")
    assert r.status_code == 201, r.text
    triggered = r.json()
    assert (triggered["schedule"], triggered["tick"]) == ("nightly", None)
    assert triggered["state"] == "scheduled"
    assert triggered["kind"] == "sleep"
    plain = await c.post("/jobs", json={"kind": "sleep"}, headers={"idempotency-key": "k1"})
    assert (plain.json()["schedule"], plain.json()["tick"]) == (None, None)

    got = (await c.get(f"/jobs/{ticked.id}")).json()
    assert (got["schedule"], got["tick"]) == ("nightly", TICK)
    page = (await c.get("/jobs", params={"schedule": "nightly"})).json()
    assert sorted(j["id"] for j in page["jobs"]) == sorted([ticked.id, triggered["id"]])
    made = {(j["schedule"], j["tick"]) for j in page["jobs"]}
    assert made == {("nightly", TICK), ("nightly", None)}
    everything = (await c.get("/jobs")).json()["jobs"]
    assert len(everything) == 4
    assert all("schedule" in j and "tick" in j for j in everything)
    limited = (await c.get("/jobs", params={"schedule": "nightly", "limit": 1})).json()
    assert len(limited["jobs"]) == 1
    assert limited["next"] is not None
    rest = (await c.get("/jobs", params={"schedule": "nightly", "after": limited["next"]})).json()
    assert [j["schedule"] for j in rest["jobs"]] == ["nightly"]
    assert (await c.get("/jobs", params={"schedule": "other"})).json()["jobs"] == []
    view = (await c.get("/schedules/nightly")).json()
    assert view["last_tick"] == TICK
    assert view["last_job"] == {"id": ticked.id, "state": "scheduled"}
    _error(await c.get("/jobs", params={"schedule": "a:b"}), 422, "schedule")


async def test_a_client_key_may_not_be_a_schedules(c: httpx.AsyncClient) -> None:
    assert specs.RESERVED_KEY_PREFIX == schedule.KEY_PREFIX
    key = tick_key("nightly", TICK)
    r = await c.post("/jobs", json={"kind": "sleep"}, headers={"idempotency-key": key})
    assert "sched:" in _error(r, 422, "Idempotency-Key")["message"]
    r = await c.post("/jobs", json={"kind": "sleep", "idempotency_key": key})
    _error(r, 422, "idempotency_key")
    batch = {"jobs": [{"kind": "sleep", "idempotency_key": "ok"},
                      {"kind": "sleep", "idempotency_key": "sched:x:trigger-1"}]}  # fmt: skip
    _error(await c.post("/jobs/batch", json=batch), 422, "jobs[1].idempotency_key")
    assert (await c.get("/jobs")).json()["jobs"] == []  # none of them was made
    for fine in ("sched", "schedule:1", "Sched:1", "x-sched:1"):
        r = await c.post("/jobs", json={"kind": "sleep"}, headers={"idempotency-key": fine})
        assert r.status_code == 201, (fine, r.text)


async def test_the_async_client_round_trip(rt: Service) -> None:
    app = create_app(rt, start_runtime=False, security=Security(token=TOKEN), ui=None)
    transport = httpx.ASGITransport(app=app)
    async with AsyncClient("http://localhost", token=TOKEN, transport=transport) as q:
        made = await q.put_schedule("nightly", "sleep", {"work_ms": 1}, every_s=3600,
                                    queue="reports", catch_up="all")  # fmt: skip
        assert (made.name, made.spec.queue, made.spec.catch_up) == ("nightly", "reports", "all")
        assert [v.name for v in await q.schedules()] == ["nightly"]
        assert (await q.schedule("nightly")).spec.args == {"work_ms": 1}
        assert (await q.pause_schedule("nightly")).spec.paused is True
        assert (await q.pause_schedule("nightly", paused=False)).next_at is not None
        job = await q.trigger("nightly")
        assert isinstance(job, JobView)
        assert (job.schedule, job.tick) == ("nightly", None)
        assert [j.id async for j in q.jobs(schedule="nightly")] == [job.id]
        assert (await q.get(job.id)).schedule == "nightly"
        assert (await q.delete_schedule("nightly")).name == "nightly"
        with pytest.raises(NotFound):
            await q.schedule("nightly")
        with pytest.raises(Invalid) as bad:
            await q.put_schedule("nightly", "sleep", every_s=60, tz="Nowhere/At-all")
        assert bad.value.field == "tz"
        with pytest.raises(Invalid) as bad:
            await q.schedule("a:b")
        assert bad.value.field == "name"
        with pytest.raises(NotFound):  # quoted, so it names no other route
            await q.pause_schedule("../jobs")
