"""``sqlq crashcheck``: kill -9 the server at random moments; prove nothing acked is lost.

Each trial: a fresh data directory; ``sqlq serve`` as a subprocess; several
clients submit jobs and append every acknowledged id to a client-side ledger
(fsynced); SIGKILL at a random moment (for walq, some trials run with a tiny
compaction floor so the kill often lands inside a compaction); restart on the
same data; wait for the queue to drain; stop. Then the data is verified
**without the engine's code** (``bench.offline``): walq's log by a minimal
parser (framing, CRC-32, sequence numbers, fold), SQLite's file with the stdlib
``sqlite3`` module and plain SQL.

A trial fails if an acknowledged id is missing or not finished, if the store
holds more unacknowledged jobs than could have been in flight at the kill
(one per client), or if a job's epoch history is inconsistent.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import uvloop

from bench.client.http import HTTPError, HttpPool
from bench.client.loadgen import wait_drained
from bench.client.server import ServerProcess
from bench.offline import TERMINAL, VerifyError, read_sqlite, read_walq


@dataclass(frozen=True)
class Trial:
    store: str
    sync: str
    jobs: int
    clients: int
    kill_after_s: float
    compact_floor_mb: float | None


async def _load(url: str, trial: Trial, ledger: Path, stop: asyncio.Event) -> int:
    """Submit until stopped; every acked id goes to the ledger, fsynced in groups."""
    acked: list[str] = []
    written = 0
    body = msgspec.json.encode({"kind": "sleep", "args": {"work_ms": 2}})
    fd = os.open(ledger, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    loop = asyncio.get_running_loop()

    def append(data: bytes) -> None:
        os.write(fd, data)
        os.fsync(fd)

    async def flush() -> None:
        nonlocal written
        chunk = acked[written:]
        if chunk:
            await loop.run_in_executor(None, append, "".join(i + "\n" for i in chunk).encode())
            written += len(chunk)

    try:
        async with HttpPool(url, trial.clients) as pool:

            async def client() -> None:
                while not stop.is_set() and len(acked) < trial.jobs:
                    try:
                        status, reply = await pool.json("POST", "/jobs", body)
                    except (HTTPError, OSError):
                        return
                    if status == 201:
                        acked.append(reply["id"])

            async def ledger_writer() -> None:
                while not stop.is_set():
                    await flush()
                    await asyncio.sleep(0.01)

            writer = asyncio.create_task(ledger_writer())
            await asyncio.gather(*(client() for _ in range(trial.clients)))
            stop.set()
            await writer
            await flush()
    finally:
        os.close(fd)
    return len(acked)


def run_trial(trial: Trial, workdir: Path) -> dict[str, Any]:
    data = workdir / "data"
    ledger = workdir / "ledger.txt"
    flags: tuple[str, ...] = ("--workers", "16")
    if trial.compact_floor_mb is not None:
        # Compact often without pruning anything, so an absent job can only be a lost one.
        flags += ("--compact-floor-mb", str(trial.compact_floor_mb), "--compact-ratio", "1.5")
    srv = ServerProcess.engine(store=trial.store, data_dir=str(data), sync=trial.sync, flags=flags)
    os.makedirs(data, exist_ok=True)
    srv.start()

    async def first_life() -> None:
        stop = asyncio.Event()

        def kill() -> None:
            srv.kill()
            stop.set()

        asyncio.get_running_loop().call_later(trial.kill_after_s, kill)
        await _load(srv.url, trial, ledger, stop)
        srv.kill()  # if the load finished before the timer

    uvloop.run(first_life())
    srv.stop()
    acked = [i for i in ledger.read_text().splitlines() if i] if ledger.exists() else []

    again = ServerProcess.engine(
        store=trial.store, data_dir=str(data), sync=trial.sync, flags=flags
    )
    t0 = time.perf_counter()
    again.start()
    ready_s = time.perf_counter() - t0

    async def drain() -> dict[str, Any]:
        async with HttpPool(again.url, 1) as pool:
            return await wait_drained(pool)

    recovery = uvloop.run(drain())
    again.stop(signal.SIGTERM)  # graceful: the last completions are flushed
    return verify(trial, data, acked, ready_s, recovery)


def verify(
    trial: Trial, data: Path, acked: list[str], ready_s: float, recovery: dict[str, Any]
) -> dict[str, Any]:
    problems: list[str] = []
    try:
        if trial.store == "walq":
            jobs = read_walq(data / "walq" / "walq.log")
        else:
            jobs = read_sqlite(data / "sqlite" / "sqlq.db")
    except (VerifyError, sqlite3.Error, ValueError, KeyError) as exc:
        jobs = {}
        problems.append(f"unreadable store: {exc}")
    ack_set = set(acked)
    lost = [i for i in acked if i not in jobs]
    unfinished = [i for i in acked if i in jobs and jobs[i].state not in TERMINAL]
    unknown = [i for i in jobs if i not in ack_set]
    reruns = sum(1 for i in acked if i in jobs and jobs[i].attempts > 1)
    if lost:
        problems.append(f"{len(lost)} acknowledged jobs missing")
    if unfinished:
        problems.append(f"{len(unfinished)} acknowledged jobs not finished")
    if len(unknown) > trial.clients:
        problems.append(
            f"{len(unknown)} jobs never acknowledged (at most {trial.clients} in flight)"
        )
    return {
        "store": trial.store,
        "sync": trial.sync,
        "kill_after_s": round(trial.kill_after_s, 3),
        "compaction_trial": trial.compact_floor_mb is not None,
        "acknowledged": len(acked),
        "lost": len(lost) + len(unfinished),
        "unknown": len(unknown),
        "reruns": reruns,
        "restart_to_ready_s": round(ready_s, 4),
        "recovery": recovery,
        "problems": problems,
        "ok": not problems,
    }


def run_trials(
    *, store: str, sync: str, trials: int, jobs: int, seed: int, out: Path | None,
    progress: bool = True,
) -> list[dict[str, Any]]:  # fmt: skip
    """Run ``trials`` kill -9 trials; returns one row per trial.

    With ``out``, the rows go to ``crash-<store>-<sync>.jsonl`` as they come (a
    long run that is stopped keeps its trials), replacing any earlier run's file,
    so the report never sums two runs of different code.
    """
    from tqdm import tqdm

    from bench import meta

    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    commit = meta.git_commit()
    path = None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"crash-{store}-{sync}.jsonl"
        path.write_text("")
    for n in tqdm(range(trials), desc=f"crashcheck {store}", disable=not progress):
        trial = Trial(
            store=store,
            sync=sync,
            jobs=jobs,
            clients=8,
            kill_after_s=rng.uniform(0.05, 1.5),
            compact_floor_mb=0.05 if store == "walq" and n % 3 == 0 else None,
        )
        with tempfile.TemporaryDirectory(prefix="sqlq-crashcheck-") as d:
            row = run_trial(trial, Path(d))
        keep(rows, row, n, commit, path)
    return rows


def keep(rows: list[dict[str, Any]], row: dict[str, Any], n: int, commit: str,
         path: Path | None) -> None:  # fmt: skip
    """One trial's row: numbered, stamped with the commit, and appended to the run's file
    as it comes (a long run that is stopped keeps its trials)."""
    row["trial"] = n
    row["git_commit"] = commit
    rows.append(row)
    if path is not None:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")


def write_report(out: Path) -> str:
    """results/crash.md from every crash-*.jsonl beside it."""
    from bench import meta

    info = meta.collect(str(out))
    lines = [
        "# Crash-recovery verification (`sqlq crashcheck`)",
        "",
        "Each trial: fresh data directory; `sqlq serve` subprocess with 16 workers; 8 clients "
        "submit 2 ms jobs and fsync every acknowledged id to a ledger; SIGKILL at a random "
        "moment (uniform 0.05-1.5 s); restart on the same data; drain; stop; then the files "
        "are verified WITHOUT the engine's code (walq: a minimal parser checking framing, "
        "CRC-32, sequence numbers and every transition's epoch fence; sqlite: stdlib sqlite3, "
        "plain SQL). For walq every third trial compacts continuously (tiny floor, ratio "
        "1.5), so kills land inside compactions. Produced by `sqlq crashcheck`; do not edit.",
        "",
        f"- machine: {info['cpu']}, {info['cores']} cores; disk {info['disk']}; "
        f"Python {info['python']}",
        "",
        "| store | sync | trials | acknowledged (total) | lost | unknown (max per trial) | "
        "reruns (total) | rerun rate | restart to ready p50 s | failed trials | git commit |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    shared: list[dict[str, Any]] = []
    for path in sorted(out.glob("crash-*.jsonl")):
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        if not rows:
            continue
        if rows[0]["store"] == "postgres":
            shared = rows
            continue
        acked = sum(r["acknowledged"] for r in rows)
        reruns = sum(r["reruns"] for r in rows)
        ready = sorted(r["restart_to_ready_s"] for r in rows)
        lines.append(
            f"| {rows[0]['store']} | {rows[0]['sync']} | {len(rows)} | {acked:,} | "
            f"{sum(r['lost'] for r in rows)} | {max(r['unknown'] for r in rows)} | {reruns:,} | "
            f"{100 * reruns / acked if acked else 0:.2f}% | {ready[len(ready) // 2]:.3f} | "
            f"{sum(1 for r in rows if not r['ok'])} | "
            f"{', '.join(sorted({r.get('git_commit', '?') for r in rows}))} |"
        )
    lines += [
        "",
        "`unknown`: jobs in the store that no client saw acknowledged: submissions in flight "
        "at the kill that became durable before their reply was sent (at most one per client). "
        "`reruns`: acknowledged jobs that ran more than once, because their completion was "
        "not yet durable at the kill (at-least-once delivery).",
        "",
    ]
    if shared:
        lines += _shared_section(shared)
    text = "\n".join(lines)
    (out / "crash.md").write_text(text)
    return text


def _shared_section(rows: list[dict[str, Any]]) -> list[str]:
    """The PostgreSQL trials (``bench.crashcheck_pg``): nodes and the database killed."""
    acked = sum(r["acknowledged"] for r in rows)
    rescue = sorted(r["rescue_s"] for r in rows if r["rescue_s"] >= 0)
    db = [r for r in rows if r["db_killed"]]
    explained = sum(r["reruns_held_by_killed_node"] + r["reruns_running_at_db_crash"] for r in rows)
    unexplained = sum(r["reruns"] for r in rows) - explained
    return [
        "## PostgreSQL: three nodes on one database (`sqlq crashcheck --store postgres`)",
        "",
        f"Each trial: a fresh database; {rows[0]['nodes']} `sqlq serve --store postgres` nodes "
        f"(16 workers, lease {rows[0]['lease_s']} s); 8 clients submit 2 ms jobs to all of "
        "them; one node is killed with SIGKILL at a random moment (uniform 0.2-1.5 s) and "
        "started again; in every other trial PostgreSQL itself is then killed "
        "(`pg_ctl stop -m immediate`) and started again. Verified in plain SQL: every "
        "acknowledged job is a completed row, and every job that ran more than once was held "
        "by the killed node at the kill or was running when the database crashed.",
        "",
        "| trials | database killed in | acknowledged (total) | lost | unexplained reruns | "
        "reruns: killed node's | reruns: database crash | rescue after kill p50 / max s | "
        "failed trials | git commit |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        f"| {len(rows)} | {len(db)} | {acked:,} | {sum(r['lost'] for r in rows)} | "
        f"{unexplained} | "
        f"{sum(r['reruns_held_by_killed_node'] for r in rows)} | "
        f"{sum(r['reruns_running_at_db_crash'] for r in rows)} | "
        f"{rescue[len(rescue) // 2]:.2f} / {rescue[-1]:.2f} | "
        f"{sum(1 for r in rows if not r['ok'])} | "
        f"{', '.join(sorted({r.get('git_commit', '?') for r in rows}))} |",
        "",
        "`rescue after kill`: from the SIGKILL until no job is still held by the dead node "
        "(its lease ran out and a live node requeued them).",
        "",
    ]
