"""N. Schedules: 1,000 schedules firing every minute, on every engine and one peer.

Each system runs alone, one after another in a repeat. **sqlq** on each engine (and on
a throwaway PostgreSQL): a fresh ``sqlq serve``, ``SCHEDULES`` no-op schedules made by
``PUT /schedules/{name}`` (``cron: "* * * * *"``), then a window of ``MINUTES`` whole
minutes from a minute boundary; its CPU is ``/stats`` ``process_cpu_s`` read just before
the first tick and just before the tick after the last. Every job is then read back
(``GET /jobs``): its schedule and tick are in its key ``sched:<name>:<tick>``, and its
lateness is ``created_at - tick``. Last, every schedule is paused and ``IDLE_S`` more
seconds give the idle cost. **procrastinate 3.10**, the peer: ``SCHEDULES`` periodic
registrations of one task in one worker process (``peers.py worker --periodic``), on
the same cluster and the same kind of window; lateness from its own tables
(``PERIODIC_SQL``), CPU from the worker's ``/proc/<pid>/stat``. Its deferrer wakes 0.5 s
after a tick by design: its lateness has that floor.

Both count lost ticks (no job a few seconds after the window) and doubled ones. On
PostgreSQL the cluster's own CPU is reported beside the system's. ``--quick``: 10
schedules, ``every_s: 1`` (the peer: a seconds field), a few seconds. A full repeat
takes about four minutes per system.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from sqlq.bench.experiments.n_runs import PEER, PeerSchedulesRun, SchedulesRun, settle
from sqlq.bench.experiments.rows import Row
from sqlq.bench.peers import PEERS, installed
from sqlq.bench.pgcluster import bindir
from sqlq.bench.report import Report, cell, med

NAME = "N"
SCHEDULES, MINUTES, IDLE_S = 1000, 2, 60.0
QUICK_SCHEDULES, QUICK_TICKS, QUICK_IDLE_S = 10, 3, 2.0


class NRow(Row, kw_only=True):
    system: str  # sqlq-memory, sqlq-walq, sqlq-sqlite, sqlq-postgres, procrastinate
    schedules: int
    period_s: int  # 60: cron "* * * * *"; 1 in a quick run
    window_s: float
    ticks: int  # (schedule, tick) pairs due in the window
    jobs: int  # of those, the pairs that have a job
    lost: int
    doubled: int  # jobs beyond the first for a pair
    late_p50_ms: float | None = None
    late_p99_ms: float | None = None
    late_max_ms: float | None = None
    cpu_s: float  # the server's (sqlq) or the worker's (peer) process CPU over the window
    pg_cpu_s: float | None = None  # the PostgreSQL cluster's processes over the window
    idle_s: float = 0.0
    idle_cpu_s: float | None = None  # every schedule paused (sqlq only)
    setup_s: float = 0.0  # making the schedules (sqlq), or the worker's start (peer)
    version: str = ""  # the peer's
    pg_version: str = ""  # the cluster's, on PostgreSQL

    @property
    def cpu_s_per_min(self) -> float:
        return 60 * self.cpu_s / self.window_s

    @property
    def cpu_ms_per_tick(self) -> float:
        return 1e3 * self.cpu_s / self.ticks if self.ticks else float("nan")

    @property
    def pg_cpu_s_per_min(self) -> float | None:
        return None if self.pg_cpu_s is None else 60 * self.pg_cpu_s / self.window_s

    @property
    def idle_cpu_s_per_min(self) -> float | None:
        idle = self.idle_cpu_s
        return None if idle is None or not self.idle_s else 60 * idle / self.idle_s


ROW = NRow


def runs(quick: bool, stores: tuple[str, ...]) -> Iterator[SchedulesRun]:
    n, period, ticks_n, idle = ((QUICK_SCHEDULES, 1, QUICK_TICKS, QUICK_IDLE_S) if quick
                                else (SCHEDULES, 60, MINUTES, IDLE_S))  # fmt: skip
    systems = [f"sqlq-{s}" for s in stores]
    if bindir() is not None:  # a PostgreSQL to run on: sqlq's engine, then the peer
        systems.append("sqlq-postgres")
        if installed(PEERS[PEER]):
            systems.append(PEER)
    for system in systems:
        kind = PeerSchedulesRun if system == PEER else SchedulesRun
        yield kind(experiment=NAME, store=system, label=f"N/{system}", system=system,
                   params={"schedules": n}, schedules=n, period_s=period, ticks_n=ticks_n,
                   idle_s=idle)  # fmt: skip


def section(rep: Report) -> None:
    rows = rep.rows(NAME, NRow)
    if not rows:
        return
    first = rows[0]
    pgs = sorted({r.pg_version for r in rows if r.pg_version})
    pg = f" (PostgreSQL {', '.join(pgs)}, a throwaway cluster, fsync on)" if pgs else ""
    every = "minute (`* * * * *`)" if first.period_s == 60 else f"{first.period_s} s"
    rep.add(
        "## N. Schedules: lateness and CPU of many schedules, against a peer",
        "",
        f"{first.schedules:,} schedules, each a no-op job every {every}, over a window of "
        f"{first.window_s / first.period_s:.0f} ticks ({first.window_s:,.0f} s) that starts on "
        "a tick; each system alone on the machine, one after another in each repeat. "
        "Lateness is a job's enqueue time minus its tick (sqlq: `created_at`; procrastinate: "
        "its `deferred` event). CPU: sqlq's server process (`/stats`), procrastinate's one "
        f"worker process (`/proc`); PostgreSQL's own processes beside them{pg}. Idle: the "
        "server's CPU with every schedule defined and paused (its own idle cost included). "
        f"Lost: a tick of the window with no job {settle(first.period_s):g} s after it; "
        "doubled: a second job for one.",
        "",
        "| system | version | lateness p50 ms | p99 ms | max ms | lost | doubled | "
        "CPU s/min | CPU ms/tick | PostgreSQL CPU s/min | idle CPU s/min |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    )  # fmt: skip
    systems = list(dict.fromkeys(r.system for r in rows))
    for system in systems:
        rs = [r for r in rows if r.system == system]
        version = rs[0].version or (rep.meta or {}).get("git_commit", "")
        cells = [cell([r.late_p50_ms for r in rs], "{:,.1f}"),
                 cell([r.late_p99_ms for r in rs], "{:,.1f}"),
                 cell([r.late_max_ms for r in rs], "{:,.1f}"), str(sum(r.lost for r in rs)),
                 str(sum(r.doubled for r in rs)), cell([r.cpu_s_per_min for r in rs], "{:.3f}"),
                 cell([r.cpu_ms_per_tick for r in rs], "{:.3f}"),
                 cell([r.pg_cpu_s_per_min for r in rs], "{:.3f}"),
                 cell([r.idle_cpu_s_per_min for r in rs], "{:.3f}")]  # fmt: skip
        rep.add(f"| {system} | {version} | " + " | ".join(cells) + " |")
    rep.add("")
    peer = [r for r in rows if r.system == PEER]
    for system in systems:
        rs = [r for r in rows if r.system == system]
        p99, per_min = med(r.late_p99_ms for r in rs), med(r.cpu_s_per_min for r in rs)
        line = (f"- {system}: lateness p99 {p99:,.1f} ms; {per_min:.3f} s of CPU a minute "
                f"({100 * per_min / 60:.2f} % of a core)")  # fmt: skip
        idle = med(r.idle_cpu_s_per_min for r in rs)
        if not math.isnan(idle):  # the schedules' own part: above the same server, paused
            line += f", {per_min - idle:.3f} s above the same server with them paused"
        if peer and system != PEER:
            line += (f"; against {PEER}'s worker: p99 "
                     f"{p99 / med(r.late_p99_ms for r in peer):.2g}x, "
                     f"CPU {per_min / med(r.cpu_s_per_min for r in peer):.2g}x")  # fmt: skip
        rep.add(line + ".")
        if system.startswith("sqlq-"):
            lost, doubled, due = (sum(r.lost for r in rs), sum(r.doubled for r in rs),
                                  sum(r.ticks for r in rs))  # fmt: skip
            rep.check(f"N: {system}, ticks lost and doubled", f"{lost} lost, {doubled} doubled "
                      f"of {due:,} due", lost == doubled == 0, "none")  # fmt: skip
    rep.add("")
