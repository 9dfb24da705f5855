"""What a server makes once, at first use, it makes on a thread: the OpenAPI document
(~65 ms, at the first ``/openapi.json``) and the dashboard's templates (~65 ms, at the
dashboard's first request). Neither waits before /readyz, neither stops the event loop, and
neither runs beside a server's first jobs unless someone asked for it."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest

from sqlq.common.engine.memory import MemoryStore
from sqlq.http import app as app_module
from sqlq.http.app import create_app
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.service import Service
from sqlq.ui.app import Dashboard
from tests.helpers import app_client, wait_for


async def test_the_openapi_document_is_made_on_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    made_on: list[threading.Thread] = []
    real = app_module._document

    def spy() -> dict[str, Any]:
        made_on.append(threading.current_thread())
        return real()

    monkeypatch.setattr(app_module, "_document", spy)
    rt = Service(MemoryStore(), RuntimeConfig(workers=0, seed=1))
    await rt.start()
    try:
        app = create_app(rt, start_runtime=False, ui=None)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            r = await http.get("/openapi.json")
        assert r.status_code == 200
        assert r.json()["openapi"].startswith("3.")
    finally:
        await rt.stop(0)
    assert len(made_on) == 1
    assert made_on[0] is not threading.main_thread()


class _HeldCompile:
    """``Dashboard.compile_templates`` held on its thread until ``go`` is set: which threads
    it ran on, and how many requests are waiting in ``Dashboard.compiled``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[tuple[threading.Thread, Dashboard]] = []
        self.started = threading.Event()
        self.go = threading.Event()
        self.waiting = 0
        real, real_compiled = Dashboard.compile_templates, Dashboard.compiled

        def spy(dashboard: Dashboard) -> None:
            self.started.set()
            assert self.go.wait(10)
            real(dashboard)
            self.seen.append((threading.current_thread(), dashboard))

        async def counted(dashboard: Dashboard) -> None:
            self.waiting += 1
            try:
                await real_compiled(dashboard)
            finally:
                self.waiting -= 1

        monkeypatch.setattr(Dashboard, "compile_templates", spy)
        monkeypatch.setattr(Dashboard, "compiled", counted)


async def test_the_templates_are_compiled_by_a_thread_at_the_dashboards_first_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held = _HeldCompile(monkeypatch)
    rt = Service(MemoryStore(), RuntimeConfig(workers=0, seed=1))
    await rt.start()
    try:
        app = create_app(rt, start_runtime=False)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
                r = await http.get("/healthz")
                assert r.status_code == 200
                assert not held.started.is_set()  # serving the API compiles nothing
                pages = asyncio.gather(*(http.get("/ui/") for _ in range(3)))
                await wait_for(lambda: held.waiting == 3, what="three requests at the compile")
                assert held.seen == []  # (all three wait on the one compile, held)
                held.go.set()
                done = await pages
                again = await http.get("/ui/")
    finally:
        await rt.stop(0)
    assert [p.status_code for p in (*done, again)] == [200] * 4
    assert len(held.seen) == 1  # once, however many asked at once
    thread, dashboard = held.seen[0]
    assert thread is not threading.main_thread()
    cache = dashboard.env.cache
    assert cache is not None
    assert {key[1] for key in cache} == set(dashboard.env.list_templates())


async def test_a_first_request_cancelled_meanwhile_leaves_the_compile_to_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held = _HeldCompile(monkeypatch)
    async with app_client(RuntimeConfig(workers=0, seed=1)) as http:
        first = asyncio.ensure_future(http.get("/ui/"))
        await wait_for(lambda: held.waiting == 1, what="the first request at the compile")
        first.cancel()  # (its client went away)
        with pytest.raises(asyncio.CancelledError):
            await first
        held.go.set()
        r = await http.get("/ui/")
    assert r.status_code == 200
    assert len(held.seen) == 1  # the cancelled request's compile went on, and served this one


async def test_a_failed_compile_is_tried_again_at_the_next_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []
    real = Dashboard.compile_templates

    def flaky(self: Dashboard) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("templates unreadable")
        real(self)

    monkeypatch.setattr(Dashboard, "compile_templates", flaky)
    rt = Service(MemoryStore(), RuntimeConfig(workers=0, seed=1))
    await rt.start()
    try:
        app = create_app(rt, start_runtime=False)
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            first = await http.get("/ui/")
            second = await http.get("/ui/")
    finally:
        await rt.stop(0)
    assert first.status_code == 500
    assert second.status_code == 200
    assert len(calls) == 2
