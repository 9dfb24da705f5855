"""``sqlq crashcheck --store postgres``: several nodes on one database, killed; nothing acked lost.

Each trial: a fresh database in a throwaway PostgreSQL 15 cluster (fsync on);
three ``sqlq serve --store postgres`` nodes; eight clients submit 2 ms jobs to
all three (each client moves to the next node when one does not answer) and
keep every acknowledged id. At a random moment one node is killed with
SIGKILL and started again; in every ``db_kill_every``-th trial PostgreSQL itself
is then killed too (``pg_ctl stop -m immediate``, its own kill -9) and started
again. The load ends; the trial waits until nothing is scheduled or running;
the nodes are stopped.

The verdict comes from plain SQL, not the engine's code: every acknowledged id
must be a completed row. A job that ran more than once (``attempts > 1``) must
be explained: it was held by the killed node at the kill (read in SQL once the
SIGKILL's node has no connection left, so a commit it sent has landed or been undone and
the dead node can change nothing), or it was running
when PostgreSQL crashed (read in SQL right after the database came back), or a
node's log names that very job in an event that makes a live node's job run
again (``node_events``): an outcome it could not record, or an attempt it cut off
because its lease ran out unrenewed. With leases that bound execution such an
expiry is an event, not a mystery; each rerun is counted under the first cause
that explains it. Any other rerun is a failure. The time from the node's kill
until none of its jobs is still held by it is the rescue time.
"""

from __future__ import annotations

import asyncio
import random
import re
import signal
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlq.bench import crashflow, crashsched, fairaudit
from sqlq.bench.client.http import HttpPool
from sqlq.bench.client.server import ServerError, ServerProcess
from sqlq.bench.crashcheck import READY_WITHIN_S, keep, running_counts
from sqlq.bench.crashload import QUEUES, Ledger, mixed_spec
from sqlq.bench.crashload_pg import CLIENTS, NODES, Targets, node, start_all, stop_all, submit
from sqlq.bench.offline_pg import read_pg, sql
from sqlq.bench.pgcluster import Cluster, make_cluster
from sqlq.bench.verdict import judge
from sqlq.engines.postgres.connections import application_name

# The two log lines (``--log-level warning``) by which a live node makes its job run again:
# an outcome it could not write (``ClaimsBase._outcome``, sqlq/runtime/claims.py: the job
# stays running until its lease runs out and a node rescues it), and an attempt the health
# loop cut off because its lease was not renewed in time (sqlq/runtime/workers.py).
DROPPED_OUTCOME = re.compile(r"could not record the outcome of job ([0-9a-f]{32})\b")
# a started attempt's (the pool's cut) or an unstarted claim's (SharedClaims._lost_unstarted)
LEASE_LOST = re.compile(r"(?:worker \d+ holding )?job ([0-9a-f]{32}): lease lost\b")


# A row's count of the reruns each cause explains, in the order ``explain`` tries them.
RERUN_CAUSES = (
    "reruns_held_by_killed_node",
    "reruns_running_at_db_crash",
    "reruns_dropped_outcome",
    "reruns_lease_lost",
)


@dataclass(frozen=True)
class NodeEvents:
    """The jobs the nodes' logs name in an event that makes a live node's job run again."""

    dropped_outcome: frozenset[str] = frozenset()
    lease_lost: frozenset[str] = frozenset()


def node_events(text: str) -> NodeEvents:
    """The events of one or more nodes' log text: each job named by a dropped outcome or a
    lease lost. Only these lines explain a live node's rerun, and only of the job they
    name: a line about the database, or about another job, explains nothing."""
    return NodeEvents(
        dropped_outcome=frozenset(DROPPED_OUTCOME.findall(text)),
        lease_lost=frozenset(LEASE_LOST.findall(text)),
    )


def read_node_events(workdir: Path) -> NodeEvents:
    """``node_events`` over every node's log in ``workdir``: the first three, the killed
    node's restart, and its replacement if that restart failed (``node{n}.log``)."""
    text = "\n".join(f.read_text(errors="replace") for f in sorted(workdir.glob("node*.log")))
    return node_events(text)


def explain(
    reruns: set[str], held: set[str], at_crash: set[str], events: NodeEvents
) -> tuple[dict[str, int], set[str]]:
    """Each rerun under the first cause that names it (the killed node held it, it ran
    when the database crashed, its outcome was dropped, its lease was lost), counted per
    cause; and the reruns no cause names."""
    causes = [held, at_crash, events.dropped_outcome, events.lease_lost]
    counts: dict[str, int] = {}
    left = set(reruns)
    for name, jobs in zip(RERUN_CAUSES, causes, strict=True):
        counts[name] = len(left & jobs)
        left -= jobs
    return counts, left


@dataclass(frozen=True)
class PgTrial:
    jobs: int
    kill_after_s: float
    kill_db: bool
    db_kill_delay_s: float
    lease_s: float = 5.0
    workload: str = "mixed"


def _flags(trial: PgTrial) -> tuple[str, ...]:
    """A node's flags besides the trial's own: the fair workload's queue policy."""
    return fairaudit.FLAGS if trial.workload == "fair" else ()


async def _backends_gone(dsn: str, node_name: str, within: float = 30.0) -> bool:
    """Until no connection of the killed node is left in the database: a commit it sent
    just before the kill (waiting on the WAL's flush, or on a lock) lands or is undone
    first, so what it held is read whole. A backend notices its client's death at its next
    read of the socket, at once while idle."""
    deadline = time.monotonic() + within
    name = application_name(node_name)
    while time.monotonic() < deadline:
        rows = await sql(dsn, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                         name)  # fmt: skip
        if rows[0][0] == 0:
            return True
        await asyncio.sleep(0.01)
    return False


async def _node_name(url: str) -> str:
    async with HttpPool(url, 1) as pool:
        _, stats = await pool.json("GET", "/stats")
    return str(stats["shared"]["node"])


async def run_pg_trial(cluster: Cluster, trial: PgTrial, workdir: Path, rng: random.Random
                       ) -> dict[str, Any]:  # fmt: skip
    dsn = await asyncio.to_thread(cluster.create_database)
    nodes = [node(dsn, trial.lease_s, workdir, i, extra=_flags(trial)) for i in range(NODES)]
    started = list(nodes)  # every node this trial spawns, so a failure stops them all
    try:
        return await _trial(cluster, trial, workdir, rng, dsn, nodes, started)
    finally:
        await stop_all(started)  # SIGKILL if still running; idempotent


async def _trial(cluster: Cluster, trial: PgTrial, workdir: Path, rng: random.Random, dsn: str,
                 nodes: list[ServerProcess], started: list[ServerProcess]
                 ) -> dict[str, Any]:  # fmt: skip
    await start_all(nodes)
    urls = [n.url for n in nodes]
    victim = rng.randrange(NODES)
    victim_name = await _node_name(urls[victim])
    targets = Targets()
    for url in urls:
        await targets.add(url)
    stop = asyncio.Event()
    restart_problems: list[str] = []
    ledger = Ledger(workdir / "ledger.txt")
    held_by_victim: set[str] = set()
    running_at_db_crash: set[str] = set()
    events: dict[str, float] = {}

    async def chaos() -> None:
        await asyncio.sleep(trial.kill_after_s)
        nodes[victim].kill()
        killed_at = time.monotonic()
        if not await _backends_gone(dsn, victim_name):  # (a commit it sent may land later)
            restart_problems.append("the killed node's connections outlived it by 30 s")
        rows = await sql(dsn, "SELECT id FROM jobs WHERE node = $1 AND state = 'running'",
                          victim_name)  # fmt: skip
        held_by_victim.update(r[0] for r in rows)
        again = node(dsn, trial.lease_s, workdir, NODES + 1, READY_WITHIN_S, _flags(trial))
        started.append(again)
        again.spawn()
        nodes[victim] = again
        try:
            await asyncio.to_thread(again.wait_ready)
        except ServerError as exc:  # the restart of a killed node must come up
            restart_problems.append(f"the killed node's restart failed: {str(exc)[:300]}")
            again = node(dsn, trial.lease_s, workdir, NODES + 2, extra=_flags(trial))
            started.append(again)
            nodes[victim] = again.spawn()
            await asyncio.to_thread(again.wait_ready)
        await targets.add(again.url)
        if trial.kill_db:
            await asyncio.sleep(trial.db_kill_delay_s)
            await asyncio.to_thread(cluster.stop, "immediate")
            events["db_down_s"] = time.monotonic()
            await asyncio.to_thread(cluster.start)
            events["db_down_s"] = time.monotonic() - events["db_down_s"]
            rows = await sql(dsn, "SELECT id FROM jobs WHERE state = 'running'")
            running_at_db_crash.update(r[0] for r in rows)
        # The dead node's jobs: how long until none is still held by it.
        while True:
            rows = await sql(dsn, "SELECT count(*) FROM jobs WHERE node = $1 AND "
                              "state = 'running'", victim_name)  # fmt: skip
            if rows[0][0] == 0:
                events["rescue_s"] = time.monotonic() - killed_at
                break
            if time.monotonic() - killed_at > 120:
                break
            await asyncio.sleep(0.05)
        stop.set()

    fair = trial.workload == "fair"
    audit: list[asyncio.Task[Any]] = []
    drained = asyncio.Event()
    peaks: dict[str, int] = {}
    if fair:  # the starts recorded by the database, the running sampled, a key refilled
        await fairaudit.install(dsn)
        audit = [
            asyncio.create_task(fairaudit.sample(dsn, drained, peaks)),
            asyncio.create_task(fairaudit.refill(dsn, targets.first, ledger, stop)),
        ]
    load = asyncio.create_task(submit(targets, trial.jobs, stop, ledger, trial.workload, rng,
                                      spec=fairaudit.spec if fair else mixed_spec))  # fmt: skip
    try:
        await chaos()
        await load
        if fair:
            await audit[1]
        if trial.workload == "mixed":  # the operator resumes what it paused
            pool = targets.first()
            assert pool is not None
            for q in QUEUES:
                await pool.json("POST", f"/queues/{q}/resume")
    finally:
        await targets.close()
    # Drain: nothing scheduled or running, read in plain SQL.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rows = await sql(dsn, "SELECT count(*) FROM jobs WHERE state IN ('scheduled', 'running')")
        if rows[0][0] == 0:
            break
        await asyncio.sleep(0.05)
    drained.set()
    await stop_all(nodes, signal.SIGTERM)
    row = await verify(
        dsn, trial, ledger, held_by_victim, running_at_db_crash, events, restart_problems,
        read_node_events(workdir),
    )  # fmt: skip
    if fair:
        judged = await fairaudit.judge(dsn, peaks, await audit[0], audit[1].result())
        row["problems"] += judged.pop("fair_problems")
        row.update(judged, ok=not row["problems"])
    return row


async def verify(
    dsn: str, trial: PgTrial, ledger: Ledger | list[str], held: set[str], at_crash: set[str],
    events: dict[str, float], problems: list[str] | None = None,
    logged: NodeEvents = NodeEvents(),
) -> dict[str, Any]:  # fmt: skip
    """The verdict in plain SQL: every acknowledged job ended as the client's story allows
    (``sqlq.bench.verdict.judge``; a plain job: completed), and every rerun of a job that
    cannot fail is explained by a death or by an event of the nodes' logs naming it
    (``logged``, from ``read_node_events``)."""
    if isinstance(ledger, list):  # ids alone: acknowledged plain jobs
        ids, ledger = ledger, Ledger(Path("unused"))
        for i in ids:
            ledger.ack(i, None, False)
    jobs = await read_pg(dsn)
    if isinstance(ledger, Ledger):
        ledger.read_saved()  # what the handlers saw durable, through every node's life
    problems = list(problems or [])
    acked = ledger.acked
    lost = [i for i in acked if i not in jobs]
    # A shared claim takes a new epoch, and so does the requeue after a failed attempt.
    deaths = 2 + (1 if trial.kill_db else 0)  # a rerun each, at most: the node, the database
    verdicts = {
        i: judge(jobs[i], ledger.records[i], epochs_per_attempt=2, deaths=deaths)
        for i in acked
        if i in jobs
    }
    plain = {i for i in acked if not ledger.records[i].can_fail and not ledger.records[i].events}
    unfinished = {i: v for i, v in verdicts.items() if v is not None}
    ack_set = set(acked)
    unknown = [i for i in jobs if i not in ack_set]
    reruns = {i for i in plain if i in jobs and jobs[i].attempts > 1}
    causes, unexplained = explain(reruns, held, at_crash, logged)
    if lost:
        problems.append(f"{len(lost)} acknowledged jobs missing")
    if unfinished:
        example = next(iter(unfinished.items()))
        problems.append(
            f"{len(unfinished)} acknowledged jobs ended wrong, e.g. {example[0]}: {example[1]}"
        )
    failures = 2 + (1 if trial.kill_db else 0)  # a node kill, its restart, a database kill
    if len(unknown) > CLIENTS * failures:
        problems.append(f"{len(unknown)} jobs never acknowledged")
    if unexplained:
        problems.append(
            f"{len(unexplained)} jobs ran twice with no node or database death and no event "
            f"naming them in a node's log, e.g. {min(unexplained)}"
        )
    if "rescue_s" not in events:
        problems.append("the killed node's jobs were never rescued")
    return {
        "store": "postgres",
        "sync": "full",
        "workload": trial.workload,
        "nodes": NODES,
        "kill_after_s": round(trial.kill_after_s, 3),
        "db_killed": trial.kill_db,
        "acknowledged": len(acked),
        "lost": len(lost) + len(unfinished),
        "unknown": len(unknown),
        "reruns": len(reruns),
        **causes,
        "dropped_outcomes": len(logged.dropped_outcome),
        "leases_lost": len(logged.lease_lost),
        "held_by_killed_node": len(held),
        "rescue_s": round(events.get("rescue_s", -1.0), 3),
        "db_down_s": round(events.get("db_down_s", 0.0), 3),
        "lease_s": trial.lease_s,
        "ended": dict(Counter(jobs[i].state for i in acked if i in jobs)),
        **running_counts(jobs, ledger.records),
        "first_restart_ok": not any("restart" in p for p in problems),
        "problems": problems,
        "ok": not problems,
    }


def run_pg_trials(
    *, trials: int, jobs: int, seed: int, out: Path | None, db_kill_every: int = 2,
    progress: bool = True, workload: str = "mixed",
) -> list[dict[str, Any]]:  # fmt: skip
    """``trials`` trials on one throwaway cluster; rows to ``crash-postgres-full.jsonl``."""
    import tempfile

    from tqdm import tqdm

    from sqlq.bench import meta

    rng = random.Random(seed)
    commit = meta.git_commit()
    path = None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"crash-postgres-full{'' if workload == 'plain' else '-' + workload}.jsonl"
        path.write_text("")
    cluster = make_cluster()
    rows: list[dict[str, Any]] = []
    try:
        for n in tqdm(range(trials), desc="crashcheck postgres", disable=not progress):
            if workload == "workflows":  # two nodes, one killed (sqlq.bench.crashflow)
                with tempfile.TemporaryDirectory(prefix="sqlq-crashflow-pg-") as d:
                    dsn = cluster.create_database()
                    run = crashflow.run_pg_trial(dsn, crashflow.kill_after(rng),
                                                 rng.randrange(crashflow.PG_NODES),
                                                 rng.randrange(1 << 30), Path(d))  # fmt: skip
                    keep(rows, asyncio.run(run), n, commit, path)
                continue
            if workload == "schedules":
                with tempfile.TemporaryDirectory(prefix="sqlq-crashsched-pg-") as d:
                    dsn = cluster.create_database()
                    run = crashsched.run_pg_trial(
                        dsn, crashsched.kill_after(rng), rng.randrange(NODES), Path(d)
                    )
                    keep(rows, asyncio.run(run), n, commit, path)
                continue
            trial = PgTrial(
                jobs=jobs,
                kill_after_s=rng.uniform(0.2, 1.5),
                # (fair: a node killed, never the database, whose outage would hold a
                # refill past a poll; the buckets' durability is the claims' own commit)
                kill_db=n % db_kill_every == 0 and workload != "fair",
                db_kill_delay_s=rng.uniform(0.1, 0.8),
                workload=workload,
            )
            with tempfile.TemporaryDirectory(prefix="sqlq-crashcheck-pg-") as d:
                row = asyncio.run(run_pg_trial(cluster, trial, Path(d), rng))
            keep(rows, row, n, commit, path)
    finally:
        cluster.end()
    return rows
