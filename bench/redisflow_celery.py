"""Experiment R's Celery 5.7: the graphs as Celery builds them, on a Redis broker and
result backend (a chord needs one).

A chain is ``chain(step.si(...), ...)``; a fan is the root chained into a ``chord`` of
the middle steps whose body is the last. ``celery -A sqlq.bench.redisflow_celery worker``
(``sqlq.bench.redispeers.RedisPeer.worker``). Acks are Celery's default, early, unless
``ACKS_LATE_ENV`` is ``1`` (``task_acks_late`` with ``task_reject_on_worker_lost``).
"""

from __future__ import annotations

import os

from celery import Celery, chain, chord  # type: ignore[import-untyped]  # no py.typed

from sqlq.bench.flowmarks import STEP_MS, Graph, final
from sqlq.bench.flowmarks import step as run_step
from sqlq.bench.redispeers import ACKS_LATE_ENV, REDIS_ENV

late = os.environ.get(ACKS_LATE_ENV) == "1"
url = os.environ.get(REDIS_ENV, "redis://127.0.0.1:6379/0")
app = Celery("sqlq-bench-r", broker=url, backend=url)
# A message taken and not acknowledged (acks_late, its worker killed) is delivered again
# once its visibility timeout passes: 1 h by default, here 10 s, within R's wait.
VISIBILITY_S = 10
app.conf.update(
    task_acks_late=late,
    task_reject_on_worker_lost=late,
    broker_connection_retry_on_startup=True,
    broker_transport_options={"visibility_timeout": VISIBILITY_S},
    result_expires=3600,
)


@app.task(name="flow_step")  # type: ignore[untyped-decorator]  # celery is read as Any
def step(key: str, ms: int) -> None:
    run_step(key, ms)


def submit(graphs: list[Graph]) -> None:
    for g in graphs:
        roots = [k for k, parents in g.items() if not parents]
        last = final(g)
        middle = [k for k in g if k not in roots and k != last]
        if all(len(p) <= 1 for p in g.values()):  # a chain: each after the one before
            chain(*(step.si(k, STEP_MS) for k in g)).apply_async()
        else:  # a fan: the root, then a chord of the middle into the last
            header = [step.si(k, STEP_MS) for k in middle]
            chain(step.si(roots[0], STEP_MS), chord(header, step.si(last, STEP_MS))).apply_async()
