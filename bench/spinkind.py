"""Experiment P's handlers (``sqlq.bench.experiments.p_remote``), one module that sqlq
(``sqlq serve --import`` and ``sqlq worker --import``) and huey (``sqlq.bench.hueyspin``)
both import, so every system runs the very same code.

- ``bench.spin``: a pure-Python CPU loop (``spin``), a plain function, so a worker's
  ``--processes`` decides how many cores it gets; about 20-50 ms at ``ROUNDS`` on this
  machine. It takes only ``args`` (no context), which any process can run.
- ``bench.noop``: does nothing, on the event loop: what the queue itself costs.

With ``LOG_ENV`` set, each run appends ``pid start end`` (wall-clock seconds) to that file
in one ``write`` of a file opened for appending, which is atomic for a line this short, so
processes of one worker, of huey's consumer or of the server can share the file: the
drain is read from the handlers' own clocks, the same way for every system.
"""

from __future__ import annotations

import os
import time
from typing import Any

from sqlq import task

IMPORT = "sqlq.bench.spinkind"
NOOP, SPIN = "bench.noop", "bench.spin"
LOG_ENV = "SQLQ_BENCH_P_LOG"
HUEY_DB_ENV = "SQLQ_BENCH_HUEY_DB"  # huey's SQLite file (``sqlq.bench.hueyspin``)
ROUNDS = 300_000


def spin(rounds: int) -> int:
    """Integer arithmetic the interpreter runs under the GIL: no I/O, no C extension."""
    x = 0
    for i in range(rounds):
        x = (x * 31 + i) % 1_000_003
    return x


def stamp(start: float) -> None:
    """Append ``pid start end`` to the log ``LOG_ENV`` names, if it names one."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, f"{os.getpid()} {start:.6f} {time.time():.6f}\n".encode())
    finally:
        os.close(fd)


def read_log(path: str | os.PathLike[str]) -> list[tuple[int, float, float]]:
    """The log's lines as ``(pid, start, end)``; none if it does not exist yet."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        pid, start, end = line.split()
        out.append((int(pid), float(start), float(end)))
    return out


@task(name=SPIN, timeout=600)
def spinning(args: Any) -> Any:
    start = time.time()
    x = spin(int(args["rounds"]))
    stamp(start)
    return {"x": x}


@task(name=NOOP, timeout=60)
async def noop(args: Any) -> Any:
    stamp(time.time())  # a few microseconds, and only with LOG_ENV set (the latency runs)
    return None
