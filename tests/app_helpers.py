"""Clients on an app over a fresh memory service, in process: what the HTTP and dashboard
tests share (each client's service started; both closed at teardown)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from sqlq.common.engine.memory import MemoryStore
from sqlq.http.app import create_app
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.kinds import Registry
from sqlq.runtime.service import Service

Make = Callable[..., Any]


async def app_clients(
    workers: int = 1, *, fault_injection: bool = False, raise_app_exceptions: bool = True
) -> AsyncIterator[Make]:
    """For a fixture: ``await make(kinds=..., **create_app options)``, a client whose
    ``runtime`` is its started service."""
    made: list[tuple[Service, httpx.AsyncClient]] = []

    async def make(kinds: Registry | None = None, **options: Any) -> httpx.AsyncClient:
        config = RuntimeConfig(workers=workers, seed=1, fault_injection=fault_injection)
        rt = Service(MemoryStore(), config, kinds=kinds)
        await rt.start()
        app = create_app(rt, start_runtime=False, **options)
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
        c = httpx.AsyncClient(transport=transport, base_url="http://localhost")
        c.runtime = rt  # type: ignore[attr-defined]
        made.append((rt, c))
        return c

    yield make
    for rt, c in made:
        await c.aclose()
        await rt.stop(0)
