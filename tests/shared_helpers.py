"""What the shared-mode tests share: stores and nodes on one PostgreSQL database."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from sqlq.common.backoff import RetryPolicy
from sqlq.common.clock import SYSTEM_CLOCK
from sqlq.common.errors import RateLimited
from sqlq.common.models import Job
from sqlq.common.specs import JobSpec
from sqlq.engines.postgres.store import PostgresStore
from sqlq.runtime.kinds import JobContext, Registry, task
from sqlq.runtime.service import Service
from tests.helpers import NOW, ServiceFactory

Node = Callable[..., Service]


def new_job(n: int = 0, **kw: Any) -> Job:
    return Job.new(kind="sleep", args={"n": n}, now=NOW, **kw)


@pytest.fixture
async def stores(pg_db: str) -> AsyncIterator[Callable[..., PostgresStore]]:
    """Open ``PostgresStore``s on one database; closed at teardown."""
    made: list[PostgresStore] = []

    async def make(**options: Any) -> PostgresStore:
        store = PostgresStore(pg_db, **options)
        await store.open()
        made.append(store)
        return store

    yield make  # type: ignore[misc]
    for s in made:
        await s.close()


# -- nodes ----------------------------------------------------------------------------------

STARTED: list[str] = []


RUNNING: Counter[str] = Counter()


PEAK: Counter[str] = Counter()


LIMITED: set[str] = set()  # the jobs whose handler raised RateLimited already


def kinds(gate: asyncio.Event | None = None) -> Registry:
    reg = Registry()

    @task(registry=reg, hb_timeout=None)
    async def work(args: Any, ctx: JobContext) -> Any:
        queue = ctx.job.queue
        by_key = f"{queue}/{ctx.job.key}"  # (and by a fair claim's key)
        STARTED.append(args.get("name", ctx.job.id))
        if args.get("limited") and ctx.job.id not in LIMITED:  # an upstream's 429, once
            LIMITED.add(ctx.job.id)
            raise RateLimited(args["limited"])
        RUNNING[queue] += 1
        RUNNING[by_key] += 1
        PEAK[queue] = max(PEAK[queue], RUNNING[queue])
        PEAK[by_key] = max(PEAK[by_key], RUNNING[by_key])
        try:
            if gate is not None and args.get("gated", True):
                await gate.wait()
            await asyncio.sleep(args.get("sleep", 0))
        finally:
            RUNNING[queue] -= 1
            RUNNING[by_key] -= 1
        return args.get("name", "done")

    return reg


@pytest.fixture
def nodes(services: ServiceFactory, pg_db: str) -> Node:
    STARTED.clear()
    RUNNING.clear()
    LIMITED.clear()
    PEAK.clear()

    def make(*, kinds_: Registry | None = None, **config: Any) -> Service:
        config.setdefault("retry", RetryPolicy(base_s=0.001, cap_s=0.002))
        config.setdefault("lease_s", 2.0)
        config.setdefault("poll_s", 0.2)
        clock = config.pop("clock", SYSTEM_CLOCK)
        store = PostgresStore(config.pop("dsn", pg_db), clock=clock)
        return services(store, kinds=kinds_ or kinds(), clock=clock, **config)

    return make


async def submit(rt: Service, n: int = 1, **spec: Any) -> list[Job]:
    args = spec.pop("args", {})
    return (await rt.submit([JobSpec(kind="work", args=args, **spec) for _ in range(n)]))[0]


# -- the operations API across nodes --------------------------------------------------------


async def _api(rt: Service) -> Any:
    import httpx

    from sqlq.http.app import create_app

    transport = httpx.ASGITransport(app=create_app(rt, start_runtime=False))
    return httpx.AsyncClient(transport=transport, base_url="http://localhost")


def failing() -> Registry:
    reg = Registry()

    @task(registry=reg)
    def boom(args: Any) -> Any:
        if args.get("fail", True):
            raise RuntimeError("boom")
        return "fine"

    return reg
