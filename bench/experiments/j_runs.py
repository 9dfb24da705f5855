"""J's runs: sqlq nodes and the peers on one throwaway PostgreSQL, the same two phases
each (enqueue with the queue held, then dequeue + run + ack), and the rescue of a killed
worker's jobs. ``j_scaleout`` holds the experiment's rows, order and report section."""

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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from sqlq.bench.client.http import HttpPool
from sqlq.bench.client.server import FAST_RETRY_FLAGS, ServerProcess
from sqlq.bench.peers import PEERS, installed
from sqlq.bench.pgcluster import Cluster, make_cluster

NAME = "J"
WORKERS = 64  # per sqlq node, and the procrastinate workers' concurrency
BATCH = 1000  # jobs per POST /jobs/batch, as the peers enqueue 1,000 per call
RESCUE_CAP_S = 90.0
RESCUE_JOB_S = 5.0  # long enough that the second worker is up before the first is killed
RESCUE_JOBS = 4

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
                 "--log-level", "warning", "--grace", "0", "--fault-injection",
                 *FAST_RETRY_FLAGS)  # fmt: skip
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
