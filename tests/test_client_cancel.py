"""The clients' cancels: ``cancel`` (force, and whether it was only a request) and
``cancel_matching`` over a real app in-process, and what each sends on the wire."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from sqlq import AsyncClient, Client, Conflict, Invalid, NotFound, State
from sqlq.http.app import create_app
from sqlq.runtime.service import Service
from tests import operations_helpers
from tests.helpers import ServiceFactory, final, wait_for
from tests.operations_helpers import STARTED, kinds


@pytest.fixture
async def pair(services: ServiceFactory) -> AsyncIterator[tuple[Service, AsyncClient]]:
    operations_helpers.GATE = asyncio.Event()  # an Event binds to its loop: one per test
    STARTED.clear()
    rt = services(kinds=kinds())
    await rt.start()
    transport = httpx.ASGITransport(app=create_app(rt, start_runtime=False))
    async with AsyncClient("http://localhost", transport=transport, backoff_s=0.0) as c:
        yield rt, c
    operations_helpers.GATE.set()


async def test_cancel_says_whether_it_cancelled_or_asked(pair: tuple[Service, AsyncClient]) -> None:
    rt, c = pair
    waiting = await c.submit("record", {"name": "w"}, delay_ms=60_000)
    done = await c.cancel(waiting.id)
    assert (done.state, done.cancel_requested) == (State.CANCELLED, False)
    running = await c.submit("gate", {"name": "g"})
    await wait_for(lambda: "g" in STARTED, 10, "the gate job to start")
    asked = await c.cancel(running.id)
    assert (asked.state, asked.cancel_requested) == (State.RUNNING, True)
    assert asked.cancel_requested_at is not None
    assert (await final(rt, running.id)).state is State.CANCELLED
    with pytest.raises(Conflict):
        await c.cancel(waiting.id)  # finished
    with pytest.raises(NotFound):
        await c.cancel("f" * 32)


async def test_cancel_matching_counts_both(pair: tuple[Service, AsyncClient]) -> None:
    _rt, c = pair
    await c.submit("record", {"name": "w"}, delay_ms=60_000, queue="a")
    await c.submit("gate", {"name": "g"}, queue="a")
    await wait_for(lambda: "g" in STARTED, 10, "the gate job to start")
    assert await c.cancel_matching(queue="b") == (0, 0)
    assert await c.cancel_matching(state="scheduled", queue="a") == (1, 0)
    assert await c.cancel_matching(kind="gate") == (0, 1)
    with pytest.raises(Invalid) as err:
        await c.cancel_matching(state="dead")
    assert err.value.field == "state"
    with pytest.raises(Invalid) as err:
        await c.cancel_matching(kind="")  # refused, not taken for "any kind"
    assert err.value.field == "kind"


def _job(state: str = "running", requested: bool = True) -> dict[str, Any]:
    return {"id": "c" * 32, "kind": "sleep", "args": {}, "state": state, "ready_at": 1.0,
            "created_at": 1.0, "updated_at": 1.0, "cancel_requested": requested,
            "cancel_requested_at": 2.0 if requested else None}  # fmt: skip


def test_what_the_sync_client_sends() -> None:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if request.url.path == "/jobs/cancel":
            return httpx.Response(200, json={"cancelled": 2, "requested": 5})
        return httpx.Response(202, json=_job())

    with Client("http://q", transport=httpx.MockTransport(handler)) as c:
        job = c.cancel("c" * 32, force=True)
        assert (job.state, job.cancel_requested, job.cancel_requested_at) == (
            State.RUNNING, True, 2.0,
        )  # fmt: skip
        c.cancel("c" * 32)
        assert c.cancel_matching(state="running", kind="k") == (2, 5)
        assert c.cancel_matching() == (2, 5)
    assert [(r.method, r.url.path, r.url.query) for r in sent[:2]] == [
        ("DELETE", f"/jobs/{'c' * 32}", b"force=1"), ("DELETE", f"/jobs/{'c' * 32}", b""),
    ]  # fmt: skip
    assert json.loads(sent[2].content) == {"state": "running", "kind": "k"}
    assert json.loads(sent[3].content) == {}  # every live job: a body that says so
