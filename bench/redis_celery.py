"""Experiment Q's Celery 5.7 on a Redis broker: the task, its enqueue, the app its worker runs.

``celery -A sqlq.bench.redis_celery worker`` (``sqlq.bench.redispeers``). Results are
ignored (no backend: the no-op job's cost is the broker's). Acks are Celery's default,
early (a message is acknowledged as its worker takes it, before it runs), unless
``ACKS_LATE_ENV`` is ``1``: then ``task_acks_late`` with ``task_reject_on_worker_lost``,
the settings Celery documents for a job that must survive its worker.

Experiment S's peer: ``limited``, a task with Celery's ``rate_limit`` (``RATE_ENV``, e.g.
``50/s``), which each worker process enforces on its own, stamping its start.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from celery import Celery, group  # type: ignore[import-untyped]  # no py.typed

from sqlq.bench.redispeers import ACKS_LATE_ENV, BATCH, REDIS_ENV, mark, stamp

RATE_ENV = "SQLQ_BENCH_RATE"  # ``limited``'s rate_limit, as Celery writes one

late = os.environ.get(ACKS_LATE_ENV) == "1"
app = Celery("sqlq-bench-q", broker=os.environ.get(REDIS_ENV, "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_ignore_result=True,
    task_acks_late=late,
    task_reject_on_worker_lost=late,
    broker_connection_retry_on_startup=True,
)


@app.task(name="work")  # type: ignore[untyped-decorator]  # celery is read as Any
def work(i: int, sleep_s: float) -> None:
    if sleep_s:
        time.sleep(sleep_s)
    mark(i)


def enqueue(ids: Iterable[int], sleep_s: float) -> None:
    """A ``group`` of ``BATCH`` signatures a call, sent through one producer."""
    chunk: list[int] = []
    for i in ids:
        chunk.append(i)
        if len(chunk) == BATCH:
            group(work.s(j, sleep_s) for j in chunk).apply_async()
            chunk = []
    if chunk:
        group(work.s(j, sleep_s) for j in chunk).apply_async()


@app.task(name="limited", rate_limit=os.environ.get(RATE_ENV, "50/s"))  # type: ignore[untyped-decorator]
def limited() -> None:
    stamp()


def enqueue_limited(n: int, workers: int = 0, within: float = 60.0) -> None:
    """``n`` of ``limited``, ``BATCH`` a ``group``; first, until ``workers`` answer a ping
    (so none starts after the backlog is queued, to find the others' burst taken)."""
    deadline = time.monotonic() + within
    while workers and len(app.control.ping(timeout=0.5)) < workers:
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {workers} Celery workers answered in {within:g} s")
    for start in range(0, n, BATCH):
        group(limited.s() for _ in range(min(BATCH, n - start))).apply_async()
