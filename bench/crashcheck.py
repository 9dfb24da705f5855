"""``sqlq crashcheck``: kill -9 the server at random moments; prove nothing acked is lost.

Each trial: a fresh data directory; ``sqlq serve`` as a subprocess; several
clients submit jobs and append every acknowledged id to a client-side ledger
(fsynced); SIGKILL at a random moment (for walq, some trials run with a tiny
compaction floor so the kill often lands inside a compaction); restart on the
same data; wait for the queue to drain; stop. Then the data is verified
**without the engine's code** (``sqlq.bench.offline``): walq's log by a minimal
parser (framing, CRC-32, sequence numbers, fold), SQLite's file with the stdlib
``sqlite3`` module and plain SQL.

Two workloads. ``plain``: 2 ms jobs that always succeed. ``mixed`` (the
default): besides the plain jobs, jobs that fail at random with ``max_attempts``
1 to 3, long jobs on their last attempt (so a kill often lands on one), hangs,
delayed jobs in a second queue, and an operator who cancels, retries dead and
cancelled jobs, and pauses and resumes that queue during the trial. After the
restart the operator resumes the queues and the trial drains.

A trial fails if its first restart exits or is not ready within
``READY_WITHIN_S``; if an acknowledged id is missing, not finished, or ended in
a way the client's own story does not allow (``sqlq.bench.offline.judge``: a cancel
the client saw succeed stays cancelled; a dead job used its attempts); if the
store holds more unacknowledged jobs than could have been in flight at the kill
(one per client); or if a job's epoch history is inconsistent.
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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import uvloop

from sqlq.bench.client.http import HTTPError, HttpPool
from sqlq.bench.client.loadgen import wait_drained
from sqlq.bench.client.server import ServerError, ServerProcess
from sqlq.bench.offline import ClientRecord, JobFacts, VerifyError, judge, read_data

READY_WITHIN_S = 30.0  # a first restart slower than this fails the trial
QUEUES = ("default", "mail")  # mixed: "mail" is the one the operator pauses
PLAIN: dict[str, Any] = {"kind": "sleep", "args": {"work_ms": 2}}


@dataclass(frozen=True)
class Trial:
    store: str
    sync: str
    jobs: int
    clients: int
    kill_after_s: float
    compact_floor_mb: float | None
    workload: str = "mixed"
    seed: int = 0  # the mixed workload's choices


def mixed_spec(rng: random.Random) -> tuple[dict[str, Any], bool]:
    """One submission of the mixed workload, and whether it may fail (or hang)."""
    roll = rng.random()
    queue = "mail" if rng.random() < 0.3 else "default"
    if roll < 0.45:  # plain
        return {**PLAIN, "queue": queue}, False
    attempts = rng.randint(1, 3)
    if roll < 0.70:  # fails at random
        args = {"work_ms": rng.randint(1, 5), "fail_prob": 0.5}
        return {"kind": "sleep", "args": args, "max_attempts": attempts, "queue": queue}, True
    if roll < 0.80:  # long, on its last attempt: a kill often lands on it
        args = {"work_ms": rng.randint(200, 1500)}
        if rng.random() < 0.3:
            args["fail_prob"] = 0.3
        return {"kind": "sleep", "args": args, "max_attempts": 1, "queue": queue}, True
    if roll < 0.85:  # hangs: the health check cuts it off
        args = {"work_ms": 2, "hang_prob": 0.5}
        return {"kind": "sleep", "args": args, "max_attempts": attempts, "queue": queue}, True
    # delayed: what the operator cancels
    spec = {**PLAIN, "queue": queue, "delay_ms": rng.randint(100, 800), "max_attempts": attempts}
    return spec, False


class Ledger:
    """What the clients did and were told, appended (and fsynced in groups) to a file as
    it happens: ``ack <id> <max_attempts or -> <0|1 may fail>``, ``<event> <id>``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: dict[str, ClientRecord] = {}
        self.acked: list[str] = []
        self.delayed: list[str] = []  # acknowledged delayed jobs: the operator's cancels
        self._lines: list[str] = []

    def ack(self, job_id: str, max_attempts: int | None, can_fail: bool) -> None:
        self.records[job_id] = ClientRecord(max_attempts, can_fail)
        self.acked.append(job_id)
        self._lines.append(f"ack {job_id} {max_attempts or '-'} {int(can_fail)}\n")

    def note(self, job_id: str, event: str) -> None:
        self.records.setdefault(job_id, ClientRecord()).events.append(event)
        self._lines.append(f"{event} {job_id}\n")

    def take(self) -> bytes:
        lines, self._lines = self._lines, []
        return "".join(lines).encode()

    @classmethod
    def read(cls, path: Path) -> Ledger:
        """The ledger as the file has it (what was fsynced is all that counts)."""
        ledger = cls(path)
        text = path.read_text() if path.exists() else ""
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 1:  # an id alone: the plain workload's old format
                ledger.ack(parts[0], None, False)
            elif parts and parts[0] == "ack":
                ledger.ack(parts[1], None if parts[2] == "-" else int(parts[2]), parts[3] == "1")
            elif len(parts) == 2:
                ledger.note(parts[1], parts[0])
        ledger._lines = []
        return ledger


async def operate(
    pools: Callable[[], HttpPool | None], ledger: Ledger, rng: random.Random,
    stop: asyncio.Event, *, gone: Callable[[HttpPool], None] | None = None,
) -> None:  # fmt: skip
    """The mixed workload's operator: cancels, retries, pauses and resumes until stopped,
    on the server ``pools()`` names. When that one stops answering it gives up, or with
    ``gone`` (many nodes) tells it and goes on with the next."""
    paused = False
    while not stop.is_set():
        await asyncio.sleep(rng.uniform(0.005, 0.03))
        pool = pools()
        if pool is None:
            continue
        roll = rng.random()
        try:
            if roll < 0.45 and ledger.delayed:
                job_id = ledger.delayed.pop(rng.randrange(len(ledger.delayed)))
                ledger.note(job_id, "cancel?")
                status, _ = await pool.json("DELETE", f"/jobs/{job_id}")
                if status == 200:
                    ledger.note(job_id, "cancel")
            elif roll < 0.8:
                state = "dead" if rng.random() < 0.7 else "cancelled"
                status, page = await pool.json("GET", f"/jobs?state={state}&limit=20")
                ids = [j["id"] for j in page.get("jobs", [])] if status == 200 else []
                if ids:
                    job_id = rng.choice(ids)
                    ledger.note(job_id, "retry?")
                    status, _ = await pool.json("POST", f"/jobs/{job_id}/retry")
                    if status == 200:
                        ledger.note(job_id, "retry")
            else:
                paused = not paused
                await pool.json("POST", f"/queues/mail/{'pause' if paused else 'resume'}")
        except (HTTPError, OSError, TimeoutError):
            if gone is None:
                return  # the server is gone
            gone(pool)


async def _load(url: str, trial: Trial, ledger: Ledger, stop: asyncio.Event) -> int:
    """Submit until stopped; every acked id goes to the ledger, fsynced in groups."""
    rng = random.Random(trial.seed)
    fd = os.open(ledger.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    loop = asyncio.get_running_loop()
    mixed = trial.workload == "mixed"

    def append(data: bytes) -> None:
        os.write(fd, data)
        os.fsync(fd)

    async def flush() -> None:
        chunk = ledger.take()
        if chunk:
            await loop.run_in_executor(None, append, chunk)

    try:
        async with HttpPool(url, trial.clients + 1) as pool:

            async def client() -> None:
                while not stop.is_set() and len(ledger.acked) < trial.jobs:
                    spec, can_fail = mixed_spec(rng) if mixed else (PLAIN, False)
                    try:
                        status, reply = await pool.json("POST", "/jobs", msgspec.json.encode(spec))
                    except (HTTPError, OSError):
                        return
                    if status == 201:
                        ledger.ack(reply["id"], spec.get("max_attempts"), can_fail)
                        if "delay_ms" in spec:
                            ledger.delayed.append(reply["id"])

            async def ledger_writer() -> None:
                while not stop.is_set():
                    await flush()
                    await asyncio.sleep(0.01)

            writer = asyncio.create_task(ledger_writer())
            clients = [client() for _ in range(trial.clients)]
            if mixed:
                rng_op = random.Random(trial.seed + 1)
                clients.append(operate(lambda: pool, ledger, rng_op, stop))
            await asyncio.gather(*clients)
            stop.set()
            await writer
            await flush()
    finally:
        os.close(fd)
    return len(ledger.acked)


def _restart(trial: Trial, data: Path, flags: tuple[str, ...]) -> tuple[ServerProcess, float, str]:
    """Start the server on the killed one's data: the server, seconds to ready, and a
    problem if the first start exited or was not ready in time (then it is started again,
    so that the trial still drains and is verified)."""
    problem = ""
    for within in (READY_WITHIN_S, 120.0):
        again = ServerProcess.engine(
            store=trial.store, data_dir=str(data), sync=trial.sync, flags=flags,
            ready_within=within,
        )  # fmt: skip
        t0 = time.perf_counter()
        try:
            again.start()
            return again, time.perf_counter() - t0, problem
        except ServerError as exc:
            again.stop()
            tail = [x for x in again.output.splitlines() if x.strip()][-1:] or [str(exc)]
            why = str(exc).split(":")[0]  # "sqlq serve exited with 1", "... not ready within"
            problem = problem or f"the first restart failed: {why}: {tail[0][-300:]}"
    raise ServerError(f"{problem}; and the second start failed too")


def run_trial(trial: Trial, workdir: Path) -> dict[str, Any]:
    data = workdir / "data"
    ledger_path = workdir / "ledger.txt"
    flags: tuple[str, ...] = ("--workers", "16")
    if trial.compact_floor_mb is not None:
        # Compact often without pruning anything, so an absent job can only be a lost one.
        flags += ("--compact-floor-mb", str(trial.compact_floor_mb), "--compact-ratio", "1.5")
    srv = ServerProcess.engine(store=trial.store, data_dir=str(data), sync=trial.sync, flags=flags)
    os.makedirs(data, exist_ok=True)
    srv.start()
    t_start = time.perf_counter()

    async def first_life() -> None:
        stop = asyncio.Event()

        def kill() -> None:
            srv.kill()
            stop.set()

        asyncio.get_running_loop().call_later(trial.kill_after_s, kill)
        await _load(srv.url, trial, Ledger(ledger_path), stop)
        srv.kill()  # if the load finished before the timer

    uvloop.run(first_life())
    srv.stop()
    ledger = Ledger.read(ledger_path)
    problems: list[str] = []
    try:
        again, ready_s, problem = _restart(trial, data, flags)
    except ServerError as exc:
        problems.append(str(exc))
        row = verify(trial, data, ledger, -1.0, {}, problems)
        row["trial_s"] = round(time.perf_counter() - t_start, 3)
        return row
    if problem:
        problems.append(problem)

    async def drain() -> dict[str, Any]:
        async with HttpPool(again.url, 1) as pool:
            if trial.workload == "mixed":  # the operator resumes what it paused
                for q in QUEUES:
                    await pool.json("POST", f"/queues/{q}/resume")
            return await wait_drained(pool)

    recovery = uvloop.run(drain())
    again.stop(signal.SIGTERM)  # graceful: the last completions are flushed
    row = verify(trial, data, ledger, ready_s, recovery, problems)
    row["trial_s"] = round(time.perf_counter() - t_start, 3)
    return row


def verify(
    trial: Trial, data: Path, ledger: Ledger | list[str], ready_s: float,
    recovery: dict[str, Any], problems: list[str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The verdict on one trial, from the files alone (and the client's ledger)."""
    problems = list(problems or [])
    if isinstance(ledger, list):  # ids alone: acknowledged plain jobs
        ids, ledger = ledger, Ledger(data / "unused")
        for i in ids:
            ledger.ack(i, None, False)
    jobs: dict[str, JobFacts] = {}
    try:
        jobs = read_data(trial.store, data)
    except (VerifyError, sqlite3.Error, ValueError, KeyError) as exc:
        problems.append(f"unreadable store: {exc}")
    acked = ledger.acked
    verdicts = {i: judge(jobs.get(i), ledger.records[i]) for i in acked}
    lost = [i for i in acked if i not in jobs]
    wrong = {i: v for i, v in verdicts.items() if v is not None and i in jobs}
    ack_set = set(acked)
    unknown = [i for i in jobs if i not in ack_set]
    # A rerun: a job that cannot fail ran more than once (its completion was lost at the kill).
    reruns = sum(
        1 for i in acked if i in jobs and jobs[i].attempts > 1 and not ledger.records[i].can_fail
    )
    if lost:
        problems.append(f"{len(lost)} acknowledged jobs missing")
    if wrong:
        example = next(iter(wrong.items()))
        problems.append(
            f"{len(wrong)} acknowledged jobs ended wrong, e.g. {example[0]}: {example[1]}"
        )
    if len(unknown) > trial.clients:
        problems.append(
            f"{len(unknown)} jobs never acknowledged (at most {trial.clients} in flight)"
        )
    ended = Counter(jobs[i].state for i in acked if i in jobs)
    return {
        "store": trial.store,
        "sync": trial.sync,
        "workload": trial.workload,
        "kill_after_s": round(trial.kill_after_s, 3),
        "compaction_trial": trial.compact_floor_mb is not None,
        "acknowledged": len(acked),
        "lost": len(lost) + len(wrong),
        "unknown": len(unknown),
        "reruns": reruns,
        "ended": dict(ended),
        "cancels_seen": sum(r.events.count("cancel") for r in ledger.records.values()),
        "retries_seen": sum(r.events.count("retry") for r in ledger.records.values()),
        "restart_to_ready_s": round(ready_s, 4),
        "first_restart_ok": not any("restart" in p for p in problems),
        "recovery": recovery,
        "problems": problems,
        "ok": not problems,
    }


def run_trials(
    *, store: str, sync: str, trials: int, jobs: int, seed: int, out: Path | None,
    progress: bool = True, workload: str = "mixed",
) -> list[dict[str, Any]]:  # fmt: skip
    """Run ``trials`` kill -9 trials; returns one row per trial.

    With ``out``, the rows go to ``crash-<store>-<sync>.jsonl`` as they come (a
    long run that is stopped keeps its trials), replacing any earlier run's file,
    so the report never sums two runs of different code.
    """
    from tqdm import tqdm

    from sqlq.bench import meta

    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    commit = meta.git_commit()
    path = None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"crash-{store}-{sync}{'' if workload == 'plain' else '-' + workload}.jsonl"
        path.write_text("")
    for n in tqdm(range(trials), desc=f"crashcheck {store}", disable=not progress):
        trial = Trial(
            store=store,
            sync=sync,
            jobs=jobs,
            clients=8,
            kill_after_s=rng.uniform(0.05, 1.5),
            compact_floor_mb=0.05 if store == "walq" and n % 3 == 0 else None,
            workload=workload,
            seed=rng.randrange(1 << 30),
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
    from sqlq.bench import meta

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
        "| store | sync | workload | trials | acknowledged (total) | lost | "
        "unknown (max per trial) | reruns (total) | rerun rate | restart to ready p50 s | "
        "failed trials | git commit |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    shared: list[list[dict[str, Any]]] = []
    for path in sorted(out.glob("crash-*.jsonl")):
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        if not rows:
            continue
        if rows[0]["store"] == "postgres":
            shared.append(rows)
            continue
        acked = sum(r["acknowledged"] for r in rows)
        reruns = sum(r["reruns"] for r in rows)
        ready = sorted(r["restart_to_ready_s"] for r in rows)
        lines.append(
            f"| {rows[0]['store']} | {rows[0]['sync']} | {rows[0].get('workload', 'plain')} | "
            f"{len(rows)} | {acked:,} | "
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
        "not yet durable at the kill (at-least-once delivery); in the mixed workload, counted "
        "over the jobs that cannot fail. `lost` in the mixed workload also counts jobs that "
        "ended in a way the client's story does not allow. A trial also fails if its first "
        f"restart exits or is not ready within {READY_WITHIN_S:.0f} s.",
        "",
        "The mixed workload: beside 2 ms jobs, jobs that fail at random (max_attempts 1-3), "
        "long jobs on their only attempt, hangs, delayed jobs, in two queues; an operator "
        "cancels delayed jobs, retries dead and cancelled ones, and pauses and resumes a queue "
        "during the trial. Every acknowledged job must end as the client's story allows: a "
        "cancel it saw succeed stays cancelled (unless it retried the job after), a dead job "
        "used all its attempts.",
        "",
    ]
    if shared:
        lines += _shared_section(shared)
    text = "\n".join(lines)
    (out / "crash.md").write_text(text)
    return text


def _shared_section(runs: list[list[dict[str, Any]]]) -> list[str]:
    """The PostgreSQL trials (``sqlq.bench.crashcheck_pg``): nodes and the database killed."""
    first = runs[0][0]
    lines = [
        "## PostgreSQL: three nodes on one database (`sqlq crashcheck --store postgres`)",
        "",
        f"Each trial: a fresh database; {first['nodes']} `sqlq serve --store postgres` nodes "
        f"(16 workers, lease {first['lease_s']} s); 8 clients submit to all of "
        "them (the plain or mixed workload above; in the mixed one an operator acts on one "
        "node at a time); one node is killed with SIGKILL at a random moment (uniform "
        "0.2-1.5 s) and started again; in every other trial PostgreSQL itself is then killed "
        "(`pg_ctl stop -m immediate`) and started again. Verified in plain SQL: every "
        "acknowledged job ended as the client's story allows (plain: completed), and every job "
        "that cannot fail and ran more than once was held by the killed node at the kill or "
        "was running when the database crashed.",
        "",
        "| workload | trials | database killed in | acknowledged (total) | lost | "
        "unexplained reruns | reruns: killed node's | reruns: database crash | "
        "rescue after kill p50 / max s | failed trials | git commit |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for rows in runs:
        acked = sum(r["acknowledged"] for r in rows)
        rescue = sorted(r["rescue_s"] for r in rows if r["rescue_s"] >= 0) or [-1.0]
        db = [r for r in rows if r["db_killed"]]
        explained = sum(
            r["reruns_held_by_killed_node"] + r["reruns_running_at_db_crash"] for r in rows
        )
        unexplained = sum(r["reruns"] for r in rows) - explained
        lines.append(
            f"| {rows[0].get('workload', 'plain')} | {len(rows)} | {len(db)} | {acked:,} | "
            f"{sum(r['lost'] for r in rows)} | {unexplained} | "
            f"{sum(r['reruns_held_by_killed_node'] for r in rows)} | "
            f"{sum(r['reruns_running_at_db_crash'] for r in rows)} | "
            f"{rescue[len(rescue) // 2]:.2f} / {rescue[-1]:.2f} | "
            f"{sum(1 for r in rows if not r['ok'])} | "
            f"{', '.join(sorted({r.get('git_commit', '?') for r in rows}))} |"
        )
    return [
        *lines,
        "",
        "`rescue after kill`: from the SIGKILL until no job is still held by the dead node "
        "(its lease ran out and a live node requeued them).",
        "",
    ]
