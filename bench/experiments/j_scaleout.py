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

import asyncio
import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from sqlq.bench.client.http import HttpPool
from sqlq.bench.client.server import ServerProcess
from sqlq.bench.experiments.rows import Row
from sqlq.bench.peers import NOT_INSTALLABLE, PEERS, installed
from sqlq.bench.pgcluster import Cluster, make_cluster
from sqlq.bench.report import Report, med

NAME = "J"
WORKERS = 64  # per sqlq node, and the procrastinate workers' concurrency
BATCH = 1000  # jobs per POST /jobs/batch, as the peers enqueue 1,000 per call
RESCUE_CAP_S = 90.0
RESCUE_JOB_S = 5.0  # long enough that the second worker is up before the first is killed
RESCUE_JOBS = 4
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

_CLUSTER: list[Cluster] = []


def cluster() -> Cluster:
    """One throwaway PostgreSQL for the whole experiment, removed at exit."""
    if not _CLUSTER:
        c = make_cluster()
        _CLUSTER.append(c)

        def remove() -> None:
            try:
                c.stop()
            finally:
                c.remove()

        atexit.register(remove)
    return _CLUSTER[0]


async def _sql(dsn: str, query: str) -> Any:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval(query)
    finally:
        await conn.close()


async def _wait(pred: Any, cap: float, step: float = 0.02) -> float | None:
    """Seconds until ``await pred()`` holds, or None past ``cap``."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < cap:
        if await pred():
            return time.perf_counter() - t0
        await asyncio.sleep(step)
    return None


def _nodes(system: str, n: int, workdir: Path) -> tuple[list[ServerProcess], str | None]:
    if system == "sqlq-postgres":
        dsn = cluster().create_database()
        flags = ("--store", "postgres", "--dsn", dsn, "--workers", str(WORKERS),
                 "--log-level", "warning", "--grace", "0", "--fault-injection")  # fmt: skip
        return [ServerProcess(*flags, log_path=workdir / f"node{i}.log") for i in range(n)], dsn
    store = system.removeprefix("sqlq-")
    return [ServerProcess.engine(store=store, workers=WORKERS)], None


@dataclass(frozen=True, kw_only=True)
class JRun:
    """What J's runs share: the system measured stands where other experiments' store does."""

    system: str
    experiment: str = NAME
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def store(self) -> str:
        return self.system


@dataclass(frozen=True, kw_only=True)
class SqlqRun(JRun):
    """sqlq: hold the queue, batch-submit over HTTP to every node, let go, time the drain."""

    nodes: int
    workload: str
    jobs: int

    @property
    def label(self) -> str:
        return f"J/{self.system}/{self.nodes}n/{self.workload}"

    def execute(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="sqlq-j-") as d:
            nodes, _ = _nodes(self.system, self.nodes, Path(d))
            for n in nodes:
                n.spawn()
            try:
                for n in nodes:
                    n.wait_ready()
                return asyncio.run(self._measure([n.url for n in nodes]))
            finally:
                for n in nodes:
                    n.cleanup()  # SIGTERM, and the data directory it made

    async def _measure(self, urls: list[str]) -> dict[str, Any]:
        work_ms = 20 if self.workload == "20ms" else 0
        body = json.dumps({"jobs": [{"kind": "sleep", "args": {"work_ms": work_ms}}] * BATCH})
        pools = [await HttpPool(u, 4).__aenter__() for u in urls]
        try:
            await pools[0].request("POST", "/queues/default/pause")
            cpu0 = await self._cpu(pools)
            batches = self.jobs // BATCH
            left = list(range(batches))

            async def client(i: int) -> None:
                pool = pools[i % len(pools)]
                while left:
                    left.pop()
                    status, _ = await pool.request("POST", "/jobs/batch", body.encode())
                    assert status == 201, status

            t0 = time.perf_counter()
            await asyncio.gather(*(client(i) for i in range(4 * len(pools))))
            enqueue_s = time.perf_counter() - t0
            await pools[0].request("POST", "/queues/default/resume")
            t1 = time.perf_counter()

            async def done() -> bool:
                total = 0
                for p in pools:
                    _, stats = await p.json("GET", "/stats")
                    total += stats["jobs"]["completed"]
                return total >= batches * BATCH

            drained = await _wait(done, 300, 0.01)
            drain_s = drained if drained is not None else time.perf_counter() - t1
            cpu = await self._cpu(pools) - cpu0
        finally:
            for p in pools:
                await p.__aexit__(None, None, None)
        return {"system": self.system, "phase": "throughput", "nodes": self.nodes,
                "workload": self.workload, "jobs": batches * BATCH, "enqueue_s": enqueue_s,
                "drain_s": drain_s, "cpu_s": cpu}  # fmt: skip

    @staticmethod
    async def _cpu(pools: list[HttpPool]) -> float:
        total = 0.0
        for p in pools:
            _, stats = await p.json("GET", "/stats")
            total += stats["process_cpu_s"]
        return total


def _peer(peer: str, action: str, dsn: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sqlq.bench.peers", peer, action, "--dsn", dsn, *extra]


def _peer_env() -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": root}


@dataclass(frozen=True, kw_only=True)
class PeerRun(JRun):
    """A peer: its batch enqueue, then two of its worker processes drain the queue."""

    jobs: int
    phase: str = "throughput"

    @property
    def label(self) -> str:
        return f"J/{self.system}/{self.phase}"

    def execute(self) -> dict[str, Any]:
        peer = PEERS[self.system]
        dsn = cluster().create_database()
        env = _peer_env()
        subprocess.run(_peer(peer.name, "install", dsn), check=True, env=env,
                       capture_output=True)  # fmt: skip
        sleep = RESCUE_JOB_S if self.phase == "rescue" else 0.0
        jobs = RESCUE_JOBS if self.phase == "rescue" else self.jobs
        out = subprocess.run(_peer(peer.name, "enqueue", dsn, "--jobs", str(jobs), "--sleep",
                                   str(sleep)), check=True, env=env, capture_output=True,
                             text=True)  # fmt: skip
        enqueue_s = float(out.stdout.strip().splitlines()[-1])
        worker = _peer(peer.name, "worker", dsn, "--concurrency", str(WORKERS), *peer.options)
        row: dict[str, Any] = {"system": self.system, "phase": self.phase, "nodes": 2,
                               "workload": "noop", "jobs": jobs, "enqueue_s": enqueue_s,
                               "version": installed(peer) or ""}  # fmt: skip
        logs = tempfile.TemporaryFile()
        procs = [subprocess.Popen(worker, env=env, stdout=logs, stderr=logs)]
        try:
            if self.phase == "throughput":
                procs.append(subprocess.Popen(worker, env=env, stdout=logs, stderr=logs))
                t0 = time.perf_counter()

                async def done() -> bool:
                    return int(await _sql(dsn, peer.pending_sql)) == 0

                drained = asyncio.run(_wait(done, 600, 0.02))
                row["drain_s"] = drained if drained is not None else time.perf_counter() - t0
            else:

                def second() -> None:
                    procs.append(subprocess.Popen(worker, env=env, stdout=logs, stderr=logs))
                    time.sleep(2.0)  # its start, before the first dies

                row["rescue_s"] = asyncio.run(_rescue(dsn, peer.held_sql, peer.pending_sql,
                                                      second, procs[0].kill))  # fmt: skip
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    try:
                        p.wait(10)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
            logs.close()
        return row


async def _rescue(dsn: str, held_sql: str, pending_sql: str, second: Callable[[], object],
                  kill: Callable[[], None]) -> float | None:  # fmt: skip
    """The first worker alone takes every job; then a ``second`` starts, the first is killed,
    and the clock runs until every job is finished, less the job's own run."""

    async def holding() -> bool:
        return int(await _sql(dsn, held_sql)) == RESCUE_JOBS

    if await _wait(holding, 30) is None:
        return None
    second()
    kill()
    killed = time.perf_counter()

    async def finished() -> bool:
        return int(await _sql(dsn, pending_sql)) == 0

    if await _wait(finished, RESCUE_CAP_S, 0.05) is None:
        return None
    return max(0.0, time.perf_counter() - killed - RESCUE_JOB_S)


@dataclass(frozen=True, kw_only=True)
class SqlqRescueRun(JRun):
    """Two sqlq nodes; one is killed holding every job; until the other has finished them."""

    system: str = "sqlq-postgres"

    @property
    def label(self) -> str:
        return "J/sqlq-postgres/rescue"

    def execute(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="sqlq-j-") as d:
            nodes, dsn = _nodes(self.system, 2, Path(d))
            assert dsn is not None
            nodes[0].start()  # alone, so it claims every job
            try:
                rescue = asyncio.run(self._measure(nodes, dsn))
            finally:
                for n in nodes:
                    n.cleanup()  # SIGTERM, and the data directory it made
        return {"system": self.system, "phase": "rescue", "nodes": 2, "jobs": RESCUE_JOBS,
                "rescue_s": rescue}  # fmt: skip

    async def _measure(self, nodes: list[ServerProcess], dsn: str) -> float | None:
        body = json.dumps({"kind": "sleep", "args": {"work_ms": int(RESCUE_JOB_S * 1000)}})
        async with HttpPool(nodes[0].url, 1) as pool:
            _, stats = await pool.json("GET", "/stats")
            victim = stats["shared"]["node"]
            for _ in range(RESCUE_JOBS):
                await pool.request("POST", "/jobs", body.encode())

        held = f"SELECT count(*) FROM jobs WHERE state = 'running' AND node = '{victim}'"
        pending = "SELECT count(*) FROM jobs WHERE state <> 'completed'"
        return await _rescue(dsn, held, pending, nodes[1].start, nodes[0].kill)


def runs(quick: bool, stores: tuple[str, ...]) -> Iterator[Any]:
    noop = 2000 if quick else 20000
    slow = 1000 if quick else 8000
    for workload, jobs in (("noop", noop), ("20ms", slow)):
        for nodes in (1, 2, 3):
            yield SqlqRun(system="sqlq-postgres", nodes=nodes, workload=workload, jobs=jobs)
        for store in ("walq", "sqlite"):
            yield SqlqRun(system=f"sqlq-{store}", nodes=1, workload=workload, jobs=jobs)
    peers = [p for p in PEERS.values() if installed(p)]
    for peer in peers:
        yield PeerRun(system=peer.name, jobs=noop)
    if not quick:
        yield SqlqRescueRun()
        for peer in peers:
            if peer.name != "pgqueuer-b100":  # the batch size does not change the rescue
                yield PeerRun(system=peer.name, jobs=4, phase="rescue")


SYSTEMS = ("sqlq-postgres", "sqlq-walq", "sqlq-sqlite", "pgqueuer", "pgqueuer-b100",
           "procrastinate")  # fmt: skip


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
