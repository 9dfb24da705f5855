"""The job's own routes (``POST /jobs``, ``POST /jobs/batch``, ``GET /jobs/{id}``) answer
as plain ASGI ahead of the router (``sqlq.http.lean``); through the router they answer
the same, byte for byte but the job ids and times: one piece of work, two doors. Each
case below goes through both, on a server with a token file, so the guard, the roles
and a submitter's queues are in the path too."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from sqlq.common.engine.memory import MemoryStore
from sqlq.common.roles import Principal, Role
from sqlq.http.app import create_app
from sqlq.http.guard import Security
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.service import Service

TOKENS = {"admin": "a" * 32, "mail": "m" * 32, "viewer": "v" * 32}
SECURITY = Security(principals=(
    (TOKENS["admin"], Principal("ops", Role.ADMIN)),
    (TOKENS["mail"], Principal("mailer", Role.SUBMIT, frozenset({"mail"}))),
    (TOKENS["viewer"], Principal("eyes", Role.READ)),
))  # fmt: skip
_ID = re.compile(rb'"[0-9a-f]{32}"')
_TIME = re.compile(rb'"(created_at|updated_at|ready_at)":[0-9.e+]+')


def _auth(who: str) -> dict[str, str]:
    return {"authorization": f"Bearer {TOKENS[who]}"}


CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/jobs", {"json": {"kind": "sleep", "queue": "mail"}, "headers": _auth("mail")}),
    ("POST", "/jobs", {"json": {"kind": "sleep", "args": {"work_ms": -1}},
                       "headers": _auth("admin")}),
    ("POST", "/jobs", {"json": {"kind": "sleep", "queue": "video"}, "headers": _auth("mail")}),
    ("POST", "/jobs", {"json": {"kind": "sleep"}, "headers": _auth("viewer")}),
    ("POST", "/jobs", {"content": b"{not json", "headers": {**_auth("admin"),
                                                             "content-type": "application/json"}}),
    ("POST", "/jobs", {"content": b"x" * (2 << 20), "headers": {
        **_auth("admin"), "content-type": "application/json"}}),
    ("POST", "/jobs", {"json": {"kind": "sleep", "idempotency_key": "a"},
                       "headers": {**_auth("admin"), "idempotency-key": "b"}}),
    ("POST", "/jobs", {"json": {"kind": "sleep"}, "headers": {**_auth("admin"),
                                                               "idempotency-key": "k1"}}),
    ("POST", "/jobs/batch", {"json": {"jobs": [{"kind": "sleep"}, {"kind": "nope"}]},
                             "headers": _auth("admin")}),
    ("POST", "/jobs/batch", {"json": {"jobs": [{"kind": "sleep", "queue": "mail"},
                                               {"kind": "sleep", "queue": "x"}]},
                             "headers": _auth("mail")}),
    ("GET", "/jobs/0123456789abcdef0123456789abcdef", {"headers": _auth("admin")}),
    ("GET", "/jobs/not-an-id", {"headers": _auth("admin")}),
    ("GET", "/jobs/0123456789abcdef0123456789abcdef?wait=x", {"headers": _auth("admin")}),
    ("GET", "/jobs/0123456789abcdef0123456789abcdef", {}),
]  # fmt: skip


@pytest.fixture
async def doors() -> AsyncIterator[dict[bool, httpx.AsyncClient]]:
    made = []
    clients = {}
    for lean in (True, False):
        rt = Service(MemoryStore(), RuntimeConfig(workers=0, seed=1))
        await rt.start()
        app = create_app(rt, start_runtime=False, security=SECURITY, ui=None, lean=lean)
        transport = httpx.ASGITransport(app=app)
        clients[lean] = httpx.AsyncClient(transport=transport, base_url="http://localhost")
        made.append(rt)
    yield clients
    for c in clients.values():
        await c.aclose()
    for rt in made:
        await rt.stop(0)


def _same(r: httpx.Response) -> tuple[int, bytes, str | None, str | None]:
    body = _TIME.sub(rb'"\1":T', _ID.sub(b'"ID"', r.content))
    return (r.status_code, body, r.headers.get("content-type"), r.headers.get("retry-after"))


async def test_both_doors_answer_the_same(doors: dict[bool, httpx.AsyncClient]) -> None:
    for method, path, kwargs in CASES:
        lean = await doors[True].request(method, path, **kwargs)
        routed = await doors[False].request(method, path, **kwargs)
        assert _same(lean) == _same(routed), (method, path, lean.content, routed.content)
    # and a job made through one door reads back through it, typed as the view is
    for door in (True, False):
        c = doors[door]
        made = (await c.post("/jobs", json={"kind": "sleep"}, headers=_auth("admin"))).json()
        got = await c.get(f"/jobs/{made['id']}?wait=0", headers=_auth("viewer"))
        assert (got.status_code, got.json()["id"]) == (200, made["id"])
        other = await c.get(f"/jobs/{made['id']}", headers=_auth("mail"))
        assert other.status_code == 404  # another queue's job: as missing as none at all


async def test_a_body_sent_in_parts_is_read_whole_and_bounded(
    doors: dict[bool, httpx.AsyncClient],
) -> None:
    """No Content-Length: the body comes in parts, and its bound holds as they come."""

    async def parts(*chunks: bytes) -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    headers = {**_auth("admin"), "content-type": "application/json"}
    for door in (True, False):
        c = doors[door]
        ok = await c.post("/jobs", content=parts(b'{"kind":', b' "sleep"}'), headers=headers)
        assert ok.status_code == 201, ok.text
        big = await c.post("/jobs", content=parts(*[b" " * 40_000] * 30), headers=headers)
        assert (big.status_code, big.json()["error"]) == (413, "too_large")
