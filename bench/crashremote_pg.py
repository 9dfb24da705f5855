"""``sqlq crashcheck --remote-workers --store postgres``: two nodes on one database, remote
workers that talk to either, a node and a worker killed -9.

Each trial: a fresh database in a throwaway PostgreSQL 15 cluster (fsync on); two ``sqlq
serve --store postgres --workers 0`` nodes; the remote workers of
``sqlq.bench.crashfleet`` given both nodes (each call goes to one at random, so a token
one node issued is renewed and reported at the other; a node that fails a call is
avoided a while); clients submitting the remote mixed workload to both, some jobs
stalling on their first attempt. At a random moment one node is killed -9 and started
again on its port, and a worker holding jobs is killed -9 and replaced. Then drain (in
plain SQL), stop, and the verdict of ``sqlq.bench.crashjudge`` from the rows read in plain
SQL (``offline_pg.read_pg``), the ledger and the workers' files; a claim takes an
epoch here, so two epochs per attempt.
"""

from __future__ import annotations

import asyncio
import random
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlq.bench.client.server import FAST_RETRY_FLAGS, ServerError, ServerProcess
from sqlq.bench.crashcheck import READY_WITHIN_S, keep
from sqlq.bench.crashfleet import CANCEL_GRACE_S, LEASE_S, WORKERS, Fleet, holders, same_port
from sqlq.bench.crashjudge import Death, Verdict
from sqlq.bench.crashload import QUEUES, Ledger, remote_spec
from sqlq.bench.crashload_pg import CLIENTS, Targets, start_all, stop_all, submit
from sqlq.bench.crashrecords import read_records
from sqlq.bench.offline_pg import read_pg, sql
from sqlq.bench.pgcluster import Cluster, make_cluster

NODES = 2


def pg_node(dsn: str, workdir: Path, n: int, ready_within: float = 60) -> ServerProcess:
    args = (
        "--store", "postgres", "--dsn", dsn, "--workers", "0", "--log-level", "warning",
        "--grace", "0", "--cancel-grace", str(CANCEL_GRACE_S), *FAST_RETRY_FLAGS,
    )  # fmt: skip
    return ServerProcess(*args, log_path=workdir / f"node{n}.log", ready_within=ready_within)


async def run_remote_pg_trial(cluster: Cluster, jobs: int, kill_after_s: float, seed: int,
                              workdir: Path) -> dict[str, Any]:  # fmt: skip
    rng = random.Random(seed)
    dsn = await asyncio.to_thread(cluster.create_database)
    nodes = [pg_node(dsn, workdir, i) for i in range(NODES)]
    started = list(nodes)
    fleet = Fleet([n.url for n in nodes], workdir, LEASE_S, seed)
    ledger = Ledger(workdir / "ledger.txt")
    problems: list[str] = []
    try:
        await start_all(nodes)
        for _ in range(WORKERS):
            fleet.spawn()
        await asyncio.to_thread(fleet.wait_ready)
        targets = Targets()
        for n in nodes:
            await targets.add(n.url)
        stop = asyncio.Event()
        load = asyncio.create_task(submit(
            targets, jobs, stop, ledger, "mixed", rng, spec=lambda r: remote_spec(r, 0.1),
            force=0.3,
        ))  # fmt: skip
        try:
            await asyncio.sleep(kill_after_s)
            victim = rng.randrange(NODES)
            other = targets.pools[1 - victim] if len(targets.pools) == NODES else None
            if other is not None:
                held = [w for w in await holders(other) if w in fleet.procs]
                fleet.kill(rng.choice(held or list(fleet.procs)))
                fleet.spawn()
            old = nodes[victim]
            old.kill()
            fleet.deaths.append(Death("server", old.url, time.time()))
            again = same_port(pg_node(dsn, workdir, NODES + victim, READY_WITHIN_S), old)
            started.append(again)
            try:
                await asyncio.to_thread(again.start)
            except ServerError as exc:
                problems.append(f"the killed node's restart failed: {str(exc)[:300]}")
                again = same_port(pg_node(dsn, workdir, 2 * NODES + victim), old)
                started.append(again)
                await asyncio.to_thread(again.start)
            nodes[victim] = again
            await targets.add(again.url)
            stop.set()
            await load
            pool = targets.pools[-1]
            for q in QUEUES:
                await pool.json("POST", f"/queues/{q}/resume")
        finally:
            await targets.close()
        deadline = time.monotonic() + 120
        while True:
            rows = await sql(dsn, "SELECT count(*) FROM jobs WHERE state IN "
                              "('scheduled', 'running')")  # fmt: skip
            if rows[0][0] == 0:
                break
            if time.monotonic() > deadline:
                problems.append("not drained within 120 s")
                break
            await asyncio.sleep(0.05)
    finally:
        await asyncio.to_thread(fleet.stop)
        await stop_all(started, signal.SIGTERM)
    jobs_seen = await read_pg(dsn)
    ledger.read_saved()
    verdict = Verdict(jobs_seen, ledger, read_records(fleet.records), fleet.deaths,
                      clients=CLIENTS, epochs_per_attempt=2)  # fmt: skip
    row = verdict.row()
    problems += fleet.problems + verdict.problems
    return {
        "store": "postgres",
        "sync": "full",
        "mode": "nodes",
        "workload": "remote",
        "nodes": NODES,
        "kill_after_s": round(kill_after_s, 3),
        "lease_s": LEASE_S,
        **row,
        "problems": problems,
        "ok": not problems,
    }


def run_remote_pg_trials(*, trials: int, jobs: int, seed: int, out: Path | None,
                         progress: bool = True) -> list[dict[str, Any]]:  # fmt: skip
    """``trials`` trials on one throwaway cluster; rows to ``crash-remote-postgres-nodes.jsonl``."""
    from tqdm import tqdm

    from sqlq.bench import meta

    rng = random.Random(seed)
    commit = meta.git_commit()
    path = None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        path = out / "crash-remote-postgres-nodes.jsonl"
        path.write_text("")
    cluster = make_cluster()
    rows: list[dict[str, Any]] = []
    try:
        for n in tqdm(range(trials), desc="crashcheck remote postgres", disable=not progress):
            with tempfile.TemporaryDirectory(prefix="sqlq-crashremote-pg-") as d:
                run = run_remote_pg_trial(cluster, jobs, rng.uniform(0.5, 2.0),
                                          rng.randrange(1 << 30), Path(d))  # fmt: skip
                keep(rows, asyncio.run(run), n, commit, path)
    finally:
        cluster.end()
    return rows
