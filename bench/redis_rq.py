"""Experiment Q's RQ: the task, and ``Queue.enqueue_many`` in one pipeline a batch.

Its worker is ``rq worker-pool`` on queue ``q`` (``sqlq.bench.redispeers``): each of its
workers forks a work horse for every job, RQ's usual way. Its ``--worker-class`` is
``Worker`` below, RQ's own, named from here so that this module is imported before the
forks (RQ's performance notes: preload what jobs import), not once in every horse.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from redis import Redis
from rq import Queue
from rq import Worker as _Worker

from sqlq.bench.redispeers import BATCH, REDIS_ENV, mark


class Worker(_Worker):
    """RQ's worker, unchanged: its home is what makes the workers import this module."""


def work(i: int, sleep_s: float) -> None:
    if sleep_s:
        time.sleep(sleep_s)
    mark(i)


def enqueue(ids: Iterable[int], sleep_s: float) -> None:
    conn = Redis.from_url(os.environ[REDIS_ENV])
    q = Queue("q", connection=conn)
    chunk: list[int] = []

    def send() -> None:
        with conn.pipeline() as pipe:
            q.enqueue_many([Queue.prepare_data(work, (j, sleep_s)) for j in chunk], pipeline=pipe)
            pipe.execute()

    for i in ids:
        chunk.append(i)
        if len(chunk) == BATCH:
            send()
            chunk = []
    if chunk:
        send()
