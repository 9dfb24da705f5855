"""Experiment P's peer: huey 3.5 running ``sqlq.bench.spinkind.spin`` on its process consumer.

    python -m sqlq.bench.hueyspin enqueue JOBS ROUNDS      # prints the seconds it took
    python -m huey.bin.huey_consumer sqlq.bench.hueyspin.huey -k process -w 2

Storage: ``SqliteHuey`` on the file ``HUEY_DB_ENV`` names, with ``fsync=True``. There is no
Redis on this machine (huey's first storage); of the two that need no server, SQLite is
the one huey documents for production and the one sqlq's own engine uses, and with fsync
it is durable at each enqueue and dequeue as sqlq is at ``--sync full``. ``FileHuey``
keeps one file per task in a directory under one lock: it exists for tests and tiny
setups. The worker's storage barely matters here anyway: every job is ~30 ms of CPU.
"""

from __future__ import annotations

import os
import sys
import time

from huey import SqliteHuey

from sqlq.bench.spinkind import HUEY_DB_ENV, spin, stamp

if not os.environ.get(HUEY_DB_ENV):  # else SqliteHuey would make a file wherever it runs
    raise RuntimeError(f"{HUEY_DB_ENV} names no file: set it to huey's SQLite file")
huey = SqliteHuey(name="sqlq-bench-p", filename=os.environ[HUEY_DB_ENV], fsync=True)


@huey.task()  # type: ignore[untyped-decorator]  # huey is read as Any (pyproject)
def spin_task(rounds: int) -> None:
    start = time.time()
    spin(rounds)
    stamp(start)


def enqueue(jobs: int, rounds: int) -> float:
    """Enqueue ``jobs`` tasks, one call each (huey has no batch enqueue); the seconds taken."""
    t0 = time.perf_counter()
    for _ in range(jobs):
        spin_task(rounds)
    return time.perf_counter() - t0


if __name__ == "__main__":
    if sys.argv[1:2] != ["enqueue"] or len(sys.argv) != 4:
        sys.exit("usage: python -m sqlq.bench.hueyspin enqueue JOBS ROUNDS")
    # huey names a task by its module: enqueue through this module's real name, not
    # ``__main__``, or the consumer, which imports it by that name, can't find the task.
    from sqlq.bench import hueyspin

    print(hueyspin.enqueue(int(sys.argv[2]), int(sys.argv[3])))
