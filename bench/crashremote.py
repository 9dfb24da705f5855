"""``sqlq crashcheck --remote-workers``: kill -9 trials with the jobs run by remote workers.

Each trial: a fresh data directory; ``sqlq serve --workers 0`` (every queue remote) as a
subprocess; ``WORKERS`` worker processes (``sqlq.bench.crashworker``, run by
``sqlq.bench.crashfleet``) claiming, heartbeating and reporting over HTTP, each noting
every call and its answer in a side file; clients submitting the remote mixed workload
(``crashload.remote_spec``) and fsyncing every acknowledged id to a ledger; the operator
of the in-process trials cancelling (running jobs too, some with ``?force=1``), retrying
and pausing. Then one of the modes:

- ``worker``: a worker holding jobs is killed -9 (and a new one started); its jobs run
  again once their leases run out;
- ``server``: the server is killed -9 while the workers hold jobs, and started again on
  the same port and data (a lease of ``SERVER_LEASE_S``, longer than the restart); the
  workers keep their finished outcomes and send them again until answered, so they land,
  and nothing runs twice but through a death;
- ``fence``: some jobs' first attempts stall (their worker stops heartbeating them and
  reports only once their lease has surely run out): every such outcome must be fenced,
  and the newer attempt's result must stand.

After the load, the queues are resumed and drained, the workers stopped (SIGTERM: they
report what they hold and exit), the server stopped; then the verdict
(``sqlq.bench.crashjudge``) reads the store's files without the engine's code
(``sqlq.bench.offline``), the ledger and the workers' files. PostgreSQL, with two nodes
and the workers talking to either: ``sqlq.bench.crashremote_pg``.
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

import uvloop

from sqlq.bench.client.http import HTTPError, HttpPool
from sqlq.bench.client.server import ServerError, ServerProcess
from sqlq.bench.crashcheck import READY_WITHIN_S, keep
from sqlq.bench.crashfleet import CANCEL_GRACE_S, LEASE_S, WORKERS, Fleet, holders, same_port
from sqlq.bench.crashjudge import Death, Verdict
from sqlq.bench.crashload import QUEUES, Ledger, Trial, load, remote_spec
from sqlq.bench.crashrecords import read_records
from sqlq.bench.crashremote_pg import run_remote_pg_trials
from sqlq.bench.offline import JobFacts, VerifyError, read_data

MODES = ("worker", "server", "fence")
CLIENTS = 4  # submitting clients
# The server mode's: longer than a restart on a busy 2-core machine (up to ~3 s seen), so
# the leases outlive the downtime and the outcomes kept through it land; no kill there
# waits for a lease to run out.
SERVER_LEASE_S = 10.0


@dataclass(frozen=True)
class RemoteTrial:
    store: str
    mode: str
    jobs: int
    kill_after_s: float
    seed: int
    sync: str = "full"
    lease_s: float = LEASE_S


def serve(trial: RemoteTrial, data: Path, ready_within: float = 120.0) -> ServerProcess:
    flags = ("--cancel-grace", str(CANCEL_GRACE_S))
    return ServerProcess.engine(
        store=trial.store, data_dir=str(data), sync=trial.sync, workers=0, flags=flags,
        ready_within=ready_within,
    )  # fmt: skip


async def chaos(trial: RemoteTrial, rng: random.Random, srv: list[ServerProcess], fleet: Fleet,
                problems: list[str], pool: HttpPool) -> None:  # fmt: skip
    """The trial's mode, at ``kill_after_s``: a worker killed and replaced, or the server
    killed and started again on its data and port; ``fence`` kills nothing."""
    await asyncio.sleep(trial.kill_after_s)
    if trial.mode == "worker":
        for _ in range(2):  # a worker that holds a job, if one does
            held = [n for n in await holders(pool) if n in fleet.procs]
            name = rng.choice(held or list(fleet.procs))
            fleet.kill(name)
            fleet.spawn()
            await asyncio.sleep(rng.uniform(0.2, 1.0))
    elif trial.mode == "server":
        for _ in range(150):  # while the workers hold jobs, if they come to within 3 s
            if await holders(pool):
                break
            await asyncio.sleep(0.02)
        old = srv[0]
        old.kill()
        killed_at = time.time()
        fleet.deaths.append(Death("server", old.url, killed_at))
        await asyncio.sleep(rng.uniform(0.0, 0.5))  # down a while: the workers retry
        for within in (READY_WITHIN_S, 120.0):
            again = same_port(serve(trial, Path(old.data_dir), within), old)
            try:
                await asyncio.to_thread(again.start)
                srv[0] = again
                fleet.downtime_s = time.time() - killed_at
                return
            except ServerError as exc:
                again.stop()
                problems.append(f"the restart failed: {str(exc)[:300]}")
        raise ServerError("the server did not come back")


async def drain(pool: HttpPool, fleet: Fleet, within: float = 120.0) -> bool:
    """Resume the queues the operator paused; wait until nothing is scheduled or running.
    Not once every worker has exited: nothing would run the rest, and the trial ends with
    the workers' own words (``Fleet.stop``) rather than a wait to the bound."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and fleet.alive():
        try:
            for q in QUEUES:
                await pool.json("POST", f"/queues/{q}/resume")
            _, stats = await pool.json("GET", "/stats")
            if stats["jobs"]["scheduled"] == 0 and stats["jobs"]["running"] == 0:
                return True
        except (HTTPError, OSError):
            pass
        await asyncio.sleep(0.05)
    return False


def run_remote_trial(trial: RemoteTrial, workdir: Path) -> dict[str, Any]:
    data = workdir / "data"
    os.makedirs(data, exist_ok=True)
    rng = random.Random(trial.seed)
    srv = [serve(trial, data)]
    srv[0].start()
    fleet = Fleet([srv[0].url], workdir, trial.lease_s, trial.seed)
    problems: list[str] = []
    t_start = time.perf_counter()
    ledger = Ledger(workdir / "ledger.txt")
    try:
        for _ in range(WORKERS):
            fleet.spawn()
        fleet.wait_ready()

        async def life() -> None:
            load_trial = Trial(store=trial.store, sync=trial.sync, jobs=trial.jobs,
                               clients=CLIENTS, kill_after_s=trial.kill_after_s,
                               compact_floor_mb=None, seed=trial.seed)  # fmt: skip
            stall = 0.15 if trial.mode == "fence" else 0.0
            async with HttpPool(srv[0].url, 2) as pool:
                stop = asyncio.Event()
                submitting = asyncio.create_task(load(
                    srv[0].url, load_trial, ledger, stop, force=0.3,
                    spec=lambda r: remote_spec(r, stall),
                ))  # fmt: skip
                await chaos(trial, rng, srv, fleet, problems, pool)
                stop.set()  # the load ends with the chaos (or at its budget, if sooner)
                await submitting
                if not await drain(pool, fleet):
                    problems.append("not drained within 120 s, or with no worker left")

        uvloop.run(life())
    except ServerError as exc:
        problems.append(str(exc)[:300])
    finally:
        fleet.stop()
        for s in srv:
            s.stop(signal.SIGTERM)
    row = verify(trial, data, workdir, fleet, problems + fleet.problems)
    row["trial_s"] = round(time.perf_counter() - t_start, 3)
    return row


def verify(trial: RemoteTrial, data: Path, workdir: Path, fleet: Fleet, problems: list[str]
           ) -> dict[str, Any]:  # fmt: skip
    """The verdict on one trial, from the files alone: the store's, the ledger, the workers'."""
    jobs: dict[str, JobFacts] = {}
    try:
        jobs = read_data(trial.store, data)
    except (VerifyError, sqlite3.Error, ValueError, KeyError) as exc:
        problems.append(f"unreadable store: {exc}")
    ledger = Ledger.read(workdir / "ledger.txt")
    verdict = Verdict(jobs, ledger, read_records(fleet.records), fleet.deaths, clients=CLIENTS)
    row = verdict.row()
    problems += verdict.problems
    return {
        "store": trial.store,
        "sync": trial.sync,
        "mode": trial.mode,
        "workload": "remote",
        "kill_after_s": round(trial.kill_after_s, 3),
        "lease_s": trial.lease_s,
        "downtime_s": round(fleet.downtime_s, 3),
        **row,
        "problems": problems,
        "ok": not problems,
    }


def run_remote_trials(
    *, store: str, sync: str, trials: int, jobs: int, seed: int, out: Path | None,
    modes: tuple[str, ...] = MODES, progress: bool = True,
) -> list[dict[str, Any]]:  # fmt: skip
    """``trials`` trials of each mode; rows to ``crash-remote-<store>-<mode>.jsonl`` as they
    come (replacing an earlier run's file)."""
    from tqdm import tqdm

    from sqlq.bench import meta

    if store == "postgres":
        return run_remote_pg_trials(trials=trials, jobs=jobs, seed=seed, out=out,
                                    progress=progress)  # fmt: skip
    rng = random.Random(seed)
    commit = meta.git_commit()
    rows: list[dict[str, Any]] = []
    for mode in modes:
        path = None
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            path = out / f"crash-remote-{store}-{mode}.jsonl"
            path.write_text("")
        for n in tqdm(range(trials), desc=f"crashcheck remote {store} {mode}",
                      disable=not progress):  # fmt: skip
            trial = RemoteTrial(store=store, mode=mode, jobs=jobs, sync=sync,
                                kill_after_s=rng.uniform(0.3, 2.0),
                                lease_s=SERVER_LEASE_S if mode == "server" else LEASE_S,
                                seed=rng.randrange(1 << 30))  # fmt: skip
            with tempfile.TemporaryDirectory(prefix="sqlq-crashremote-") as d:
                row = run_remote_trial(trial, Path(d))
            keep(rows, row, n, commit, path)
    return rows


def summary(rows: list[dict[str, Any]]) -> str:
    """One line per mode, for the command's output."""
    lines = []
    for mode in sorted({r["mode"] for r in rows}):
        mine = [r for r in rows if r["mode"] == mode]
        total = {k: sum(r[k] for r in mine) for k in ("acknowledged", "lost", "stale_outcomes",
                                                     "stale_fenced", "executions")}  # fmt: skip
        reruns = {k.removeprefix("reruns_"): sum(r[k] for r in mine)
                  for k in mine[0] if k.startswith("reruns_")}  # fmt: skip
        lines.append(f"{mine[0]['store']} {mode}: {len(mine)} trials, " + json.dumps(total)
                     + f", reruns {json.dumps(reruns)}, "
                     f"{sum(1 for r in mine if not r['ok'])} failed")  # fmt: skip
    return "\n".join(lines)


def command(*, store: str, sync: str, trials: int, jobs: int, seed: int, out: str) -> int:
    """``sqlq crashcheck --remote-workers``: the trials, ``crash.md`` rebuilt, a line per
    mode and one per failed trial; the exit status (1 if any trial failed)."""
    import click

    from sqlq.bench.crashreport import write_report

    rows = run_remote_trials(store=store, sync=sync, trials=trials, jobs=jobs, seed=seed,
                             out=Path(out))  # fmt: skip
    write_report(Path(out))
    click.echo(summary(rows))
    bad = [r for r in rows if not r["ok"]]
    for r in bad:
        click.echo(f"  {r['mode']} trial {r['trial']}: {'; '.join(r['problems'])}", err=True)
    return 1 if bad else 0
