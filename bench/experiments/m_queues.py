"""M. Dispatch cost against the number of queues ever used: the scheduler alone, in process.

The bar: dispatch with 10,000 queues ever used costs within 2x of one queue. A
queue that was used and emptied must cost nothing from then on.

Each run builds a fresh ``Scheduler`` on a fake clock, uses ``used`` queues (one
job into each, then takes them all out again), and then, after 200 untimed
rounds, times in process CPU (``time.process_time``, the collector off) ``jobs``
rounds of one ``add`` and one ``take``: into one busy queue, or alternating
between two, each with one job waiting (so that every take has to choose between
queues). No server, no store, no HTTP: what is measured is the scheduler's own
cost per job. Within each repeat the variants run
one after another, so drift on the shared machine hits them alike; cells are
medians over the repeats.

``results/versus-before/M-before.jsonl`` is this experiment on the tree before the work
on the scheduler's queues (the same machine), which ``--with-before`` shows beside M.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlq.bench.experiments.base import Run
from sqlq.bench.experiments.rows import CodedRow
from sqlq.bench.report import Report, med
from sqlq.common.clock import FakeClock
from sqlq.common.models import Job
from sqlq.runtime.scheduler import Scheduler

NAME = "M"
GOAL_X = 2.0  # 10,000 queues ever used, against one queue
USED = (0, 1_000, 10_000)
WARM_UP = 200  # add+take rounds before the timing
NOW = 1_700_000_000.0


class MRow(CodedRow, kw_only=True):
    used: int  # queues used and emptied before the timing
    busy: int  # queues the timed jobs go to, in turn
    jobs: int
    cpu_s: float

    @property
    def us_per_job(self) -> float:
        return 1e6 * self.cpu_s / self.jobs


ROW = MRow


def _jobs(queue: str, n: int) -> list[Job]:
    return [Job.new(kind="sleep", args={}, now=NOW, queue=queue) for _ in range(n)]


async def _measure(used: int, busy: int, jobs: int) -> float:
    clock = FakeClock(NOW)
    sched = Scheduler(clock)
    for i in range(used):  # every one used once, and emptied
        sched.add(*_jobs(f"used-{i}", 1))
    for _ in range(used):
        await sched.take()
    per_queue = [_jobs(f"busy-{q}", jobs // busy + 1) for q in range(busy)]
    order = [job for turn in zip(*per_queue, strict=True) for job in turn]  # 0, 1, 0, 1 ...
    backlog, order = order[:busy], order[busy:]
    add, take = sched.add, sched.take
    for job in backlog:  # one job waits in every busy queue: with two, every take chooses
        add(job)
    for job in order[:WARM_UP]:  # the same entries again below: the code paths are warm
        add(job)
        await take()
    gc.collect()
    gc.disable()  # as timeit does: a collection in the loop would be noise, not dispatch
    try:
        t0 = time.process_time()
        for job in order:
            add(job)
            await take()
        return time.process_time() - t0
    finally:
        gc.enable()


@dataclass(frozen=True, kw_only=True)
class QueuesRun(Run):
    used: int
    busy: int
    jobs: int

    def execute(self) -> dict[str, Any]:
        cpu_s = asyncio.run(_measure(self.used, self.busy, self.jobs))
        return {"used": self.used, "busy": self.busy, "jobs": self.jobs, "cpu_s": cpu_s}


def runs(quick: bool, stores: tuple[str, ...]) -> Iterator[QueuesRun]:
    jobs = 200 if quick else 2_000
    for busy in (1, 2):
        for used in USED:
            yield QueuesRun(experiment=NAME, store="none", label=f"M/busy{busy}/used{used}",
                            used=used, busy=busy, jobs=jobs,
                            params={"used": used, "busy": busy})  # fmt: skip


def section(rep: Report) -> None:
    rows, codes = rep.before_after(NAME, MRow)
    if not rows:
        return
    rep.add(
        "## M. Dispatch against the queues ever used",
        "",
        "The scheduler alone, in process: `used` queues each get one job and are emptied "
        "again, then one `add` and one `take` per job are timed in process CPU, into one "
        "busy queue or alternating between two (each with one job waiting, so every take "
        "chooses). "
        + ("Rows `before` and `after` ran on the same machine, before and after the work on "
           "the scheduler's queues. " if "before" in codes else "This tree's run (`code` after). ")
        + "`x` is the cost over "
        "the same row's cost with no other queue ever used; medians over repeats.",
        "",
        "| code | busy queues | jobs | " + " | ".join(f"us/job, {u:,} used" for u in USED)
        + " | x at 1,000 | x at 10,000 |",
        "|---|---:|---:|" + "---:|" * (len(USED) + 2),
    )  # fmt: skip
    for code in codes:
        for busy in sorted({r.busy for r in rows}):
            cost = {
                u: med(r.us_per_job for r in rows if (r.code, r.busy, r.used) == (code, busy, u))
                for u in USED
            }
            jobs = max((r.jobs for r in rows if (r.code, r.busy) == (code, busy)), default=0)
            if not jobs:
                continue
            cells = " | ".join(f"{cost[u]:,.2f}" for u in USED)
            xs = " | ".join(f"{cost[u] / cost[0]:,.2f}" for u in USED[1:])
            rep.add(f"| {code} | {busy} | {jobs:,} | {cells} | {xs} |")
    rep.add("")
    after = [r for r in rows if r.code == codes[-1]]
    for busy in sorted({r.busy for r in after}):
        one = med(r.us_per_job for r in after if (r.busy, r.used) == (busy, 0))
        many = med(r.us_per_job for r in after if (r.busy, r.used) == (busy, USED[-1]))
        x = many / one
        rep.check(
            f"M: dispatch after {USED[-1]:,} queues used, {busy} busy, vs none",
            f"{x:.2f}x ({many:.2f} vs {one:.2f} us/job)", x <= GOAL_X, f"goal <= {GOAL_X:.0f}x",
        )  # fmt: skip
