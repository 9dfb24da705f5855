"""Every answer carries ``X-Content-Type-Options: nosniff`` (``sqlq.http.guard.Stamped``),
whatever made it: a handler, the error table, the guard's refusal, a 500 from outside
every middleware, the dashboard, ``/openapi.json`` and the 431 of an oversized head."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from sqlq.http.guard import Security
from sqlq.http.head import REFUSAL
from tests.app_helpers import app_clients

Make = Callable[..., Any]
TOKEN = "a-token-for-the-header-tests"


@pytest.fixture
async def client() -> AsyncIterator[Make]:
    """``await client(security=...)``: a client on an app over a fresh memory service."""
    async for make in app_clients(raise_app_exceptions=False):
        yield make


def _nosniff(r: httpx.Response) -> None:
    assert r.headers.get_list("x-content-type-options") == ["nosniff"], (r.status_code, r.url)


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("GET", "/healthz", None, 200),
        ("POST", "/jobs", {"kind": "sleep", "args": {}}, 201),  # the fast path
        ("POST", "/jobs", {"kind": ""}, 422),  # the fast path's error
        ("GET", "/jobs?colour=red", None, 422),
        ("GET", "/jobs/01a240f0aeed63f910739af795ca4302", None, 404),
        ("POST", "/jobs/batch", b"{", 400),
        ("GET", "/nowhere", None, 404),
        ("GET", "/openapi.json", None, 200),
        ("GET", "/metrics", None, 200),
        ("GET", "/ui/", None, 200),  # names its own: still once
        ("GET", "/ui/jobs?state=asleep", None, 422),
    ],
)
async def test_every_kind_of_answer_carries_nosniff_once(
    client: Make, method: str, path: str, body: Any, status: int
) -> None:
    c = await client()
    content = body if isinstance(body, bytes) else None
    json = None if isinstance(body, bytes) else body
    headers = {"content-type": "application/json"} if content is not None else None
    r = await c.request(method, path, json=json, content=content, headers=headers)
    assert r.status_code == status, r.text
    _nosniff(r)


async def test_the_guards_refusals_carry_it(client: Make) -> None:
    c = await client(security=Security(token=TOKEN))
    _nosniff(await c.get("/stats"))  # 401
    r = await c.get("/stats", headers={"host": "evil.example"})
    assert r.status_code == 421
    _nosniff(r)
    r = await c.post("/jobs", content=b"x", headers={"authorization": f"Bearer {TOKEN}",
                                                      "content-type": "text/plain"})  # fmt: skip
    assert r.status_code == 415
    _nosniff(r)


async def test_a_500_answered_outside_every_middleware_carries_it(
    client: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = await client()

    def broken() -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(c.runtime, "stats", broken)
    r = await c.get("/stats")
    assert (r.status_code, r.json()["error"]) == (500, "internal")
    _nosniff(r)


def test_the_431_a_head_past_its_limit_gets_carries_it() -> None:
    head = REFUSAL.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
    assert head[0].startswith(b"HTTP/1.1 431 ")
    assert b"x-content-type-options: nosniff" in head[1:]


@pytest.mark.slow
async def test_a_real_server_sends_it_once_on_every_answer_its_own_400s_included() -> None:
    """Under ``sqlq serve`` uvicorn sends it (``SERVED_HEADERS``) and the app does not
    stamp it again: once on an API answer, a dashboard page, an error, and on the 400
    uvicorn answers a request it cannot parse without the app ever seeing it."""
    import asyncio

    from tests.helpers import start_ready

    server = await start_ready("--store", "memory")
    try:
        async with httpx.AsyncClient(base_url=server.url) as http:
            for r in (
                await http.post("/jobs", json={"kind": "sleep"}),
                await http.get("/jobs/" + "0" * 32),
                await http.get("/ui/"),
                await http.get("/openapi.json"),
            ):
                assert r.headers.get_list("x-content-type-options") == ["nosniff"], r
                assert "server" not in r.headers  # (what runs here is no one's business)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: localhost\r\nBad Header\r\n\r\n")
        await writer.drain()
        answer = await reader.read(65536)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:40]
        assert b"x-content-type-options: nosniff" in answer.split(b"\r\n\r\n", 1)[0]
    finally:
        await asyncio.to_thread(server.stop)
