"""The pull protocol's calls (``POST /claims`` and ``/claims/*``) answer as plain ASGI
ahead of the router (``sqlq.http.lean``) and through it (``create_app(lean=False)``) the
same, byte for byte but the job ids, tokens and times: one piece of work
(``sqlq.http.claims.ClaimCalls``), two doors. Each door has its own memory service with
the real ``Remote`` (every queue remote), and the same worker's life goes through both:
a claim, its heartbeat, its outcome, that outcome again (409 fenced), every single form
and the batch on a stale token, and the refusals: a field out of bounds (422 naming it),
a token this server never signed, bad JSON, a body past its limit, the wrong content
type, no token (401), another queue's or another role's token (403)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from sqlq.common.engine.memory import MemoryStore
from sqlq.http.app import create_app
from sqlq.http.claims import MAX_HEARTBEAT_BODY
from sqlq.http.lean import client_gone
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.service import Service
from tests.remote_http_helpers import auth, security

_TOKEN = re.compile(rb"[0-9a-f]{32}\.[0-9]+\.[0-9]+\.[A-Za-z0-9_=-]+")
_ID = re.compile(rb'"[0-9a-f]{32}"')
_TIME = re.compile(rb'"([a-z_]+_(at|until))":[0-9.e+]+')

CLAIM = {"queues": ["mail"], "worker": "box-1", "max": 5, "wait_s": 0, "lease_s": 60}
JSON = {"content-type": "application/json"}

# (path, body given the first claim's token, headers): in order, through each door
Step = tuple[str, Callable[[str], Any], dict[str, str]]
STEPS: list[Step] = [
    ("/claims", lambda t: CLAIM, auth("w-mail")),  # the claim: its token is ``t`` from here
    ("/claims/heartbeat", lambda t: {"items": [{"token": t, "progress": {"percent": 50}}]},
     auth("w-mail")),
    ("/claims/checkpoint", lambda t: {"token": t, "data": {"at": 3}}, auth("w-mail")),
    ("/claims/complete", lambda t: {"token": t, "result": {"ok": 1}}, auth("w-mail")),
    ("/claims/complete", lambda t: {"token": t, "result": {"ok": 1}}, auth("w-mail")),  # 409
    ("/claims/fail", lambda t: {"token": t, "error": "boom"}, auth("w-mail")),
    ("/claims/snooze", lambda t: {"token": t, "delay_s": 5}, auth("w-mail")),
    ("/claims/snooze", lambda t: {"token": t, "delay_s": -1}, auth("w-mail")),  # 422 delay_s
    ("/claims/release", lambda t: {"token": t}, auth("w-mail")),
    ("/claims/checkpoint", lambda t: {"token": t, "data": 1}, auth("w-mail")),
    ("/claims/heartbeat", lambda t: {"items": [{"token": t}, {"token": t}]}, auth("w-mail")),
    ("/claims/heartbeat", lambda t: {"items": [{"token": t}]}, auth("w-mail")),  # fenced item
    ("/claims/outcomes", lambda t: {"outcomes": [{"token": t, "complete": {}},
                                                 {"token": "x" * 40, "release": {}}]},
     auth("w-mail")),
    ("/claims/complete", lambda t: {"token": "0" * 32 + ".1.30000.AAAA"}, auth("w-mail")),
    ("/claims/complete", lambda t: {"token": 7}, auth("w-mail")),  # 422 naming token
    ("/claims", lambda t: {**CLAIM, "max": 0}, auth("w-mail")),  # 422 naming max
    ("/claims", lambda t: {**CLAIM, "queues": ["video"]}, auth("w-mail")),  # 403: its queues
    ("/claims", lambda t: CLAIM, auth("viewer")),  # 403: its role
    ("/claims", lambda t: CLAIM, auth("shop")),  # 403: its role
    ("/claims", lambda t: CLAIM, {}),  # 401
    ("/claims/outcomes", lambda t: CLAIM, {"authorization": "Bearer nope-nope-nope"}),  # 401
    ("/claims", lambda t: b"{not json", {**auth("w-mail"), **JSON}),  # 400
    ("/claims", lambda t: b"[1]", {**auth("w-mail"), "content-type": "text/plain"}),  # 415
    ("/claims/heartbeat", lambda t: b" " * (MAX_HEARTBEAT_BODY + 1),
     {**auth("w-mail"), **JSON}),  # 413
    ("/claims", lambda t: {**CLAIM, "worker": "box-1"}, auth("w-all")),  # 409: the name's
    ("/claims", lambda t: {**CLAIM, "worker": "box-2"}, auth("ops")),  # an admin may claim
]  # fmt: skip


@pytest.fixture
async def doors() -> AsyncIterator[dict[bool, tuple[httpx.AsyncClient, Service]]]:
    made: dict[bool, tuple[httpx.AsyncClient, Service]] = {}
    for lean in (True, False):
        rt = Service(MemoryStore(), RuntimeConfig(workers=0, seed=1))
        await rt.start()
        app = create_app(rt, start_runtime=False, security=security(), ui=None, lean=lean)
        transport = httpx.ASGITransport(app=app)
        made[lean] = (httpx.AsyncClient(transport=transport, base_url="http://localhost"), rt)
    yield made
    for c, rt in made.values():
        await c.aclose()
        await rt.stop(0)


def _same(r: httpx.Response) -> tuple[int, bytes, str | None, str | None]:
    body = _TIME.sub(rb'"\1":T', _ID.sub(b'"ID"', _TOKEN.sub(b"TOKEN", r.content)))
    return (r.status_code, body, r.headers.get("content-type"), r.headers.get("www-authenticate"))


async def _walk(c: httpx.AsyncClient) -> list[tuple[int, bytes, str | None, str | None]]:
    for _ in range(3):
        made = await c.post("/jobs", json={"kind": "send", "queue": "mail"}, headers=auth("ops"))
        assert made.status_code == 201, made.text
    token = ""
    seen = []
    for path, body, headers in STEPS:
        given = body(token)
        kw: dict[str, Any] = {"content": given} if isinstance(given, bytes) else {"json": given}
        r = await c.post(path, headers=headers, **kw)
        if not token:
            token = r.json()["claims"][0]["token"]
        seen.append(_same(r))
    return seen


async def test_both_doors_answer_every_claims_call_the_same(
    doors: dict[bool, tuple[httpx.AsyncClient, Service]],
) -> None:
    lean, routed = await _walk(doors[True][0]), await _walk(doors[False][0])
    for (path, _, _), a, b in zip(STEPS, lean, routed, strict=True):
        assert a == b, (path, a, b)
    statuses = [status for status, *_ in lean]
    assert statuses == [200, 200, 200, 200, 409, 409, 409, 422, 409, 409, 422, 200, 200,
                        422, 422, 422, 403, 403, 403, 401, 401, 400, 415, 413, 409,
                        200]  # fmt: skip
    # the 4xx name what they refuse
    fields = {STEPS[i][0] + f"#{i}": lean[i][1] for i in (7, 10, 14, 15, 16)}
    assert b'"field":"delay_s"' in fields["/claims/snooze#7"]
    assert b'"field":"items[1].token"' in fields["/claims/heartbeat#10"]
    assert b'"field":"token"' in fields["/claims/complete#14"]
    assert b'"field":"max"' in fields["/claims#15"]
    assert b"video" in fields["/claims#16"]
    # the claim's answer is the real one: three jobs, each with a token, on both doors
    assert lean[0][1].count(b"TOKEN") == 3
    # what both did to their stores is the same too: one completed, two still running
    for c, _ in doors.values():
        states = sorted(j["state"] for j in (await c.get("/jobs", headers=auth("ops"))).json()[
            "jobs"])  # fmt: skip
        assert states == ["completed", "running", "running"], states


async def test_the_lean_doors_look_reads_a_disconnect_and_never_waits() -> None:
    """A long poll's look (``client_gone``) reads a disconnect the server already has, and
    finds a client still there without waiting for anything to come."""

    async def gone() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def idle() -> dict[str, Any]:
        await asyncio.Event().wait()  # nothing comes: still connected
        raise AssertionError("not reached")

    assert await client_gone(gone) is True
    assert await client_gone(idle) is False
