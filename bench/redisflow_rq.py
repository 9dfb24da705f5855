"""Experiment R's RQ 3.0: the graphs as ``depends_on``, on queue ``q``.

Each step is enqueued after the jobs of its parents (``depends_on``, a list for the
fan's last step); RQ enqueues a dependent once its dependencies have finished. Its
worker is ``rq worker-pool`` with ``Worker`` below (``sqlq.bench.redispeers``).
"""

from __future__ import annotations

import os

from redis import Redis
from rq import Queue
from rq import Worker as _Worker
from rq.job import Job

from sqlq.bench.flowmarks import STEP_MS, Graph
from sqlq.bench.flowmarks import step as run_step
from sqlq.bench.redispeers import REDIS_ENV


class Worker(_Worker):
    """RQ's worker, unchanged: its home is what makes the workers import this module."""


def step(key: str, ms: int) -> None:
    run_step(key, ms)


def submit(graphs: list[Graph]) -> None:
    q = Queue("q", connection=Redis.from_url(os.environ[REDIS_ENV]))
    for g in graphs:
        made: dict[str, Job] = {}
        for key, parents in g.items():  # (parents come first in every graph)
            after = [made[p] for p in parents]
            made[key] = q.enqueue(step, key, STEP_MS, depends_on=after or None)
