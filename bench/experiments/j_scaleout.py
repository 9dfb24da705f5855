"""J. Scale-out: sqlq nodes on one PostgreSQL, beside the single-node engines and the peers.

Every system does the same two phases on the same throwaway PostgreSQL 15
cluster (fsync on), in the same run:

1. **enqueue**: the queue is held (sqlq: the queue paused; peers: no worker
   running) and N jobs go in through the system's batch API (sqlq: ``POST
   /jobs/batch``, 1,000 per request, 4 clients per node, over HTTP; the peers:
   their library's batch enqueue, 1,000 per call, in process);
2. **dequeue + run + ack**: the queue is let go (sqlq: resumed; peers: their
   worker processes start) and the clock runs until every job is finished.

sqlq runs on 1, 2 and 3 nodes; walq and sqlite on their one node; the peers
with two worker processes, as in the figures the issue quotes. A third
measurement, **rescue**: two workers (nodes) hold 1 s jobs, one is killed with
SIGKILL, and the clock runs from the kill until every job it held has finished
elsewhere, minus the job's own second; capped at ``RESCUE_CAP_S``.

For sqlq, server CPU per job (all nodes, all threads, both phases) is
reported too. The peers run without HTTP, so the enqueue comparison is
sqlq-over-HTTP against a library call.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlq.bench.experiments.j_runs import (
    BATCH,
    RESCUE_CAP_S,
    RESCUE_JOB_S,
    RESCUE_JOBS,
    WORKERS,
    PeerRun,
    SqlqRescueRun,
    SqlqRun,
)
from sqlq.bench.experiments.j_runs import NAME as NAME
from sqlq.bench.experiments.rows import Row
from sqlq.bench.peers import NOT_INSTALLABLE, PEERS, installed
from sqlq.bench.report import Report, med
from sqlq.engines.registry import DURABLE

GOAL_X_PGQUEUER = 2.0  # 2 nodes' dequeue + run + ack, x PgQueuer's default, same run
RESCUE_GOAL_S = 10.0


class JRow(Row, kw_only=True):
    system: str  # sqlq-postgres, sqlq-walq, sqlq-sqlite, pgqueuer, pgqueuer-b100, procrastinate
    phase: str  # "throughput" or "rescue"
    nodes: int = 1
    workload: str = "noop"
    jobs: int = 0
    enqueue_s: float = 0.0
    drain_s: float = 0.0
    cpu_s: float = 0.0  # sqlq only: the nodes' process CPU, all threads
    rescue_s: float | None = None  # None: not rescued within the cap
    version: str = ""

    @property
    def enqueue_rate(self) -> float:
        return self.jobs / self.enqueue_s if self.enqueue_s else 0.0

    @property
    def drain_rate(self) -> float:
        return self.jobs / self.drain_s if self.drain_s else 0.0


ROW = JRow


def runs(quick: bool, stores: tuple[str, ...]) -> Iterator[Any]:
    noop = 2000 if quick else 20000
    slow = 1000 if quick else 8000
    for workload, jobs in (("noop", noop), ("20ms", slow)):
        for nodes in (1, 2, 3):
            yield SqlqRun(system="sqlq-postgres", nodes=nodes, workload=workload, jobs=jobs)
        for store in DURABLE:
            yield SqlqRun(system=f"sqlq-{store}", nodes=1, workload=workload, jobs=jobs)
    peers = [p for p in PEERS.values() if installed(p)]
    for peer in peers:
        yield PeerRun(system=peer.name, jobs=noop)
    if not quick:
        yield SqlqRescueRun()
        for peer in peers:
            if peer.name != "pgqueuer-b100":  # the batch size does not change the rescue
                yield PeerRun(system=peer.name, jobs=4, phase="rescue")


SYSTEMS = ("sqlq-postgres", *(f"sqlq-{store}" for store in DURABLE), "pgqueuer",
           "pgqueuer-b100", "procrastinate")  # fmt: skip


def _rate(values: list[float]) -> str:
    return f"{med(values):,.0f}" if values else "-"


def section(rep: Report) -> None:
    rows = rep.rows(NAME, JRow)
    if not rows:
        return
    repeats = max(r.repeat for r in rows) + 1
    missing = "; ".join(f"{k}: {v}" for k, v in NOT_INSTALLABLE.items())
    rep.add(
        "## J. Scale-out: nodes on one PostgreSQL, beside the peers",
        "",
        f"One throwaway PostgreSQL 15 (fsync on, `synchronous_commit` on) for every system, "
        f"in the same run; medians of {repeats} repeats. `enqueue`: the queue held, N jobs "
        f"in through the system's batch API (sqlq: `POST /jobs/batch` of {BATCH:,} over "
        "HTTP, 4 clients per node; the peers: their library's batch enqueue, in process). "
        "`drain`: the queue let go, until every job is finished (dequeue + run + ack). sqlq "
        f"nodes run {WORKERS} workers each; the peers run two worker processes "
        f"(procrastinate with concurrency {WORKERS}, PgQueuer with its default or "
        "`batch_size=100`). `CPU us/job`: all sqlq nodes' process CPU, both phases. "
        f"{missing}.",
        "",
        "| system | nodes | workload | jobs | enqueue jobs/s | drain jobs/s | CPU us/job |",
        "|---|---:|---|---:|---:|---:|---:|",
    )  # fmt: skip
    tput = [r for r in rows if r.phase == "throughput"]
    keys = sorted({(r.system, r.nodes, r.workload) for r in tput},
                  key=lambda k: (k[2] != "noop", SYSTEMS.index(k[0]), k[1]))  # fmt: skip
    drain: dict[tuple[str, int, str], float] = {}
    enqueue: dict[tuple[str, int, str], float] = {}
    for key in keys:
        rs = [r for r in tput if (r.system, r.nodes, r.workload) == key]
        drain[key] = med(r.drain_rate for r in rs)
        enqueue[key] = med(r.enqueue_rate for r in rs)
        cpu = (f"{med(1e6 * r.cpu_s / r.jobs for r in rs):.0f}"
               if key[0].startswith("sqlq") else "-")  # fmt: skip
        version = f" {rs[0].version}" if rs[0].version else ""
        rep.add(
            f"| {key[0]}{version} | {key[1]} | {key[2]} | {rs[0].jobs:,} | "
            f"{_rate([r.enqueue_rate for r in rs])} | {_rate([r.drain_rate for r in rs])} | "
            f"{cpu} |"
        )
    lines = []
    for wl in ("noop", "20ms"):
        one = drain.get(("sqlq-postgres", 1, wl))
        if one:
            more = [f"{n} nodes {drain[('sqlq-postgres', n, wl)] / one:.2f}x"
                    for n in (2, 3) if ("sqlq-postgres", n, wl) in drain]  # fmt: skip
            lines.append(f"{wl}: {', '.join(more)} one node's drain rate")
    if lines:
        rep.add(
            "",
            "Scale-out, from the table: " + "; ".join(lines) + ". All nodes and the "
            "database share this machine's cores, so no-op jobs stop scaling once those "
            "are busy; 20 ms jobs are bound by the workers, and scale with the nodes.",
        )
    rescue = [r for r in rows if r.phase == "rescue"]
    if rescue:
        rep.add(
            "",
            f"Rescue: one worker (node) takes {RESCUE_JOBS} jobs of {RESCUE_JOB_S:.0f} s; a "
            "second starts; the first is killed with SIGKILL; seconds from the kill until every "
            f"job has finished on the second, minus the job's own {RESCUE_JOB_S:.0f} s "
            f"(`never` past {RESCUE_CAP_S:.0f} s).",
            "",
            "| system | rescue s (median) | each run |",
            "|---|---:|---|",
        )
        for system in SYSTEMS:
            rs = [r for r in rescue if r.system == system]
            if not rs:
                continue
            got = [r.rescue_s for r in rs if r.rescue_s is not None]
            runs_ = ", ".join("never" if r.rescue_s is None else f"{r.rescue_s:.1f}" for r in rs)
            middle = f"{med(got):.1f}" if len(got) * 2 > len(rs) else "never"
            rep.add(f"| {system} | {middle} | {runs_} |")
    two = drain.get(("sqlq-postgres", 2, "noop"))
    pgq = drain.get(("pgqueuer", 2, "noop"))
    if two and pgq:
        rep.check(
            "J: 2 sqlq nodes' dequeue + run + ack, x PgQueuer's default (same run)",
            f"{two / pgq:.2f}x ({two:,.0f} vs {pgq:,.0f} jobs/s)",
            two / pgq >= GOAL_X_PGQUEUER,
            f"goal >= {GOAL_X_PGQUEUER}x",
        )
    ours_in = {k[1]: v for k, v in enqueue.items() if k[0] == "sqlq-postgres" and k[2] == "noop"}
    pgq_in = enqueue.get(("pgqueuer", 2, "noop"))
    if ours_in and pgq_in:
        n_best = max(ours_in, key=lambda n: ours_in[n])
        rep.check(
            "J: sqlq batch submission over HTTP vs PgQueuer's library batch enqueue",
            f"{ours_in[n_best]:,.0f} jobs/s with {n_best} node(s) "
            f"({ours_in.get(1, 0):,.0f} with one) vs {pgq_in:,.0f}",
            ours_in[n_best] >= pgq_in,
            "goal: at least PgQueuer's",
        )
    ours = [r.rescue_s for r in rescue if r.system == "sqlq-postgres"]
    if ours:
        worst = max((x for x in ours if x is not None), default=None)
        rep.check(
            "J: a killed node's jobs run again",
            "never" if worst is None or None in ours else f"within {worst:.1f} s (worst run)",
            worst is not None and None not in ours and worst <= RESCUE_GOAL_S,
            f"goal <= {RESCUE_GOAL_S:.0f} s",
        )
