"""A workflow through kill -9, on a real ``sqlq serve`` (walq, SQLite and PostgreSQL).

A remote queue makes each completion a step the test takes (``/claims``): a diamond
a -> (b, c) -> d is driven to b completed and c running, the server is killed with
SIGKILL, and a new one recovers from the files (PostgreSQL: the database). d must still
wait for c, then run once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from sqlq.bench.client.server import ServerProcess
from tests.helpers import start_ready

pytestmark = pytest.mark.slow

DIAMOND = {
    "workflow": True,
    "jobs": [
        {"kind": "step", "queue": "flow", "ref": "a", "args": {"n": "a"}},
        {"kind": "step", "queue": "flow", "ref": "b", "depends_on": ["a"], "args": {"n": "b"}},
        {"kind": "step", "queue": "flow", "ref": "c", "depends_on": ["a"], "args": {"n": "c"}},
        {"kind": "step", "queue": "flow", "ref": "d", "depends_on": ["b", "c"], "args": {"n": "d"}},
    ],
}


async def _claim(http: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    """Every job the queue has due now, by its ``n``: its claim (token, job)."""
    body = {"queues": ["flow"], "worker": "w1", "max": 10, "wait_s": 0, "lease_s": 120}
    r = await http.post("/claims", json=body)
    assert r.status_code == 200, r.text
    return {c["job"]["args"]["n"]: c for c in r.json()["claims"]}


async def _complete(http: httpx.AsyncClient, claim: dict[str, Any]) -> None:
    r = await http.post("/claims/complete", json={"token": claim["token"], "result": None})
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "completed"


async def _states(http: httpx.AsyncClient, ids: list[str]) -> list[str]:
    return [(await http.get(f"/jobs/{i}")).json()["state"] for i in ids]


@pytest.mark.parametrize("engine", ["wal", "sqlite", "postgres"])
async def test_a_diamond_across_a_kill_between_its_two_middle_completions(
    tmp_path: Path, engine: str, request: pytest.FixtureRequest
) -> None:
    if engine == "postgres":  # a real PostgreSQL, its own database
        where = ("--dsn", str(request.getfixturevalue("pg_db")))
    else:
        where = ("--data", str(tmp_path / "data"))
    args = ("--store", engine, *where, "--remote-queue", "flow")
    server: ServerProcess = await start_ready(*args)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            r = await http.post("/jobs/batch", json=DIAMOND)
            assert r.status_code == 201, r.text
            ids = r.json()["ids"]
            first = await _claim(http)
            assert list(first) == ["a"]
            await _complete(http, first["a"])
            middle = await _claim(http)
            assert sorted(middle) == ["b", "c"]
            await _complete(http, middle["b"])
            assert await _states(http, ids) == ["completed", "completed", "running", "waiting"]
    finally:
        server.stop()  # SIGKILL: b's completion is durable, c is held under its lease
    server = await start_ready(*args)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
            assert await _states(http, ids) == ["completed", "completed", "running", "waiting"]
            d = (await http.get(f"/jobs/{ids[3]}")).json()
            assert d["flow"]["deps_pending"] == 1
            assert await _claim(http) == {}  # d waits for c, across the restart
            await _complete(http, middle["c"])  # c's claim outlived the server
            last = await _claim(http)
            assert list(last) == ["d"]
            assert await _claim(http) == {}  # released once
            await _complete(http, last["d"])
            assert await _states(http, ids) == ["completed"] * 4
            d = (await http.get(f"/jobs/{ids[3]}")).json()
            assert d["attempts_total"] == 1
    finally:
        server.stop()
