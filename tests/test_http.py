"""The HTTP API in-process: statuses, JSON errors that name the field, no 500s."""

from __future__ import annotations

from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import httpx
import pytest

from sqlq.http.app import create_app
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.service import Service
from tests.helpers import app_client, wait_for

JSON_TYPE = {"content-type": "application/json"}


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with app_client(RuntimeConfig(workers=2, seed=1)) as c:
        yield c


async def test_submit_then_read_back(client: httpx.AsyncClient) -> None:
    r = await client.post("/jobs", json={"kind": "sleep", "args": {"work_ms": 1}})
    assert r.status_code == 201
    job = r.json()
    assert job["state"] == "scheduled"
    assert job["args"] == {"work_ms": 1}  # stored without the kind's defaults

    async def completed() -> bool:
        got = await client.get(f"/jobs/{job['id']}")
        return bool(got.json()["state"] == "completed")

    await wait_for(completed, 10, "the job to complete")
    stats = (await client.get("/stats")).json()
    assert stats["jobs"]["completed"] == 1
    assert stats["store"]["engine"] == "memory"


async def test_batch_is_all_or_nothing(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/jobs/batch",
        json={"jobs": [{"kind": "sleep"}, {"kind": "cpu", "args": {"rounds": 0}}]},
    )
    assert r.status_code == 422
    assert r.json()["field"] == "jobs[1].args.rounds"
    assert (await client.get("/stats")).json()["submitted"] == 0
    r = await client.post("/jobs/batch", json={"jobs": [{"kind": "sleep"}] * 3})
    assert r.status_code == 201
    assert len(r.json()["ids"]) == 3


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"kind": "nope"}, 422, "kind"),
        ({"args": {}}, 422, "kind"),
        ({"kind": "sleep", "args": {"work_ms": -1}}, 422, "args.work_ms"),
        ({"kind": "sleep", "args": {"work_ms": "20"}}, 422, "args.work_ms"),
        ({"kind": "sleep", "args": {"work_ms": 10**9}}, 422, "args.work_ms"),
        ({"kind": "sleep", "args": {"fail_prob": 1.5}}, 422, "args.fail_prob"),
        ({"kind": "sleep", "args": {"hang_prob": -0.1}}, 422, "args.hang_prob"),
        ({"kind": "sleep", "args": {"bogus": 1}}, 422, "args"),
        ({"kind": "sleep", "args": []}, 422, "args"),
        ({"kind": "cpu", "args": {"rounds": 0}}, 422, "args.rounds"),
        ({"kind": "cpu", "args": {}}, 422, "args.rounds"),
        ({"kind": "sleep", "max_attempts": 0}, 422, "max_attempts"),
        ({"kind": "sleep", "delay_ms": -5}, 422, "delay_ms"),
        ({"kind": "sleep", "delay_ms": 5, "run_at": 1.0}, 422, "run_at"),
        ({"kind": "sleep", "surprise": True}, 422, "body"),
        ([1, 2], 422, "body"),
    ],
)
async def test_bad_input_names_the_field(
    client: httpx.AsyncClient, body: object, status: int, field: str
) -> None:
    r = await client.post("/jobs", json=body)
    assert r.status_code == status, r.text
    assert r.json()["field"] == field, r.json()
    assert r.json()["message"]


async def test_not_json_is_400(client: httpx.AsyncClient) -> None:
    r = await client.post("/jobs", content=b"{not json", headers=JSON_TYPE)
    assert r.status_code == 400
    assert r.json()["error"] == "bad_json"


async def test_body_size_is_capped(client: httpx.AsyncClient) -> None:
    big = b'{"kind":"sleep","args":{"x":"' + b"a" * (2 << 20) + b'"}}'
    r = await client.post("/jobs", content=big, headers=JSON_TYPE)
    assert r.status_code == 413
    assert r.json()["field"] == "body"


async def test_unknown_id_is_404_and_unknown_route_is_json(client: httpx.AsyncClient) -> None:
    r = await client.get("/jobs/does-not-exist")
    assert r.status_code == 404
    assert r.json()["error"] == "not_found"
    r = await client.get("/nowhere")
    assert r.status_code == 404
    assert r.json()["error"] == "http"
    r = await client.put("/jobs")
    assert r.status_code == 405


async def test_cancel(client: httpx.AsyncClient) -> None:
    job = (await client.post("/jobs", json={"kind": "sleep", "delay_ms": 60_000})).json()
    r = await client.delete(f"/jobs/{job['id']}")
    assert r.status_code == 200
    assert r.json()["state"] == "cancelled"
    r = await client.delete(f"/jobs/{job['id']}")
    assert r.status_code == 409


async def test_health_and_readiness(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).status_code == 200
    r = await client.get("/readyz")
    assert r.status_code == 200
    assert r.json()["ready"] is True


async def test_readyz_is_503_when_the_store_has_failed(tmp_path: object) -> None:
    from pathlib import Path

    from sqlq.walq.store import WalStore
    from tests.walq_helpers import FaultyFiles

    fs = FaultyFiles("fdatasync", where="walq.log", nth=1)
    rt = Service(WalStore(Path(str(tmp_path)), fs=fs), RuntimeConfig(workers=1))
    await rt.start()
    app = create_app(rt, start_runtime=False)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as c:
        r = await c.post("/jobs", json={"kind": "sleep"})
        assert r.status_code == 503  # not acknowledged: the sync failed
        assert r.json()["error"] == "unavailable"
        r = await c.get("/readyz")
        assert r.status_code == 503
        assert "store failed" in r.json()["reason"]
    await rt.stop(0)


async def test_the_guard_refuses_a_websocket_before_accepting_it() -> None:
    from sqlq.http.guard import Guard, Security

    reached: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["type"])

    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    guard = Guard(app, Security())
    scope = {"type": "websocket", "path": "/jobs", "headers": [(b"host", b"localhost")]}
    await guard(scope, receive, send)
    assert reached == []
    assert sent == [{"type": "websocket.close", "code": 1008}]
    await guard({"type": "lifespan"}, receive, send)
    assert reached == ["lifespan"]
    with pytest.raises(RuntimeError, match="unsupported ASGI scope"):
        await guard({"type": "mystery"}, receive, send)


async def test_the_job_page_renders_args_once_and_never_in_a_refresh(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlq.ui.render as ui

    rendered: list[Any] = []
    pretty = ui.pretty

    def counting(value: Any) -> str:
        rendered.append(value)
        return pretty(value)

    monkeypatch.setattr(ui, "pretty", counting)
    r = await client.post("/jobs", json={"kind": "sleep", "args": {"work_ms": 60_000}})
    job_id = r.json()["id"]
    args = r.json()["args"]
    page = await client.get(f"/ui/jobs/{job_id}")
    assert page.status_code == 200
    assert "work_ms&#34;: 60000" in page.text
    for _ in range(3):
        live = await client.get(f"/ui/jobs/{job_id}", headers={"hx-request": "true"})
        assert live.status_code == 200
        assert "work_ms" not in live.text
    again = await client.get(f"/ui/jobs/{job_id}")
    assert "work_ms&#34;: 60000" in again.text
    assert [v for v in rendered if v == args] == [args]  # once, for the first full page


async def test_an_error_echoes_at_most_200_characters_of_the_input(
    client: httpx.AsyncClient,
) -> None:
    r = await client.post("/jobs", json={"kind": "sleep", "k" * 100_000: 1})
    assert r.status_code == 422
    assert len(r.json()["message"]) < 300
    r = await client.get("/jobs", params={"limit": "²"})
    assert (r.status_code, r.json()["field"]) == (422, "limit")
    r = await client.get("/jobs/" + "0" * 31 + "g")
    assert r.status_code == 404
