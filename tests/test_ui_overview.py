"""What the overview shows and where it reads it: the sampler on the injected clock, the
census in shared mode, the store's figures on every engine."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx

from sqlq.common.clock import FakeClock
from sqlq.common.store import JobStore
from sqlq.engines.postgres.store import PostgresStore
from sqlq.http.app import create_app
from sqlq.ui.overview import SAMPLE_EVERY_S, Sampler
from tests.helpers import ServiceFactory, StoreFactory, submit, wait_for


async def test_the_overview_shows_the_last_compaction(
    durable_factory: StoreFactory, services: ServiceFactory
) -> None:
    rt = services(durable_factory(), compact_every_s=0.05)
    await rt.start()
    await submit(rt, delay_ms=60_000)
    app = create_app(rt, start_runtime=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
        seen: list[str] = [""]

        async def compacted() -> bool:
            seen[0] = (await c.get("/ui/")).text
            return "none since start" not in seen[0]

        await wait_for(compacted, what="a compaction on the overview")
    assert re.search(r" ago: pruned \d+, [\d.]+ \w*B → [\d.]+ \w*B in [\d.]+ s", seen[0])


async def test_the_sampler_waits_on_the_injected_clock(services: ServiceFactory) -> None:
    clock = FakeClock()
    rt = services(clock=clock)
    await rt.start()
    sampler = Sampler(rt, clock)

    async def turns() -> None:  # the sampler's task runs on the loop's next turns
        for _ in range(3):
            await asyncio.sleep(0)

    sampler.start()
    try:
        await turns()
        assert len(sampler.history) == 1  # one at the start
        for n in (2, 3, 4):
            clock.advance(SAMPLE_EVERY_S)  # fires the sampler's sleep; no real second passes
            await turns()
            assert len(sampler.history) == n
    finally:
        await sampler.stop()


async def test_in_shared_mode_the_overview_reads_the_census_the_claimer_keeps(
    pg_db: str, services: ServiceFactory
) -> None:
    store = PostgresStore(pg_db)
    rt = services(store)
    await rt.start()
    await submit(rt, delay_ms=60_000, queue="mail")
    await wait_for(lambda: ("scheduled", "mail") in rt.view.census(), what="a census")
    here = asyncio.current_task()  # the ASGI transport runs the app in this task
    asked: list[str] = []
    for name in ("census", "paused_queues", "nodes", "list_jobs", "get"):
        real = getattr(store, name)

        def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
            if asyncio.current_task() is here:  # not the claimer's own census loop
                asked.append(_name)
            return _real(*args)

        setattr(store, name, counted)
    app = create_app(rt, start_runtime=False)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as c:
        for _ in range(3):
            live = (await c.get("/ui/", headers={"hx-request": "true"})).text
    assert asked == []
    assert ">mail<" in live
    assert 'id="count-scheduled">1<' in live


async def test_every_engine_fills_the_overviews_store_fields(store: JobStore) -> None:
    """Disk size and the last compaction are common fields the dashboard reads by name;
    ``/stats`` keeps each engine's own keys for them."""
    assert store.stats().last_compaction is None
    report = await store.compact()
    stats = store.stats()
    assert stats.last_compaction is not None
    assert stats.last_compaction[1] == report
    if store.name in ("walq", "sqlite"):
        assert stats.disk_bytes is not None
        assert stats.disk_bytes > 0
    else:
        assert stats.disk_bytes is None  # no files of its own
    keys = set(stats.to_dict())
    assert ("disk_bytes" in keys) == (store.name == "sqlite")
    assert ({"log_bytes", "last_compaction"} <= keys) == (store.name == "walq")
