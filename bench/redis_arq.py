"""Experiment Q's arq: the coroutine task, ``enqueue_job`` in ``gather`` a batch, and the
``WorkerSettings`` its ``arq`` command runs (``max_jobs`` from ``CONCURRENCY_ENV``).

arq 0.28.0 declares ``redis<6``, and Celery 5.7's kombu needs ``redis>=6.4``, so pip can
install the two into one environment only with arq's ``--no-deps``; it runs on the
redis-py the others use (``pyproject.toml``'s ``redis-peers`` extra says so).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from typing import Any, ClassVar

from arq import create_pool
from arq.connections import RedisSettings

from sqlq.bench.redispeers import BATCH, CONCURRENCY_ENV, REDIS_ENV, mark

SETTINGS = RedisSettings.from_dsn(os.environ.get(REDIS_ENV, "redis://127.0.0.1:6379/0"))
GATHER = 50  # enqueue_job calls in flight at once: redis-py 8's pool refuses a thousand


async def work(ctx: dict[str, Any], i: int, sleep_s: float) -> None:
    if sleep_s:
        await asyncio.sleep(sleep_s)
    mark(i)


class WorkerSettings:
    functions: ClassVar[list[Any]] = [work]
    redis_settings = SETTINGS
    max_jobs = int(os.environ.get(CONCURRENCY_ENV, "10"))  # arq's default: 10


async def _gather(pool: Any, chunk: list[int], sleep_s: float) -> None:
    """A batch as ``enqueue_job`` calls under ``gather``, ``GATHER`` of them at a time."""
    for k in range(0, len(chunk), GATHER):
        part = chunk[k : k + GATHER]
        await asyncio.gather(*(pool.enqueue_job("work", j, sleep_s) for j in part))


async def _enqueue(ids: Iterable[int], sleep_s: float) -> None:
    pool = await create_pool(SETTINGS)
    try:
        chunk: list[int] = []
        for i in ids:
            chunk.append(i)
            if len(chunk) == BATCH:
                await _gather(pool, chunk, sleep_s)
                chunk = []
        if chunk:
            await _gather(pool, chunk, sleep_s)
    finally:
        await pool.aclose()


def enqueue(ids: Iterable[int], sleep_s: float) -> None:
    asyncio.run(_enqueue(ids, sleep_s))
