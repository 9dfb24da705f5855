"""The clients' side of the pull protocol, against a mock transport: the bodies sent (the
protocol's structs, as the server decodes them), the answers read as those structs, a
stale single outcome as ``FencedError`` while a batch's stale item is a value, and which
calls are sent again after a lost reply."""

from __future__ import annotations

import json
from typing import Any

import httpx
import msgspec
import pytest

from sqlq import AsyncClient, Client, Conflict, FencedError, Invalid, Unavailable
from sqlq.common.protocol import (
    BeatItem,
    ClaimRequest,
    CompleteIn,
    FailIn,
    HeartbeatRequest,
    Outcome,
    OutcomesRequest,
    ProgressIn,
)

JOB = {"id": "a" * 32, "kind": "resize", "args": {"w": 1}, "state": "running", "attempts": 1,
       "epoch": 2, "created_at": 1.0, "ready_at": 1.0, "updated_at": 2.0,
       "checkpoint": {"at": 3}, "holder": "worker:w1", "lease_until": 40.0}  # fmt: skip


class Server:
    """Answers each path as the real server would, and keeps what it was sent."""

    def __init__(self) -> None:
        self.sent: list[httpx.Request] = []
        self.lose: set[int] = set()  # which requests (by number, from 1) lose their reply

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent.append(request)
        if len(self.sent) in self.lose:
            raise httpx.ReadError("connection reset", request=request)
        body: Any = json.loads(request.content) if request.content else None
        path = request.url.path
        if path == "/claims":
            msgspec.convert(body, ClaimRequest)  # what the server decodes
            return httpx.Response(200, json={"claims": [
                {"token": "t1", "lease_until": 40.0, "job": JOB}]})  # fmt: skip
        if path == "/claims/heartbeat":
            beats = msgspec.convert(body, HeartbeatRequest)
            return httpx.Response(200, json={"items": [
                {"token": i.token, "lease_until": 50.0, "cancel_requested": i.token == "t2"}
                if i.token != "stale" else {"token": i.token, "error": "fenced"}
                for i in beats.items]})  # fmt: skip
        if path == "/claims/outcomes":
            req = msgspec.convert(body, OutcomesRequest)
            return httpx.Response(200, json={"outcomes": [
                {"token": o.token, "state": "completed"} if o.token != "stale"
                else {"token": o.token, "error": "fenced"} for o in req.outcomes]})  # fmt: skip
        if path.startswith("/claims/"):
            if body["token"] == "stale":
                return httpx.Response(409, json={"token": "stale", "error": "fenced"})
            if body["token"] == "bad":
                return httpx.Response(422, json={"error": "invalid", "message": "no",
                                                 "field": "token"})  # fmt: skip
            return httpx.Response(200, json={"token": body["token"], "state": "completed"})
        if path == "/workers":
            return httpx.Response(200, json={"workers": [
                {"name": "w1", "principal": "admin", "role": "admin", "last_seen": 1.0,
                 "held": 2, "queues": ["default"]}]})  # fmt: skip
        return httpx.Response(404, json={"error": "not_found", "message": path})


def _async(server: Server) -> AsyncClient:
    return AsyncClient("http://q", transport=httpx.MockTransport(server), backoff_s=0.0)


async def test_a_claim_sends_the_protocols_body_and_reads_the_granted_jobs() -> None:
    server = Server()
    async with _async(server) as c:
        [g] = await c.claim(["images"], worker="w1", kinds=["resize"], max=50, wait_s=5,
                            lease_s=60)  # fmt: skip
    assert json.loads(server.sent[0].content) == {"queues": ["images"], "worker": "w1",
                                                  "kinds": ["resize"], "max": 50,
                                                  "wait_s": 5, "lease_s": 60}  # fmt: skip
    assert server.sent[0].headers["content-type"] == "application/json"
    assert (g.token, g.lease_until, g.job.id, g.job.checkpoint) == ("t1", 40.0, "a" * 32,
                                                                    {"at": 3})  # fmt: skip
    assert g.job.holder == "worker:w1"


async def test_a_heartbeat_takes_tokens_or_items_and_says_which_are_fenced() -> None:
    server = Server()
    async with _async(server) as c:
        beats = await c.heartbeat(
            ["t1", BeatItem(token="t2", progress=ProgressIn(percent=5, message="m")), "stale"]
        )
    assert json.loads(server.sent[0].content)["items"] == [
        {"token": "t1", "progress": None},
        {"token": "t2", "progress": {"percent": 5, "message": "m"}},
        {"token": "stale", "progress": None},
    ]
    assert [(b.token, b.lease_until, b.cancel_requested, b.error) for b in beats] == [
        ("t1", 50.0, False, None),
        ("t2", 50.0, True, None),
        ("stale", None, None, "fenced"),
    ]


async def test_a_stale_single_outcome_raises_and_a_stale_batch_item_is_a_value() -> None:
    server = Server()
    async with _async(server) as c:
        assert (await c.complete("t1", {"ok": 1})).state == "completed"
        with pytest.raises(FencedError) as fenced:
            await c.fail("stale", "boom", retry=False)
        assert isinstance(fenced.value, Conflict)
        with pytest.raises(Invalid) as invalid:
            await c.snooze("bad", 5)
        assert invalid.value.field == "token"
        await c.checkpoint("t1", [1, 2])
        await c.release("t1")
        answers = await c.outcomes([
            Outcome(token="t1", complete=CompleteIn(result=1)),
            Outcome(token="stale", fail=FailIn(error="x")),
            msgspec.Raw(b'{"token":"t3","release":{}}'),
        ])  # fmt: skip
        workers = await c.workers()
    assert [(a.token, a.state, a.error) for a in answers] == [
        ("t1", "completed", None),
        ("stale", None, "fenced"),
        ("t3", "completed", None),
    ]
    assert [json.loads(r.content) for r in server.sent[1:5]] == [
        {"token": "stale", "error": "boom", "retry": False},
        {"token": "bad", "delay_s": 5},
        {"token": "t1", "data": [1, 2]},
        {"token": "t1"},
    ]
    assert [r.url.path for r in server.sent[:5]] == [
        "/claims/complete", "/claims/fail", "/claims/snooze", "/claims/checkpoint",
        "/claims/release"]  # fmt: skip
    assert workers[0].held == 2


def test_the_sync_client_speaks_it_too_and_only_a_claim_is_never_sent_twice() -> None:
    server = Server()
    server.lose = {1, 3}  # the first heartbeat's reply, and the claim's
    with Client("http://q", transport=httpx.MockTransport(server), backoff_s=0.0) as c:
        assert [b.token for b in c.heartbeat(["t1"])] == ["t1"]  # sent again
        with pytest.raises(Unavailable):
            c.claim(["default"], worker="w1")  # a second claim would hold more jobs
    assert [r.url.path for r in server.sent] == ["/claims/heartbeat"] * 2 + ["/claims"]
