"""What the runtime tests share: the scheduler of a service, an HTTP client on it."""

from __future__ import annotations

import httpx

from sqlq.http.app import create_app
from sqlq.runtime.local import LocalClaims
from sqlq.runtime.scheduler import Scheduler
from sqlq.runtime.service import Service


def lanes(rt: Service) -> Scheduler:
    """The scheduler of a service on a single-node store (the tests of the lanes)."""
    assert isinstance(rt.claims, LocalClaims)
    return rt.claims.scheduler


async def _http(rt: Service) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(rt, start_runtime=False)),
        base_url="http://localhost",
    )
