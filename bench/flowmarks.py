"""Experiment R's peers: the same graphs on sqlq and on the Redis queues, judged from marks.

Every system runs the same graphs of the same step: a chain of ``CHAIN`` steps, and a
fan 1 -> ``FAN`` -> 1 (Celery: a chain into a chord; RQ: ``depends_on``; sqlq: a
workflow). A step appends ``s <key> <time>`` as it starts and ``e <key> <time>`` as it
ends to the file ``MARKS_ENV`` names (one ``write`` on an ``O_APPEND`` descriptor, from
whichever process runs it), so one judge reads every system alike, with no broker or
server asked (``judge``):

- a hop's release latency: the child's first start less its parent's first end;
- an early start: a step started before each of its parents had ended;
- a double run: a step that ended more than once (at-least-once delivery's rerun of a
  step whose end was not recorded before a kill; in a clean run, a callback fired twice);
- a stuck graph: one whose last step never ended.

The sqlq step is the task ``flow.step`` (``sqlq serve --import sqlq.bench.flowstep``);
the peers' are in ``redisflow_celery`` and ``redisflow_rq``, whose graphs are sent by
``python -m sqlq.bench.flowmarks MODULE COUNT`` in a process of their own (a peer's app
reads the broker's URL from the environment as it is imported).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

MARKS_ENV = "SQLQ_BENCH_FLOW_MARKS"
IMPORT = "sqlq.bench.flowstep"  # what ``sqlq serve --import`` is given: sqlq's step
CHAIN, FAN = 20, 50
STEP_MS = 2

Graph = dict[str, list[str]]  # each step's key: its parents' keys, in order


def chain(n: int, length: int = CHAIN) -> Graph:
    keys = [f"g{n}.c{i}" for i in range(length)]
    return {k: ([keys[i - 1]] if i else []) for i, k in enumerate(keys)}


def fan(n: int, width: int = FAN) -> Graph:
    root, last = f"g{n}.root", f"g{n}.last"
    middle = [f"g{n}.m{i}" for i in range(width)]
    return {root: [], **{m: [root] for m in middle}, last: middle}


def graphs(count: int, length: int = CHAIN, width: int = FAN) -> list[Graph]:
    """``count`` chains and ``count`` fans, alternating."""
    out: list[Graph] = []
    for n in range(count):
        out += [chain(2 * n, length), fan(2 * n + 1, width)]
    return out


_fd: int | None = None


def mark(event: str, key: str) -> None:
    """Note that step ``key`` started (``s``) or ended (``e``), now."""
    global _fd
    if _fd is None:
        _fd = os.open(os.environ[MARKS_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, f"{event} {key} {time.time():.6f}\n".encode())


def step(key: str, ms: int) -> None:
    """The step every system runs: its marks around ``ms`` of work."""
    mark("s", key)
    time.sleep(ms / 1000)
    mark("e", key)


# A whole mark, wherever it is: a write torn by a kill (no newline) runs into the next
# writer's mark, which is still found after it.
_MARK = re.compile(rb"([se]) (g[0-9]+\.[a-z0-9]+) ([0-9]+\.[0-9]{6})\n")


def read(path: Path) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each key's start times and end times, in the order written (a torn mark skipped)."""
    starts: dict[str, list[float]] = {}
    ends: dict[str, list[float]] = {}
    if not path.exists():
        return starts, ends
    for event, key, at in _MARK.findall(path.read_bytes()):
        (starts if event == b"s" else ends).setdefault(key.decode(), []).append(float(at))
    return starts, ends


def counts(path: Path) -> tuple[int, int]:
    """How many steps have started, and how many have ended, so far."""
    starts, ends = read(path)
    return len(starts), len(ends)


def finished(path: Path, finals: Iterable[str]) -> int:
    """How many of ``finals`` have ended."""
    _, ends = read(path)
    return sum(1 for k in finals if k in ends)


def final(g: Graph) -> str:
    """A graph's last step: the one no other step follows."""
    parents = {p for ps in g.values() for p in ps}
    [last] = [k for k in g if k not in parents]
    return last


@dataclass
class Judged:
    hops_ms: list[float] = field(default_factory=list)  # a chain's parent end -> child start
    fan_in_ms: list[float] = field(default_factory=list)  # the last middle's end -> last start
    early: int = 0
    doubled: int = 0
    unexplained: int = 0  # steps started again before any kill (or with none): no rerun's
    stuck: int = 0
    steps: int = 0


def judge(every: list[Graph], path: Path, killed_at: float | None = None) -> Judged:
    """What the marks at ``path`` say of the graphs ``every`` (see the module's docstring);
    ``killed_at``: when the runner was killed (a step started again after it is a rerun
    the kill explains; before it, or with no kill, it is not)."""
    starts, ends = read(path)
    out = Judged()
    for g in every:
        out.steps += len(g)
        if final(g) not in ends:
            out.stuck += 1
        for key, parents in g.items():
            out.doubled += int(len(ends.get(key, ())) > 1)
            began = starts.get(key)
            if began and len(began) > 1 and (killed_at is None or began[1] < killed_at):
                out.unexplained += 1
            if not began or not parents:
                continue
            parent_ends = [ends[p][0] for p in parents if p in ends]
            if len(parent_ends) < len(parents) or began[0] < max(parent_ends):
                out.early += 1
                continue
            since = 1000 * (began[0] - max(parent_ends))
            if ".c" in key:  # a chain's hop (``chain``)
                out.hops_ms.append(since)
            elif key.endswith(".last"):  # a fan's last step (``fan``)
                out.fan_in_ms.append(since)
    return out


def main() -> None:
    """``python -m sqlq.bench.flowmarks MODULE COUNT``: ``COUNT`` chains and fans, sent
    through ``MODULE.submit``."""
    import importlib
    import sys

    module, count = sys.argv[1], int(sys.argv[2])
    importlib.import_module(module).submit(graphs(count))


if __name__ == "__main__":
    main()
