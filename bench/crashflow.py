"""Workflows through kill -9: each child after its parents, released once, the cone of a
dead member cancelled, a handler's spawned jobs there exactly when it completed, and a
retried graph drained to completed (``sqlq crashcheck --workload workflows``).

Each trial: a fresh data directory; ``sqlq serve`` (its crash kinds imported,
``sqlq.bench.crashtasks``); clients submit graphs as workflows (``POST /jobs/batch``
with ``workflow: true``): chains of 100, diamonds, 1 -> 1,000 -> 1, and random
2,000-member DAGs. A member is a short ``sleep`` job whose attempts hang now and then
(``hang_prob``: cut off at ``--hb-timeout`` and retried), or, in some graphs, one doomed
member (``crash.doomed``: its first attempt fails, its only one), or a spawner
(``crash.fan``: it completes by spawning 1 to 20 jobs, ``sqlq.spawn``). A quarter of a
client's later submissions add a job to one of its graphs (``workflow: <id>``) after one
to three of its members, whatever they are by then: running, finished or dead (a 409
then: refused). Every acknowledged graph and added job goes to the client's ledger
(fsynced) with each member's id, parents and role. SIGKILL at a random moment; a
restart on the same data; the queue drained; a clean stop; the files read without the
engine's code (``sqlq.bench.offline``) and held by ``judge_graphs`` to:

- every member is there, and none is left live (a waiting one behind finished parents
  is a release that never happened);
- a member with a parent that ended dead or cancelled is cancelled ``upstream_dead``
  (the cone is exactly the doomed member's descendants); every other member completed,
  but a doomed one, which is dead;
- a completed member's last attempt started after each parent's completion;
- a spawner that completed has exactly its spawned jobs, each after it and completed;
  one that did not complete has none;
- walq's log (it keeps every step) shows each member released from waiting at most once.

Then a third life: every graph with a doomed member is retried (``POST
/workflows/{id}/retry``) and drained, and the files must show every member of those
graphs (added and spawned ones too) completed, each after its parents.

On PostgreSQL (``run_pg_trial``) two nodes share a fresh database, each with its own
clients and ledger; one node is killed at a random moment and started again while the
other runs on, so outcomes, releases, spawns and appends race across nodes and through a
node's death (its attempts rescued when their leases run out). The rows are read in
plain SQL (``offline_pg.read_pg``) and judged by the same rules, before and after the
retries.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import uvloop

from sqlq.bench.client.http import HTTPError, HttpPool
from sqlq.bench.client.loadgen import wait_drained
from sqlq.bench.client.server import FAST_RETRY_FLAGS, ServerProcess
from sqlq.bench.crashload import SERVER_FLAGS
from sqlq.bench.crashload_pg import node, start_all, stop_all
from sqlq.bench.crashtasks import SPAWNED
from sqlq.bench.offline import JobFacts, VerifyError, read_data
from sqlq.bench.offline_pg import read_pg, sql

CLIENTS = 4
APPENDS = 0.25  # of a client's submissions after its first: a job added to one of its graphs
DOOMED = 0.3  # of the graphs: one member's only attempt fails (its cone is cancelled)
SPAWNERS = 0.02  # of a graph's other members: a handler that spawns as it completes
MAX_SPAWN = 20
HANG = 0.005  # of a plain member's attempts: a hang, cut off at --hb-timeout and retried
FLAGS = ("--workers", "16", "--fault-injection", *FAST_RETRY_FLAGS, *SERVER_FLAGS)
LEDGER = "graphs.jsonl"
SHAPES = {"chain": 4, "diamond": 4, "fan": 1, "dag": 1}  # each one's weight
LARGEST = 2000  # members of the largest shape (the DAG; the fan has 1,002)


class Member(NamedTuple):
    ref: str
    parents: list[int]  # by index in its graph
    doomed: bool = False
    spawns: int = 0  # the jobs its handler spawns as it completes (0: a plain member)


def graph(rng: random.Random) -> list[Member]:
    """One of the shapes: a chain of 100, a diamond, 1 -> 1,000 -> 1, a random DAG of
    2,000; in ``DOOMED`` of them one member doomed, and a few spawners."""
    shape = rng.choices(list(SHAPES), weights=list(SHAPES.values()))[0]
    if shape == "chain":
        members = [Member(f"c{i}", [i - 1] if i else []) for i in range(100)]
    elif shape == "diamond":
        members = [Member("a", []), Member("b", [0]), Member("c", [0]), Member("d", [1, 2])]
    elif shape == "fan":
        members = [Member("root", []), *(Member(f"m{i}", [0]) for i in range(1000))]
        members.append(Member("last", list(range(1, 1001))))
    else:
        members = []
        for i in range(LARGEST):
            earlier = rng.sample(range(max(0, i - 50), i), min(i, rng.randint(0, 3)))
            members.append(Member(f"n{i}", sorted(earlier)))
    members = [m._replace(spawns=rng.randint(1, MAX_SPAWN)) if rng.random() < SPAWNERS else m
               for m in members]  # fmt: skip
    if rng.random() < DOOMED:  # one member dies: its cone must be cancelled
        doomed = rng.randrange(len(members))
        members[doomed] = members[doomed]._replace(doomed=True, spawns=0)
    return members


def body(members: list[Member], rng: random.Random) -> bytes:
    jobs = []
    for m in members:
        job: dict[str, Any] = {"ref": m.ref, "depends_on": [members[p].ref for p in m.parents]}
        if m.doomed:  # its only attempt fails; a retry of its workflow gets past it
            job.update(kind="crash.doomed", args={"fail_first": 1}, max_attempts=1)
        elif m.spawns:
            job.update(kind="crash.fan", args={"n": m.spawns}, max_attempts=5)
        else:
            job.update(kind="sleep", max_attempts=5,
                       args={"work_ms": rng.choice((0, 1, 2, 5)), "hang_prob": HANG})  # fmt: skip
        jobs.append(job)
    return msgspec.json.encode({"workflow": True, "jobs": jobs})


async def load(url: str, seed: int, ledger: Path, stop: asyncio.Event) -> None:
    """Submit graphs until stopped; each acknowledged one to the ledger, fsynced."""
    rng = random.Random(seed)
    fd = os.open(ledger, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    loop = asyncio.get_running_loop()

    def append(line: bytes) -> None:
        os.write(fd, line)
        os.fsync(fd)

    async def client(pool: HttpPool) -> None:
        sent: list[dict[str, Any]] = []  # this client's graphs acknowledged
        while not stop.is_set():
            appending = bool(sent) and rng.random() < APPENDS
            if appending:  # a job added to a graph of its own, after some of its members
                to = rng.choice(sent)  # (running, finished or failed: whatever they are now)
                after = rng.sample(to["ids"], min(len(to["ids"]), rng.randint(1, 3)))
                jobs = [{"kind": "sleep", "args": {"work_ms": 1}, "depends_on": after}]
                request = msgspec.json.encode({"workflow": to["workflow_id"], "jobs": jobs})
            else:
                members = graph(rng)
                request = body(members, rng)
            try:
                status, reply = await pool.json("POST", "/jobs/batch", request)
            except (HTTPError, OSError):
                return  # the server is gone
            if status == 409 and appending:
                continue  # after a parent that failed: refused, as it should be
            if status != 201:
                return
            ids: list[str] = reply["ids"]
            if appending:
                parents, doomed, spawns = [after], [False], [0]
            else:
                parents = [[ids[i] for i in m.parents] for m in members]
                doomed = [m.doomed for m in members]
                spawns = [m.spawns for m in members]
            entry = {"workflow_id": reply["workflow_id"], "ids": ids, "parents": parents,
                     "doomed": doomed, "spawns": spawns, "appended": appending}  # fmt: skip
            if not appending:
                sent.append(entry)
            await loop.run_in_executor(None, append, json.dumps(entry).encode() + b"\n")

    try:
        async with HttpPool(url, CLIENTS) as pool:
            await asyncio.gather(*(client(pool) for _ in range(CLIENTS)))
    finally:
        os.close(fd)


def read_ledger(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")
    return [json.loads(x) for x in lines[:-1] if x]  # (a torn last line was never acked)


BAD = "?"  # where ``spawned_by`` puts a spawned job whose ref or workflow is not its spawner's


def spawned_by(jobs: dict[str, JobFacts]) -> dict[str, list[str]]:
    """Each job's spawned jobs, by its id: those whose ref ``crash.fan`` made, and whose
    one parent is it (a client's job added at the kill, never acknowledged, is not)."""
    made: dict[str, list[str]] = {}
    for job_id, facts in jobs.items():
        flow = facts.flow or {}
        parents: list[str] = flow.get("parents") or []
        ref: str = flow.get("ref") or ""
        if ref.startswith(SPAWNED) and len(parents) == 1:
            made.setdefault(parents[0], []).append(job_id)
            spawner = jobs.get(parents[0])  # its ref names its spawner, in its workflow
            if not ref.startswith(f"{SPAWNED}{parents[0]}.") or (
                spawner is not None
                and (spawner.flow or {}).get("workflow_id") != flow.get("workflow_id")
            ):
                made.setdefault(BAD, []).append(job_id)
    return made


def judge_graphs(
    graphs: list[dict[str, Any]], jobs: dict[str, JobFacts], releases: bool
) -> tuple[list[str], dict[str, int]]:
    """The problems found in the acknowledged ``graphs`` (``jobs``: the files' facts;
    ``releases``: they hold each job's every step, so a second release shows), and what
    was seen."""
    problems: list[str] = []
    seen = {"members": 0, "completed": 0, "dead": 0, "cancelled": 0, "released": 0,
            "spawned": 0}  # fmt: skip
    made = spawned_by(jobs)

    def problem(text: str) -> None:
        if len(problems) < 20:
            problems.append(text)

    for job_id in made.get(BAD, ()):
        problem(f"spawned job {job_id} is not in its spawner's workflow, or names another")

    def after(job_id: str, facts: JobFacts, parents: list[JobFacts]) -> None:
        """A completed job's last attempt started after each parent's completion."""
        if parents and facts.started_at is not None:
            last = max(p.updated_at for p in parents)
            if facts.started_at < last:
                problem(f"member {job_id} started at {facts.started_at} before its "
                        f"parent completed at {last}")  # fmt: skip

    for g in graphs:
        ids: list[str] = g["ids"]
        spawns: list[int] = g.get("spawns") or [0] * len(ids)
        for i, job_id in enumerate(ids):  # (each member's parents by id: its graph's, or,
            # an added job's, members of the graph it was added to)
            seen["members"] += 1
            facts = jobs.get(job_id)
            if facts is None:
                problem(f"member {job_id} of {g['workflow_id']} is missing")
                continue
            seen[facts.state] = seen.get(facts.state, 0) + 1
            parents = [jobs.get(p) for p in g["parents"][i]]
            if any(p is None for p in parents):
                continue  # (reported as missing above)
            kept = [p for p in parents if p is not None]
            failed = [p for p in kept if p.state in ("dead", "cancelled")]
            reason = (facts.flow or {}).get("cancel_reason")
            if facts.state in ("waiting", "scheduled", "running"):
                problem(f"member {job_id} is still {facts.state} after the drain")
            elif failed:
                if (facts.state, reason) != ("cancelled", "upstream_dead"):
                    problem(f"member {job_id} after a failed parent ended {facts.state} "
                            f"({reason}), not cancelled upstream_dead")  # fmt: skip
            elif g["doomed"][i]:
                if facts.state != "dead":
                    problem(f"doomed member {job_id} ended {facts.state}")
            elif facts.state != "completed":
                problem(f"member {job_id} ended {facts.state} though its parents completed")
            else:
                after(job_id, facts, kept)
            children = made.get(job_id, [])
            if facts.state == "completed" and len(children) != spawns[i]:
                problem(f"member {job_id} completed with {len(children)} spawned jobs, "
                        f"not {spawns[i]}")  # fmt: skip
            elif facts.state != "completed" and children:
                problem(f"member {job_id} ended {facts.state} with {len(children)} spawned jobs")
            for child in children:
                seen["spawned"] += 1
                spawned = jobs[child]
                if spawned.state != "completed":
                    problem(f"job {child} spawned by {job_id} ended {spawned.state}")
                else:
                    after(child, spawned, [facts])
            if releases:
                moves = [b for a, b in zip(facts.history, facts.history[1:], strict=False)
                         if a[0] == "waiting" and b[0] == "scheduled"]  # fmt: skip
                seen["released"] += len(moves)
                if len(moves) > 1:
                    problem(f"member {job_id} was released {len(moves)} times")
    return problems, seen


def to_retry(graphs: list[dict[str, Any]]) -> list[str]:
    """The workflows the third life retries: each with a doomed member."""
    return [g["workflow_id"] for g in graphs if any(g["doomed"])]


async def retried(url: str, workflows: list[str]) -> list[str]:
    """Retry each workflow (``POST /workflows/{id}/retry``), then wait until each is over
    (``GET /workflows/{id}``: read from the store, so on PostgreSQL too, where ``/stats``
    counts a census a second old); the problems met."""
    problems = []
    async with HttpPool(url, 1) as pool:
        for workflow_id in workflows:
            status, reply = await pool.json("POST", f"/workflows/{workflow_id}/retry")
            if status != 200 or not reply.get("retried"):
                problems.append(f"the retry of {workflow_id} answered {status}: {reply}")
        deadline = time.monotonic() + DRAIN_S
        for workflow_id in workflows:
            while True:
                status, view = await pool.json("GET", f"/workflows/{workflow_id}")
                if status == 200 and view["state"] != "running":
                    break
                if time.monotonic() > deadline:
                    problems.append(f"workflow {workflow_id} still running {DRAIN_S:g} s "
                                    "after its retry")  # fmt: skip
                    break
                await asyncio.sleep(0.05)
    return problems


def judge_retried(
    graphs: list[dict[str, Any]], jobs: dict[str, JobFacts], workflows: list[str]
) -> list[str]:
    """The retried ``workflows`` (their added jobs too) drained to completed: each member,
    the doomed one at last, after its parents, and every spawner with its spawned jobs."""
    again = set(workflows)
    whole = [{**g, "doomed": [False] * len(g["ids"])} for g in graphs
             if g["workflow_id"] in again]  # fmt: skip
    found, _ = judge_graphs(whole, jobs, releases=False)
    return [f"after the retry: {p}" for p in found]


def run_trial(
    store: str, sync: str, kill_after_s: float, seed: int, workdir: Path
) -> dict[str, Any]:
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    ledger = workdir / LEDGER
    lives = [ServerProcess.engine(store=store, data_dir=str(data), sync=sync, flags=FLAGS)
             for _ in range(3)]  # fmt: skip
    srv, again, third = lives
    problems: list[str] = []
    jobs: dict[str, JobFacts] = {}
    try:
        srv.start()

        async def first_life() -> None:
            stop = asyncio.Event()

            def kill() -> None:
                srv.kill()
                stop.set()

            asyncio.get_running_loop().call_later(kill_after_s, kill)
            await load(srv.url, seed, ledger, stop)

        uvloop.run(first_life())
        srv.kill()
        again.start()

        async def drain() -> dict[str, Any]:
            async with HttpPool(again.url, 1) as pool:
                return await wait_drained(pool)

        recovery = uvloop.run(drain())
        again.stop(signal.SIGTERM)
        graphs = read_ledger(ledger)
        try:
            jobs = read_data(store, data)
        except (VerifyError, ValueError, KeyError) as exc:
            problems.append(f"unreadable store: {exc}")
        row = verdict(graphs, jobs, store == "walq", problems)
        workflows = to_retry(graphs)
        third.start()
        problems = uvloop.run(retried(third.url, workflows))
        third.stop(signal.SIGTERM)
        try:
            problems += judge_retried(graphs, read_data(store, data), workflows)
        except (VerifyError, ValueError, KeyError) as exc:
            problems.append(f"unreadable store after the retries: {exc}")
    finally:  # a trial that fails midway leaves no server behind it
        for life in lives:
            life.stop()
    return {
        "store": store,
        "sync": sync,
        "workload": "workflows",
        "kill_after_s": round(kill_after_s, 3),
        **row,
        "retried": len(workflows),
        "problems": row["problems"] + problems,
        "ok": row["ok"] and not problems,
        "recovery": recovery,
        "at": time.time(),
    }


def verdict(
    graphs: list[dict[str, Any]], jobs: dict[str, JobFacts], releases: bool, problems: list[str]
) -> dict[str, Any]:
    """A trial's verdict on what its ledgers acknowledged (``judge_graphs``), with the
    ``problems`` found on the way: the row's counts, its problems, and whether it passed."""
    found, seen = judge_graphs(graphs, jobs, releases)
    problems = problems + found + ([] if graphs else ["no graph was acknowledged"])
    acked = {i for g in graphs for i in g["ids"]}
    made = {c for children in spawned_by(jobs).values() for c in children}
    unknown = sum(1 for i, j in jobs.items()
                  if i not in acked and i not in made and j.flow is not None)  # fmt: skip
    if unknown > CLIENTS * LARGEST:  # a batch per client of the killed server in flight
        problems.append(f"{unknown} members never acknowledged")
    return {
        "graphs": sum(1 for g in graphs if not g.get("appended")),
        "appended": sum(1 for g in graphs if g.get("appended")),
        "acknowledged": seen["members"],
        "lost": sum(1 for i in acked if i not in jobs),
        "unknown": unknown,
        "ended": {k: v for k, v in seen.items() if k not in ("members", "released", "spawned")},
        "spawned": seen["spawned"],
        "releases_seen": seen["released"],  # (0 unless ``releases``: rows keep no history)
        "problems": problems,
        "ok": not problems,
    }


def kill_after(rng: random.Random) -> float:
    return rng.uniform(0.3, 2.0)


PG_NODES = 2
PG_LEASE_S = 2.0  # short: the killed node's attempts are rescued within the trial
DRAIN_S = 120.0


async def run_pg_trial(dsn: str, kill_after_s: float, victim: int, seed: int, workdir: Path
                       ) -> dict[str, Any]:  # fmt: skip
    """Two nodes on the database ``dsn``, each with ``CLIENTS`` clients submitting graphs
    (a ledger each); the node ``victim`` killed after ``kill_after_s`` and started again
    while the other runs on; then drained and judged from the rows."""
    nodes = [node(dsn, PG_LEASE_S, workdir, i) for i in range(PG_NODES)]
    started = list(nodes)  # every node spawned, so that a failure stops them all
    ledgers = [workdir / f"graphs-{i}.jsonl" for i in range(PG_NODES)]
    problems: list[str] = []
    try:
        await start_all(nodes)
        stops = [asyncio.Event() for _ in nodes]
        loads = [asyncio.create_task(load(n.url, seed + i, ledgers[i], stops[i]))
                 for i, n in enumerate(nodes)]  # fmt: skip
        await asyncio.sleep(kill_after_s)
        nodes[victim].kill()
        stops[victim].set()
        again = node(dsn, PG_LEASE_S, workdir, PG_NODES + 1)
        started.append(again)
        again.spawn()
        await asyncio.to_thread(again.wait_ready)
        nodes[victim] = again
        await asyncio.sleep(0.5)  # the survivor's clients run on beside the restart
        for stop in stops:
            stop.set()
        await asyncio.gather(*loads)
        began = time.monotonic()
        while True:  # drained: nothing due or running, read in plain SQL
            [row] = await sql(dsn, "SELECT count(*) FROM jobs WHERE state IN "
                              "('scheduled', 'running')")  # fmt: skip
            if row[0] == 0:
                break
            if time.monotonic() - began > DRAIN_S:
                problems.append(f"{row[0]} jobs still due or running after {DRAIN_S:g} s")
                break
            await asyncio.sleep(0.05)
        drained_s = time.monotonic() - began
        graphs = [g for path in ledgers for g in read_ledger(path)]
        row = verdict(graphs, await read_pg(dsn), False, problems)
        workflows = to_retry(graphs)
        problems = await retried(nodes[victim].url, workflows)  # (through the restarted one)
        problems += judge_retried(graphs, await read_pg(dsn), workflows)
        await stop_all(nodes, signal.SIGTERM)
    finally:
        await stop_all(started)
    return {
        "store": "postgres",
        "sync": "full",
        "workload": "workflows",
        "nodes": PG_NODES,
        "kill_after_s": round(kill_after_s, 3),
        **row,
        "retried": len(workflows),
        "problems": row["problems"] + problems,
        "ok": row["ok"] and not problems,
        "recovery": {"drained_s": round(drained_s, 3)},
        "at": time.time(),
    }
