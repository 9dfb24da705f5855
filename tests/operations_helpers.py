"""What the operations tests share: the gate kinds and an API client fixture over a service."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from sqlq.common.backoff import RetryPolicy
from sqlq.http.app import create_app
from sqlq.runtime.kinds import JobContext, Registry, task
from sqlq.runtime.service import Service
from tests.helpers import ServiceFactory

GATE = asyncio.Event()


STARTED: list[str] = []


def kinds() -> Registry:
    reg = Registry()

    @task(registry=reg)
    async def gate(args: Any, ctx: JobContext) -> Any:
        STARTED.append(args.get("name", ctx.job.id))
        await GATE.wait()
        return "opened"

    @task(registry=reg)
    async def record(args: Any) -> Any:
        STARTED.append(args["name"])
        return args["name"]

    @task(registry=reg)
    def boom(args: Any) -> Any:
        raise RuntimeError("boom")

    return reg


Client = Callable[..., Any]


@pytest.fixture
async def api(services: ServiceFactory) -> AsyncIterator[Client]:
    global GATE
    GATE = asyncio.Event()  # an Event binds to the loop it is first awaited on: one per test
    STARTED.clear()
    clients: list[httpx.AsyncClient] = []

    async def make(**config: Any) -> tuple[Service, httpx.AsyncClient]:
        config.setdefault("retry", RetryPolicy(base_s=0.001, cap_s=0.002))
        rt = services(kinds=kinds(), **config)
        await rt.start()
        transport = httpx.ASGITransport(app=create_app(rt, start_runtime=False))
        c = httpx.AsyncClient(transport=transport, base_url="http://localhost")
        clients.append(c)
        return rt, c

    yield make
    GATE.set()
    for c in clients:
        await c.aclose()
