"""``sqlq crashcheck``: kill -9 the server at random moments; prove nothing acked is lost.

Each trial: a fresh data directory; ``sqlq serve`` as a subprocess; several
clients submit jobs and append every acknowledged id to a client-side ledger
(fsynced); SIGKILL at a random moment (for walq, some trials run with a tiny
compaction floor so the kill often lands inside a compaction); restart on the
same data; wait for the queue to drain; stop. Then the data is verified
**without the engine's code** (``sqlq.bench.offline``): walq's log by a minimal
parser (framing, CRC-32, sequence numbers, fold), SQLite's file with the stdlib
``sqlite3`` module and plain SQL.

The workloads. ``schedules`` and ``workflows`` are their own (``crashsched``,
``crashflow``). ``plain``: 2 ms jobs that always succeed. ``mixed`` (the
default): besides the plain jobs, jobs that fail at random with ``max_attempts``
1 to 3, long jobs on their last attempt (so a kill often lands on one), hangs,
delayed jobs in a second queue, and an operator who cancels, retries dead and
cancelled jobs, and pauses and resumes that queue during the trial; and what a
running job carries (issue 22): long jobs the operator cancels while they run,
jobs that checkpoint then fail, jobs that snooze (``sqlq.bench.crashtasks``, which
the server imports). After the restart the operator resumes the queues and the
trial drains.

A trial fails if its first restart exits or is not ready within
``READY_WITHIN_S``; if an acknowledged id is missing, not finished, or ended in
a way the client's own story does not allow (``sqlq.bench.verdict.judge``: a cancel
the client saw succeed stays cancelled; a running job's acknowledged cancel ends it
cancelled, or completed by that attempt, never run again; the attempt that completes a
checkpointing job read the newest checkpoint saved durably before it; a snooze costs
no attempt; a dead job used its attempts); if the
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
from pathlib import Path
from typing import Any

import uvloop

from sqlq.bench import crashflow, crashsched
from sqlq.bench.client.http import HttpPool
from sqlq.bench.client.loadgen import wait_drained
from sqlq.bench.client.server import ServerError, ServerProcess
from sqlq.bench.crashload import QUEUES, SERVER_FLAGS, Ledger, Trial, load, server_env
from sqlq.bench.offline import JobFacts, VerifyError, read_data
from sqlq.bench.verdict import CANCEL_TAG, CHECKPOINT_TAG, SNOOZE_TAG, ClientRecord, judge

READY_WITHIN_S = 30.0  # a first restart slower than this fails the trial


def _restart(trial: Trial, data: Path, flags: tuple[str, ...]) -> tuple[ServerProcess, float, str]:
    """Start the server on the killed one's data: the server, seconds to ready, and a
    problem if the first start exited or was not ready in time (then it is started again,
    so that the trial still drains and is verified)."""
    problem = ""
    for within in (READY_WITHIN_S, 120.0):
        again = ServerProcess.engine(
            store=trial.store, data_dir=str(data), sync=trial.sync, flags=flags,
            ready_within=within, env=server_env(data.parent),
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
    flags: tuple[str, ...] = ("--workers", "16", *SERVER_FLAGS)
    if trial.compact_floor_mb is not None:
        # Compact often without pruning anything, so an absent job can only be a lost one.
        flags += ("--compact-floor-mb", str(trial.compact_floor_mb), "--compact-ratio", "1.5")
    srv = ServerProcess.engine(
        store=trial.store, data_dir=str(data), sync=trial.sync, flags=flags,
        env=server_env(workdir),
    )  # fmt: skip
    os.makedirs(data, exist_ok=True)
    srv.start()
    t_start = time.perf_counter()

    async def first_life() -> None:
        stop = asyncio.Event()

        def kill() -> None:
            srv.kill()
            stop.set()

        asyncio.get_running_loop().call_later(trial.kill_after_s, kill)
        await load(srv.url, trial, Ledger(ledger_path), stop)
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
    ledger.read_saved()  # the handlers' ledger, with what the restarted server's added
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
        **running_counts(jobs, ledger.records),
        "restart_to_ready_s": round(ready_s, 4),
        "first_restart_ok": not any("restart" in p for p in problems),
        "recovery": recovery,
        "problems": problems,
        "ok": not problems,
    }


def running_counts(jobs: dict[str, JobFacts], records: dict[str, ClientRecord]) -> dict[str, int]:
    """How much of a trial exercised what a running job carries (a trial that did none of
    it proves nothing of it): cancels acknowledged while running, and how those ended;
    checkpointing jobs whose completing attempt read an earlier one's checkpoint;
    snoozing jobs completed, and their snoozes."""
    asked = [i for i, r in records.items() if "cancel202" in r.events and i in jobs]
    checkpoints = [i for i, r in records.items() if r.tag == CHECKPOINT_TAG and i in jobs]
    snoozers = [i for i, r in records.items() if r.tag == SNOOZE_TAG and i in jobs]
    return {
        "long_jobs": sum(1 for r in records.values() if r.tag == CANCEL_TAG),
        "running_cancels": len(asked),
        "running_cancels_cancelled": sum(1 for i in asked if jobs[i].state == "cancelled"),
        "checkpoint_jobs": len(checkpoints),
        "checkpoints_read": sum(
            1 for i in checkpoints
            if jobs[i].state == "completed" and (jobs[i].result or {}).get("read") is not None
        ),
        "checkpoints_saved": sum(len(records[i].saved) for i in checkpoints),
        "snoozes": sum(jobs[i].snoozes for i in snoozers if jobs[i].state == "completed"),
        "with_progress": sum(1 for j in jobs.values() if j.progress is not None),
        "with_errors": sum(1 for j in jobs.values() if j.errors),
    }  # fmt: skip


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
        if workload == "schedules":
            with tempfile.TemporaryDirectory(prefix="sqlq-crashsched-") as d:
                row = crashsched.run_trial(store, sync, crashsched.kill_after(rng), Path(d))
            keep(rows, row, n, commit, path)
            continue
        if workload == "workflows":
            with tempfile.TemporaryDirectory(prefix="sqlq-crashflow-") as d:
                kill_at, trial_seed = crashflow.kill_after(rng), rng.randrange(1 << 30)
                row = crashflow.run_trial(store, sync, kill_at, trial_seed, Path(d))
            keep(rows, row, n, commit, path)
            continue
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
