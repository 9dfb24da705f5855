"""Experiment Q's dramatiq on its ``RedisBroker``: the actor, and a ``group`` a batch.

``dramatiq sqlq.bench.redis_dramatiq`` imports this module, which sets the broker from
``REDIS_ENV``. ``max_retries=0``: a no-op never fails, and none is retried here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from sqlq.bench.redispeers import BATCH, REDIS_ENV, mark

broker = RedisBroker(url=os.environ.get(REDIS_ENV, "redis://127.0.0.1:6379/0"))  # type: ignore[no-untyped-call]
dramatiq.set_broker(broker)


def _work(i: int, sleep_s: float) -> None:
    if sleep_s:
        time.sleep(sleep_s)
    mark(i)


work = dramatiq.actor(actor_name="work", queue_name="q", max_retries=0)(_work)


def _send(chunk: list[int], sleep_s: float) -> None:
    """One ``group`` of messages, enqueued by its ``run``."""
    dramatiq.group(work.message(j, sleep_s) for j in chunk).run()  # type: ignore[no-untyped-call]


def enqueue(ids: Iterable[int], sleep_s: float) -> None:
    chunk: list[int] = []
    for i in ids:
        chunk.append(i)
        if len(chunk) == BATCH:
            _send(chunk, sleep_s)
            chunk = []
    if chunk:
        _send(chunk, sleep_s)
