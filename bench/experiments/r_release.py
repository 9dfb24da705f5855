"""R. Release latency: from a parent's completion to its child's start, and what edges cost
(issue 36).

On each engine, a fresh ``sqlq serve`` (16 workers, ``--sync full``) runs three graphs of
no-op ``sleep`` jobs, one after another, each submitted in one batch as a workflow:

- a chain of ``CHAIN`` jobs: each hop is a parent's completion commit releasing its child,
  the child claimed and started;
- a fan-out, 1 -> ``FAN``: the root's one commit releases them all;
- a fan-in, ``FAN`` -> 1: the last parent's commit releases the child.

Once it is done, every member is read back (``GET /workflows/{id}``, then each job): an
edge's latency is the child's start less its parent's completion, both the server's own
clock (``started_at``, ``updated_at``); a child waits for its last parent. The fan-out's
includes the wait for one of the 16 workers, so it is reported apart (p50 and max).

What edges cost: the same ``FAN`` + 1 jobs submitted as a plain batch and as the fan-out's
workflow (``FAN`` edges), each timed from the request to its answer (durable), and each
drained; the ratio is the workflow's time over the plain batch's, measured in the same run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from sqlq.bench.client.http import HttpPool
from sqlq.bench.experiments import r_peers
from sqlq.bench.experiments.base import Run, ServedRun, by_store
from sqlq.bench.experiments.rows import CodedRow
from sqlq.bench.report import Report, cell, group, med

NAME = "R"
CHAIN, FAN = 100, 1000
QUICK_CHAIN, QUICK_FAN = 20, 100
STORES = ("memory", "walq", "sqlite")  # (PostgreSQL: a cluster of its own; not yet here)
PEER_STORES = ("walq", "sqlite")  # sqlq's durable engines beside the peers


class RRow(CodedRow, kw_only=True):
    part: str = "release"  # or "peers" (``r_peers``: the same graphs on sqlq and its peers)
    chain: int = 0
    fan: int = 0
    chain_hop_ms: list[float] = msgspec.field(default_factory=list)  # each hop, ms
    fan_in_ms: float = 0.0  # the fan-in child's start after its last parent completed, ms
    fan_out_p50_ms: float = 0.0  # the fan-out's children, from the root's completion
    fan_out_max_ms: float = 0.0
    plain_submit_ms: float = 0.0  # FAN + 1 jobs as one plain batch, request to durable answer
    flow_submit_ms: float = 0.0  # the same as the fan-out's workflow
    plain_drain_s: float = 0.0
    flow_drain_s: float = 0.0
    # part "peers": one system's graphs, clean or through a kill -9 (``r_peers``)
    mode: str = ""
    system: str = ""
    version: str = ""
    durability: str = ""
    graphs: int = 0
    steps: int = 0
    stuck: int = 0  # graphs whose last step never ended
    early: int = 0  # steps started before a parent had ended
    doubled: int = 0  # steps that ended more than once
    hop_ms_p50: float | None = None  # a chain's parent end -> child start, by the marks
    fan_in_ms_p50: float | None = None
    waited_s: float = 0.0
    concurrency: int = 0
    in_flight_at_kill: int = 0  # steps started and not ended at the kill (by the marks)
    unexplained: int = 0  # steps started again before the kill, or with none

    @property
    def hop_p50_ms(self) -> float:
        return med(self.chain_hop_ms)

    @property
    def hop_p95_ms(self) -> float:
        hops = sorted(self.chain_hop_ms)
        return hops[min(len(hops) - 1, int(0.95 * len(hops)))] if hops else 0.0


ROW = RRow


def _job(ref: str, after: list[str]) -> dict[str, Any]:
    return {"kind": "sleep", "args": {"work_ms": 0}, "ref": ref, "depends_on": after}


async def _drained(pool: HttpPool, ids: list[str]) -> None:
    """Until every job of ``ids`` is finished (each waited for in turn: the same reads
    whatever made the jobs)."""
    for job_id in ids:
        while True:
            status, job = await pool.json("GET", f"/jobs/{job_id}?wait=30")
            if status == 200 and job["state"] in ("completed", "dead", "cancelled"):
                break


async def _members(pool: HttpPool, ids: list[str]) -> dict[str, dict[str, Any]]:
    out = {}
    for job_id in ids:
        status, job = await pool.json("GET", f"/jobs/{job_id}")
        assert status == 200, job
        out[job_id] = job
    return out


async def _graph(pool: HttpPool, jobs: list[dict[str, Any]]) -> tuple[list[str], float, float]:
    """Submit ``jobs`` as a workflow and drain it: the ids, the submit's and the run's time."""
    t0 = time.perf_counter()
    status, answer = await pool.json(
        "POST", "/jobs/batch", msgspec.json.encode({"workflow": True, "jobs": jobs})
    )
    submitted = time.perf_counter()
    if status != 201:
        raise RuntimeError(f"a workflow's submit answered {status}: {answer}")
    ids: list[str] = answer["ids"]
    await _drained(pool, ids)
    return ids, submitted - t0, time.perf_counter() - submitted


def _since(child: dict[str, Any], parents: list[dict[str, Any]]) -> float:
    return 1000 * (float(child["started_at"]) - max(float(p["updated_at"]) for p in parents))


@dataclass(frozen=True, kw_only=True)
class ReleaseRun(ServedRun):
    chain: int
    fan: int

    async def measure(self, url: str) -> dict[str, Any]:
        async with HttpPool(url, 2) as pool:
            chain = [_job(f"c{i}", [f"c{i - 1}"] if i else []) for i in range(self.chain)]
            ids, _, _ = await _graph(pool, chain)
            jobs = await _members(pool, ids)
            hops = [_since(jobs[ids[i]], [jobs[ids[i - 1]]]) for i in range(1, len(ids))]
            fan_in = [_job(f"p{i}", []) for i in range(self.fan)]
            fan_in.append(_job("last", [f"p{i}" for i in range(self.fan)]))
            ids, _, _ = await _graph(pool, fan_in)
            last = (await _members(pool, [ids[-1]]))[ids[-1]]
            parents = list((await _members(pool, ids[:-1])).values())
            fan_out = [_job("root", []), *(_job(f"k{i}", ["root"]) for i in range(self.fan))]
            ids, flow_submit, flow_drain = await _graph(pool, fan_out)
            jobs = await _members(pool, ids)
            root = jobs[ids[0]]
            out = sorted(_since(jobs[i], [root]) for i in ids[1:])
            plain = [{"kind": "sleep", "args": {"work_ms": 0}} for _ in range(self.fan + 1)]
            t0 = time.perf_counter()
            status, answer = await pool.json(
                "POST", "/jobs/batch", msgspec.json.encode({"jobs": plain})
            )
            submitted = time.perf_counter()
            assert status == 201, answer
            await _drained(pool, answer["ids"])
            plain_drain = time.perf_counter() - submitted
        return {
            "chain": self.chain, "fan": self.fan,
            "chain_hop_ms": [round(h, 3) for h in hops],
            "fan_in_ms": round(_since(last, parents), 3),
            "fan_out_p50_ms": round(out[len(out) // 2], 3), "fan_out_max_ms": round(out[-1], 3),
            "plain_submit_ms": round(1000 * (submitted - t0), 3),
            "flow_submit_ms": round(1000 * flow_submit, 3),
            "plain_drain_s": round(plain_drain, 4), "flow_drain_s": round(flow_drain, 4),
        }  # fmt: skip


def runs(quick: bool, stores: tuple[str, ...]) -> Iterator[Run]:
    chain, fan = (QUICK_CHAIN, QUICK_FAN) if quick else (CHAIN, FAN)
    for store in stores:
        if store in STORES:
            yield ReleaseRun(experiment=NAME, store=store, label=f"R/{store}", chain=chain,
                             fan=fan, params={"chain": chain, "fan": fan})  # fmt: skip
    yield from r_peers.runs(quick, tuple(s for s in stores if s in PEER_STORES), NAME)


def section(rep: Report) -> None:
    every, codes = rep.before_after(NAME, RRow)
    latest = [r for r in every if r.code == codes[-1]] if every else []
    _release(rep, [r for r in latest if r.part == "release"])
    _peers(rep, [r for r in latest if r.part == "peers"])


def _peers(rep: Report, rows: list[RRow]) -> None:
    if not rows:
        return
    first = rows[0]
    rep.add(
        "### R's peers: the same graphs on Celery's chords and RQ's `depends_on`",
        "",
        f"One run, each system in turn: {first.graphs // 2} chains of {first.params['chain']} "
        f"steps and {first.graphs // 2} fans 1 -> {first.params['fan']} -> 1, every step 2 ms "
        "of work marking its start and end in a file (`sqlq.bench.flowmarks`), "
        f"{first.concurrency} at once. sqlq: each graph a workflow, `--sync full`. The peers: "
        "a fresh `redis-server` with `appendonly yes` and `appendfsync always`, Celery 5.7 "
        "(a chain; the fan's root chained into a `chord`; a Redis result backend; default "
        "early acks, and `acks_late` with `reject_on_worker_lost`), RQ 3.0 (`depends_on`; "
        "`rq worker-pool`). `kill`: once 30 % of the steps have ended (the same point for "
        "every system, by the marks), what runs the steps is killed -9 and started again "
        "(sqlq's server, its queue and workers in one process; the peer's worker and its "
        "pool, Redis running on; Celery's visibility timeout set to 10 s so that a message "
        f"taken and not acknowledged comes back within the wait); then the run waits until "
        f"no step has ended for {r_peers.STALL_S:g} s. Stuck: graphs whose last step never "
        "ran to its end; early: steps started before a parent had ended; doubled: steps "
        "that ended twice (after a kill, at-least-once delivery's rerun of a step whose end "
        "was not recorded; in a clean run, a callback fired twice). Hop and fan-in: a "
        "child's first start less its (last) parent's first end, by the marks; medians "
        "over the repeats.",
        "",
        "| system | mode | graphs | stuck | early | doubled | in flight at the kill | "
        "hop p50 ms | fan-in p50 ms | durability |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    )
    by = group(rows, lambda r: (r.system, r.mode))
    for (system, mode), rs in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        hops = [r.hop_ms_p50 for r in rs if r.hop_ms_p50 is not None]
        fans = [r.fan_in_ms_p50 for r in rs if r.fan_in_ms_p50 is not None]
        name = f"{system} {rs[0].version}".strip()
        rep.add(
            f"| {name} | {mode} | {sum(r.graphs for r in rs)} | {sum(r.stuck for r in rs)} | "
            f"{sum(r.early for r in rs)} | {sum(r.doubled for r in rs)} | "
            f"{sum(r.in_flight_at_kill for r in rs) if mode == 'kill' else '-'} | "
            f"{cell(hops, '{:.2f}') if hops else '-'} | "
            f"{cell(fans, '{:.2f}') if fans else '-'} | {rs[0].durability} |"
        )
    rep.add("")


def _release(rep: Report, rows: list[RRow]) -> None:
    if not rows:
        return
    first = rows[0]
    rep.add(
        "## R. Release latency: a parent's completion to its child's start",
        "",
        f"A fresh server per engine (16 workers, `--sync full`), no-op jobs. Chain: "
        f"{first.chain} jobs, each hop a child's start less its parent's completion (the "
        f"server's clock, read back from each job); fan-in: {first.fan} -> 1, the child's start "
        f"less its last parent's completion; fan-out: 1 -> {first.fan}, each child's start "
        "less the root's completion, which includes waiting for one of the 16 workers. What "
        f"edges cost: {first.fan + 1} jobs submitted as a plain batch and as the fan-out's "
        f"workflow ({first.fan} edges), request to durable answer, and each drained. Medians "
        "over the repeats.",
        "",
        "| store | chain hop p50 ms | chain hop p95 ms | fan-in ms | fan-out p50 / max ms | "
        "submit: plain / workflow ms | drain: plain / workflow s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    )
    stores = by_store(rows)
    for store, rs in stores.items():
        rep.add(
            f"| {store} | {cell([r.hop_p50_ms for r in rs], '{:.2f}')} | "
            f"{cell([r.hop_p95_ms for r in rs], '{:.2f}')} | "
            f"{cell([r.fan_in_ms for r in rs], '{:.2f}')} | "
            f"{cell([r.fan_out_p50_ms for r in rs], '{:.1f}')} / "
            f"{cell([r.fan_out_max_ms for r in rs], '{:.1f}')} | "
            f"{cell([r.plain_submit_ms for r in rs], '{:.1f}')} / "
            f"{cell([r.flow_submit_ms for r in rs], '{:.1f}')} | "
            f"{cell([r.plain_drain_s for r in rs], '{:.3f}')} / "
            f"{cell([r.flow_drain_s for r in rs], '{:.3f}')} |"
        )
    rep.add("")
