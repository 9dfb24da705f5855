"""Two worker tokens and one worker name, through the HTTP app on the real runtime: the
name stays with the token that first claimed under it (``GET /workers`` shows its
worker, not the other's), and the other's claim under it is a 409 naming ``worker``."""

from __future__ import annotations

from typing import Any

import httpx

from tests.remote_http_helpers import Make, auth, security, served

__all__ = ["served"]  # the fixture, by its name

REMOTE = {"remote_queues": frozenset({"mail", "video"})}


async def _claim(c: httpx.AsyncClient, who: str, worker: str, queue: str) -> httpx.Response:
    return await c.post("/claims", json={"queues": [queue], "worker": worker}, headers=auth(who))


async def _workers(c: httpx.AsyncClient) -> list[dict[str, Any]]:
    r = await c.get("/workers", headers=auth("viewer"))
    return [{k: w[k] for k in ("name", "principal", "held", "queues")}
            for w in r.json()["workers"]]  # fmt: skip


async def test_a_name_stays_with_the_token_that_first_claimed_under_it(served: Make) -> None:
    s = await served(security(), fake=False, **REMOTE)
    c = s.client
    for queue in ("mail", "video"):
        r = await c.post("/jobs", json={"kind": "k", "queue": queue}, headers=auth("ops"))
        assert r.status_code == 201, r.text
    r = await _claim(c, "w-mail", "box-1", "mail")
    [mine] = r.json()["claims"]
    r = await _claim(c, "w-all", "box-1", "video")
    assert r.status_code == 409, r.text
    assert (r.json()["error"], r.json()["field"]) == ("worker_name_taken", "worker")
    assert "w-mail" not in r.json()["message"]
    assert await _workers(c) == [
        {"name": "box-1", "principal": "w-mail", "held": 1, "queues": ["mail"]}
    ]
    r = await _claim(c, "w-all", "box-2", "video")  # under its own name: served
    assert len(r.json()["claims"]) == 1, r.text
    # a token is its job's capability: the other may renew it, and takes over nothing
    r = await c.post("/claims/heartbeat", json={"items": [{"token": mine["token"]}]},
                     headers=auth("w-all"))  # fmt: skip
    assert r.json()["items"][0].get("lease_until") is not None, r.text
    assert await _workers(c) == [
        {"name": "box-2", "principal": "w-all", "held": 1, "queues": ["video"]},
        {"name": "box-1", "principal": "w-mail", "held": 1, "queues": ["mail"]},
    ]
