"""Workflows through kill -9: each child after its parents, released once, the cone of a
dead member cancelled (``sqlq crashcheck --workload workflows``).

Each trial: a fresh data directory; ``sqlq serve``; clients submit graphs as workflows
(``POST /jobs/batch`` with ``workflow: true``): chains, diamonds, fan-out and fan-in
(1 -> 40 -> 1), and random DAGs, each member a short ``sleep`` job; in some graphs one
member is doomed (``fail_prob`` 1, ``max_attempts`` 1), so its cone must end cancelled.
A quarter of a client's later submissions add a job to one of its graphs
(``workflow: <id>``) after one to three of its members, whatever they are by then:
running, finished or dead (a 409 then: refused). Every acknowledged graph and added job
goes to the client's ledger (fsynced) with each member's id, parents and fate. SIGKILL at
a random moment; a restart on the same data; the queue drained; a clean stop. Then the
files are read without the engine's code (``sqlq.bench.offline``), and ``judge_graphs``
holds each acknowledged graph to:

- every member is there, and none is left live (a waiting one behind finished parents
  is a release that never happened);
- a member with a parent that ended dead or cancelled is cancelled ``upstream_dead``
  (the cone is exactly the doomed member's descendants); every other member completed,
  but a doomed one, which is dead;
- a completed member's last attempt started after each parent's completion;
- walq's log (it keeps every step) shows each member released from waiting at most once.

On PostgreSQL (``run_pg_trial``) two nodes share a fresh database, each with its own
clients and ledger; one node is killed at a random moment and started again while the
other runs on, so outcomes, releases and appends race across nodes and through a node's
death (its attempts rescued when their leases run out). The rows are then read in plain
SQL (``offline_pg.read_pg``) and judged by the same rules.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import msgspec
import uvloop

from sqlq.bench.client.http import HTTPError, HttpPool
from sqlq.bench.client.loadgen import wait_drained
from sqlq.bench.client.server import ServerProcess
from sqlq.bench.crashload_pg import node, start_all
from sqlq.bench.offline import JobFacts, VerifyError, read_data
from sqlq.bench.offline_pg import read_pg, sql

CLIENTS = 4
APPENDS = 0.25  # of a client's submissions after its first: a job added to one of its graphs
FLAGS = ("--workers", "16", "--fault-injection")
LEDGER = "graphs.jsonl"

Graph = list[tuple[str, list[int], bool]]  # each member: its ref, its parents, doomed


def graph(rng: random.Random) -> Graph:
    """One of the shapes, as (ref, parents by index, doomed) per member."""
    shape = rng.choice(("chain", "diamond", "fan", "dag"))
    if shape == "chain":
        members = [(f"c{i}", [i - 1] if i else [], False) for i in range(20)]
    elif shape == "diamond":
        members = [("a", [], False), ("b", [0], False), ("c", [0], False), ("d", [1, 2], False)]
    elif shape == "fan":
        members = [("root", [], False), *((f"m{i}", [0], False) for i in range(40))]
        members.append(("last", list(range(1, 41)), False))
    else:
        members = []
        for i in range(60):
            earlier = rng.sample(range(i), min(i, rng.randint(0, 3)))
            members.append((f"n{i}", sorted(earlier), False))
    if rng.random() < 0.3:  # one member dies: its cone must be cancelled
        doomed = rng.randrange(len(members))
        ref, parents, _ = members[doomed]
        members[doomed] = (ref, parents, True)
    return members


def body(members: Graph, rng: random.Random) -> bytes:
    jobs = []
    for ref, parents, doomed in members:
        job: dict[str, Any] = {
            "kind": "sleep", "ref": ref, "depends_on": [members[p][0] for p in parents],
            "args": {"work_ms": rng.choice((0, 1, 2, 5))},
        }  # fmt: skip
        if doomed:
            job["args"]["fail_prob"] = 1
            job["max_attempts"] = 1
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
                parents, doomed = [after], [False]
            else:
                parents = [[ids[i] for i in p] for _, p, _ in members]
                doomed = [d for _, _, d in members]
            entry = {"workflow_id": reply["workflow_id"], "ids": ids, "parents": parents,
                     "doomed": doomed, "appended": appending}  # fmt: skip
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


def judge_graphs(
    graphs: list[dict[str, Any]], jobs: dict[str, JobFacts], releases: bool
) -> tuple[list[str], dict[str, int]]:
    """The problems found in the acknowledged ``graphs`` (``jobs``: the files' facts;
    ``releases``: they hold each job's every step, so a second release shows), and what
    was seen."""
    problems: list[str] = []
    seen = {"members": 0, "completed": 0, "dead": 0, "cancelled": 0, "released": 0}

    def problem(text: str) -> None:
        if len(problems) < 20:
            problems.append(text)

    for g in graphs:
        ids: list[str] = g["ids"]
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
            failed = [p for p in parents if p is not None and p.state in ("dead", "cancelled")]
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
            elif parents and facts.started_at is not None:
                last = max(p.updated_at for p in parents if p is not None)
                if facts.started_at < last:
                    problem(f"member {job_id} started at {facts.started_at} before its "
                            f"parent completed at {last}")  # fmt: skip
            if releases:
                moves = [b for a, b in zip(facts.history, facts.history[1:], strict=False)
                         if a[0] == "waiting" and b[0] == "scheduled"]  # fmt: skip
                seen["released"] += len(moves)
                if len(moves) > 1:
                    problem(f"member {job_id} was released {len(moves)} times")
    return problems, seen


def run_trial(
    store: str, sync: str, kill_after_s: float, seed: int, workdir: Path
) -> dict[str, Any]:
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    ledger = workdir / LEDGER
    srv = ServerProcess.engine(store=store, data_dir=str(data), sync=sync, flags=FLAGS)
    again = ServerProcess.engine(store=store, data_dir=str(data), sync=sync, flags=FLAGS)
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
    finally:  # a trial that fails midway leaves no server behind it
        srv.stop()
        again.stop()
    graphs = read_ledger(ledger)
    problems: list[str] = []
    jobs: dict[str, JobFacts] = {}
    try:
        jobs = read_data(store, data)
    except (VerifyError, ValueError, KeyError) as exc:
        problems.append(f"unreadable store: {exc}")
    return {
        "store": store,
        "sync": sync,
        "workload": "workflows",
        "kill_after_s": round(kill_after_s, 3),
        **verdict(graphs, jobs, store == "walq", problems),
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
    unknown = sum(1 for i, j in jobs.items() if i not in acked and j.flow is not None)
    if unknown > CLIENTS * 61:  # a batch per client of the killed server in flight, at most
        problems.append(f"{unknown} members never acknowledged")
    return {
        "graphs": sum(1 for g in graphs if not g.get("appended")),
        "appended": sum(1 for g in graphs if g.get("appended")),
        "acknowledged": seen["members"],
        "lost": sum(1 for i in acked if i not in jobs),
        "unknown": unknown,
        "ended": {k: v for k, v in seen.items() if k not in ("members", "released")},
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
        for n in nodes:
            await asyncio.to_thread(n.stop, signal.SIGTERM)
        jobs = await read_pg(dsn)
    finally:
        for n in started:
            await asyncio.to_thread(n.stop)
    graphs = [g for path in ledgers for g in read_ledger(path)]
    return {
        "store": "postgres",
        "sync": "full",
        "workload": "workflows",
        "nodes": PG_NODES,
        "kill_after_s": round(kill_after_s, 3),
        **verdict(graphs, jobs, False, problems),
        "recovery": {"drained_s": round(drained_s, 3)},
        "at": time.time(),
    }
