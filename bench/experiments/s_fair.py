"""S. Fair claims by key: a key's rate, one key's flood against another's job, fairness
between equal keys, and what keys cost a claim (issue 37).

On each engine, a fresh ``sqlq serve`` (16 workers, ``--sync full``). The policies are set
over HTTP (``PUT /queues/{name}``), the jobs are no-op ``sleep`` jobs with a ``key``, and
every start is read back from the server (each job's ``started_at``, its own clock).

- **Rate.** Queue ``rate`` has ``rate`` ``RATE``/s, burst 1, per key. Key A gets a backlog
  of ``RATE * (RATE_S + 4)`` jobs. Over ``RATE_S`` seconds, every sliding window of 1 s and
  of 10 s is counted, from its first start on. From above, the most starts is held to the
  bound, ``floor(r * W) + burst``. From below, the fewest is held to ``r * W``, which is
  work-conserving.
- **Flood.** Queue ``flood`` is paused and gets ``FLOOD`` jobs of key A, then one of key
  B. It is resumed, and B's wait is B's start less the resume (the client's clock and the
  server's, on one machine), with how many of A's started first. The control is the same
  on queue ``fifo`` with ``{"fair": false}``: the plain order, oldest first between keys.
- **Jain.** ``KEYS`` keys with ``PER_KEY`` jobs of ``JAIN_MS`` ms each, submitted
  interleaved, on queue ``jain``, fair by default once a job has a key. Jain's index of
  the starts per key is taken over each full ``JAIN_W`` s window while every key had jobs
  waiting. 1.0 is a perfectly even share.
- **Cost.** ``COST_JOBS`` no-op jobs over 10, 1,000 and 100,000 keys (capped at the jobs),
  and with no key, each drained alone. The server's CPU per job (``/stats``) and the drain
  rate are compared with the keyless drain's, in the same run.
- **PostgreSQL** (``--stores postgres``): ``PG_NODES`` nodes on one throwaway database,
  every figure over both; the issue's bar besides (``BAR_RATE``/s, burst 1, ``BAR_JOBS``
  due jobs); the database's CPU per job (its processes') and the dead rows of
  ``fair_keys`` after each cost drain. No queue but the rate's has a policy: a queue
  holding jobs with keys is fair between them by default, on PostgreSQL from each node's
  next census (a second; the flood and the cost submit into a paused queue).
- **The peer**: Celery's ``rate_limit`` of ``RATE``/s on one task over ``PEER_PROCESSES``
  worker processes on one Redis (Debian's ``redis-server``, which the bench starts),
  counted as sqlq's starts are, from stamps the task writes. Celery limits each worker
  process on its own (and on Redis, between bursts, a worker's next start waits for
  its poll: celery/celery#5927). Run when Celery is installed (``sqlq[redis-peers]``).
"""

from __future__ import annotations

import asyncio
import math
import tempfile
import time
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from sqlq.bench.client.http import HttpPool
from sqlq.bench.client.server import FAST_RETRY_FLAGS, ServerProcess
from sqlq.bench.experiments.base import Run, ServedRun, by_store
from sqlq.bench.experiments.j_runs import cluster
from sqlq.bench.experiments.n_runs import pg_cpu
from sqlq.bench.experiments.rows import CodedRow
from sqlq.bench.report import Report, cell, group, med
from sqlq.engines.registry import ALL

NAME = "S"
STORES = ("walq", "sqlite", "postgres")
PG_NODES = 2  # PostgreSQL: two nodes on one database, every figure over both
RATE, RATE_S, QUICK_RATE_S = 50.0, 20, 6
BAR_RATE, BAR_JOBS = 10.0, 2_000  # the bar, on PostgreSQL: rate 10/s, burst 1
PEER_PROCESSES, PEER_CONCURRENCY = 3, 4  # Celery: worker processes, each a prefork pool
PEER_UP_S = 60.0  # for the peer's workers to start taking jobs
FLOOD, QUICK_FLOOD = 100_000, 5_000
KEYS, PER_KEY, JAIN_MS, JAIN_W = 10, 1_000, 20, 10.0
PG_PER_KEY = 3_000  # two nodes' 32 workers drain 1,000 a key in 6 s: no full 10 s window
QUICK_PER_KEY, QUICK_JAIN_W = 200, 0.5
COST_JOBS, QUICK_COST_JOBS = 100_000, 5_000

COST_KEYS = (0, 10, 1_000, 100_000)  # 0: no key, the plain path
BATCH = 10_000  # jobs a request (the server's bound)


class SRow(CodedRow, kw_only=True):
    rate: float = 0.0
    rate_s: float = 0.0
    most_1s: int = 0  # the most starts of key A in any 1 s window
    fewest_1s: int = 0  # the fewest, within the backlog
    most_10s: int = 0
    fewest_10s: int = 0
    flood: int = 0
    fair_wait_s: float = 0.0  # B's start after the resume, fair
    fair_before: int = 0  # A's jobs started before B
    fifo_wait_s: float = 0.0  # the same with {"fair": false}
    fifo_before: int = 0
    jain: list[float] = msgspec.field(default_factory=list)  # each full window's index
    cost_jobs: int = 0
    cost_cpu_us: dict[str, float] = msgspec.field(default_factory=dict)  # keys -> us a job
    cost_rate: dict[str, float] = msgspec.field(default_factory=dict)  # keys -> jobs/s
    total: int = 0  # key A's starts in the first rate_s seconds
    # PostgreSQL only: the bar's rate (10/s) on both nodes, and what the database pays
    bar_most_1s: int = 0
    bar_total: int = 0  # starts in the first rate_s seconds of the bar's run
    cost_db_us: dict[str, float] = msgspec.field(default_factory=dict)  # keys -> us a job
    cost_dead: dict[str, int] = msgspec.field(default_factory=dict)  # keys -> fair_keys dead
    cost_key_rows: dict[str, int] = msgspec.field(default_factory=dict)  # keys -> its rows
    processes: int = 0  # a peer's worker processes, each limiting the rate on its own
    version: str = ""  # a peer's


ROW = SRow


def _windows(starts: list[float], width: float, until: float) -> tuple[int, int]:
    """The most and the fewest starts in a window of ``width`` seconds within
    ``[starts[0], until]``. The most: over every closed window that ends at a start (where
    a count is highest). The fewest: over every window ``[t, t + width)`` that starts at a
    start, and every one that ends just before a start (a gap shows there), each inside
    the span; a microsecond's slack at each end, for the float times."""
    times = sorted(starts)
    if not times:
        return 0, 0
    first, eps = times[0], 1e-6
    most = max(_count(times, t - width, t) for t in times)
    fewest = [_count(times, t - eps, t + width - eps) for t in times if t + width <= until]
    fewest += [_count(times, t - width - eps, t - eps) for t in times if t - width >= first]
    return most, min(fewest, default=0)


def _count(times: list[float], lo: float, hi: float) -> int:
    """Starts in ``[lo, hi]``."""
    return bisect_right(times, hi) - bisect_left(times, lo)


def jain(shares: list[float]) -> float:
    """Jain's fairness index: (sum x)^2 / (n * sum x^2); 1.0 is an even share."""
    total, squares = sum(shares), sum(x * x for x in shares)
    return 1.0 if squares == 0 else total * total / (len(shares) * squares)


async def _submit(pool: HttpPool, jobs: list[dict[str, Any]]) -> list[str]:
    ids: list[str] = []
    for i in range(0, len(jobs), BATCH):
        status, answer = await pool.json(
            "POST", "/jobs/batch", msgspec.json.encode({"jobs": jobs[i : i + BATCH]})
        )
        if status != 201:
            raise RuntimeError(f"a batch answered {status}: {answer}")
        ids += answer["ids"]
    return ids


async def _put(pool: HttpPool, path: str, body: dict[str, Any]) -> None:
    status, answer = await pool.json("PUT", path, msgspec.json.encode(body))
    if status != 200:
        raise RuntimeError(f"PUT {path} answered {status}: {answer}")


async def _post(pool: HttpPool, path: str) -> None:
    status, answer = await pool.json("POST", path)
    if status != 200:
        raise RuntimeError(f"POST {path} answered {status}: {answer}")


async def _started(pool: HttpPool, queue: str, state: str = "") -> list[dict[str, Any]]:
    """Every job of ``queue`` (of ``state``) as the server has it, page by page."""
    out: list[dict[str, Any]] = []
    cursor = ""
    while True:
        query = f"/jobs?queue={queue}&limit=1000" + (f"&state={state}" if state else "")
        status, page = await pool.json("GET", query + (f"&after={cursor}" if cursor else ""))
        if status != 200:
            raise RuntimeError(f"GET {query} answered {status}: {page}")
        out += page["jobs"]
        cursor = page.get("next") or ""
        if not cursor:
            return out


async def _wait(pool: HttpPool, job_id: str) -> dict[str, Any]:
    while True:
        status, job = await pool.json("GET", f"/jobs/{job_id}?wait=30")
        if status == 200 and job["state"] in ("completed", "dead", "cancelled"):
            return dict(job)


@dataclass
class Nodes:
    """What a run measures: one server, or (PostgreSQL) ``PG_NODES`` nodes on one database,
    where ``dsn`` reads the database itself."""

    pools: list[HttpPool]
    dsn: str | None = None

    @property
    def first(self) -> HttpPool:
        return self.pools[0]

    async def idle(self) -> None:
        """Until no job is scheduled or running (the parts run one at a time). Not the
        queue's depth: a claim taken from the lanes is scheduled still until its commit
        lands, and its job would read as never started. PostgreSQL: read in the database
        (a node's counts are a census's, seconds old)."""
        while True:
            if self.dsn is not None:
                busy = await _sql(self.dsn, "SELECT count(*) FROM jobs "
                                            "WHERE state IN ('scheduled', 'running')")  # fmt: skip
            else:
                _, stats = await self.first.json("GET", "/stats")
                busy = stats["jobs"]["scheduled"] + stats["jobs"]["running"]
            if busy == 0:
                return
            await asyncio.sleep(0.1)

    async def cpu_s(self) -> tuple[float, float]:
        """The nodes' CPU seconds (``/stats``), and the database's (its processes')."""
        used = 0.0
        for pool in self.pools:
            _, stats = await pool.json("GET", "/stats")
            used += float(stats["process_cpu_s"])
        return used, (pg_cpu() if self.dsn is not None else 0.0)


async def _sql(dsn: str, query: str) -> int:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(query))
    finally:
        await conn.close()


def _job(queue: str, key: str | None, ms: int = 0) -> dict[str, Any]:
    job: dict[str, Any] = {"kind": "sleep", "queue": queue, "args": {"work_ms": ms}}
    if key is not None:
        job["key"] = key
    return job


@dataclass(frozen=True, kw_only=True)
class FairRun(ServedRun):
    rate_s: int
    flood: int
    per_key: int
    jain_w: float
    cost_jobs: int

    def execute(self) -> dict[str, Any]:
        if self.store != "postgres":
            return super().execute()
        dsn = cluster().create_database()
        flags = ("--store", "postgres", "--dsn", dsn, "--workers", "16", "--log-level",
                 "warning", "--grace", "0", "--fault-injection", *FAST_RETRY_FLAGS)  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="sqlq-s-") as d:
            nodes = [ServerProcess(*flags, log_path=Path(d) / f"node{i}.log")
                     for i in range(PG_NODES)]  # fmt: skip
            try:
                for n in nodes:
                    n.spawn()
                for n in nodes:
                    n.wait_ready()
                return asyncio.run(self._measure([n.url for n in nodes], dsn))
            finally:
                for n in nodes:
                    n.stop()

    async def measure(self, url: str) -> dict[str, Any]:
        return await self._measure([url], None)

    async def _measure(self, urls: list[str], dsn: str | None) -> dict[str, Any]:
        pools = [await HttpPool(u, 4).__aenter__() for u in urls]
        try:
            at = Nodes(pools, dsn)
            out: dict[str, Any] = {}
            out.update(await self._rate(at))
            if dsn is not None:
                out.update(await self._bar(at))
            out.update(await self._flood(at))
            out.update(await self._jain(at))
            out.update(await self._cost(at))
        finally:
            for pool in pools:
                await pool.__aexit__(None, None, None)
        return out

    async def _starts(self, at: Nodes, queue: str, rate: float, jobs: int
                      ) -> tuple[list[float], float]:  # fmt: skip
        """Key A's starts over ``rate_s`` from its first, with a backlog of ``jobs`` and
        ``rate``/s, burst 1; and where the span ends."""
        pool = at.first
        await _put(pool, f"/queues/{queue}", {"rate": {"per_s": rate, "burst": 1}})
        await _submit(pool, [_job(queue, "A") for _ in range(jobs)])
        await asyncio.sleep(self.rate_s + 1)
        done = await _started(pool, queue)
        starts = sorted(float(j["started_at"]) for j in done if j.get("started_at"))
        until = starts[0] + self.rate_s
        await pool.json("POST", "/jobs/cancel", msgspec.json.encode({"queue": queue}))
        return [t for t in starts if t <= until], until

    async def _rate(self, at: Nodes) -> dict[str, Any]:
        starts, until = await self._starts(at, "rate", RATE, int(RATE * (self.rate_s + 4)))
        most_1, fewest_1 = _windows(starts, 1.0, until)
        most_10, fewest_10 = _windows(starts, 10.0, until) if self.rate_s >= 10 else (0, 0)
        return {"rate": RATE, "rate_s": self.rate_s, "most_1s": most_1, "fewest_1s": fewest_1,
                "most_10s": most_10, "fewest_10s": fewest_10, "total": len(starts)}  # fmt: skip

    async def _bar(self, at: Nodes) -> dict[str, Any]:
        """The issue's bar on PostgreSQL: rate 10/s, burst 1, 2,000 due jobs of key A, two
        nodes: the most starts in any 1 s window, and the starts over ``rate_s``."""
        starts, until = await self._starts(at, "bar", BAR_RATE, BAR_JOBS)
        return {"bar_most_1s": _windows(starts, 1.0, until)[0], "bar_total": len(starts)}

    async def _flood_one(self, at: Nodes, queue: str) -> tuple[float, int]:
        pool = at.first
        await _post(pool, f"/queues/{queue}/pause")
        await _submit(pool, [_job(queue, "A") for _ in range(self.flood)])
        [b] = await _submit(pool, [_job(queue, "B")])
        resumed = time.time()
        await _post(pool, f"/queues/{queue}/resume")
        job = await _wait(pool, b)
        b_start = float(job["started_at"])
        await at.idle()
        jobs = await _started(pool, queue)
        unstarted = [j for j in jobs if j.get("started_at") is None]
        if unstarted:
            raise RuntimeError(f"{len(unstarted)} jobs of {queue} never started: "
                               f"{unstarted[0]}")  # fmt: skip
        before = sum(1 for j in jobs if j["id"] != b and float(j["started_at"]) < b_start)
        return b_start - resumed, before

    async def _flood(self, at: Nodes) -> dict[str, Any]:
        await _put(at.first, "/queues/fifo", {"fair": False})
        fair_wait, fair_before = await self._flood_one(at, "flood")
        fifo_wait, fifo_before = await self._flood_one(at, "fifo")
        return {"flood": self.flood, "fair_wait_s": round(fair_wait, 4),
                "fair_before": fair_before, "fifo_wait_s": round(fifo_wait, 4),
                "fifo_before": fifo_before}  # fmt: skip

    async def _jain(self, at: Nodes) -> dict[str, Any]:
        jobs = [_job("jain", f"k{k}", JAIN_MS) for _ in range(self.per_key) for k in range(KEYS)]
        await _submit(at.first, jobs)
        await at.idle()
        done = await _started(at.first, "jain")
        by_key: dict[str, list[float]] = {}
        for j in done:
            by_key.setdefault(j["key"], []).append(float(j["started_at"]))
        first = min(min(ts) for ts in by_key.values())
        backlogged_until = min(max(ts) for ts in by_key.values())  # every key still had jobs
        indexes = []
        lo = first
        while lo + self.jain_w <= backlogged_until:
            shares = [float(sum(1 for t in ts if lo <= t < lo + self.jain_w))
                      for ts in by_key.values()]  # fmt: skip
            indexes.append(round(jain(shares), 5))
            lo += self.jain_w
        return {"jain": indexes}

    async def _cost(self, at: Nodes) -> dict[str, Any]:
        cpu: dict[str, float] = {}
        db: dict[str, float] = {}
        rates: dict[str, float] = {}
        dead: dict[str, int] = {}
        rows: dict[str, int] = {}
        for keys in COST_KEYS:
            n = self.cost_jobs
            label = str(min(keys, n))
            queue = f"cost{keys}"
            jobs = [_job(queue, None if keys == 0 else f"t{i % min(keys, n)}") for i in range(n)]
            await _post(at.first, f"/queues/{queue}/pause")
            await _submit(at.first, jobs)
            nodes0, db0 = await at.cpu_s()
            t0 = time.perf_counter()
            await _post(at.first, f"/queues/{queue}/resume")
            await at.idle()
            elapsed = time.perf_counter() - t0
            nodes1, db1 = await at.cpu_s()
            cpu[label] = round(1e6 * (nodes1 - nodes0) / n, 2)
            rates[label] = round(n / elapsed, 1)
            if at.dsn is not None:
                db[label] = round(1e6 * (db1 - db0) / n, 2)
                dead[label] = await _sql(at.dsn, "SELECT n_dead_tup FROM pg_stat_user_tables "
                                                 "WHERE relname = 'fair_keys'")  # fmt: skip
                rows[label] = await _sql(at.dsn, "SELECT count(*) FROM fair_keys "
                                                 f"WHERE queue = '{queue}'")  # fmt: skip
        return {"cost_jobs": self.cost_jobs, "cost_cpu_us": cpu, "cost_rate": rates,
                "cost_db_us": db, "cost_dead": dead, "cost_key_rows": rows}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class CeleryRateRun(Run):
    """The peer: Celery's ``rate_limit`` of ``RATE``/s on one task, over ``PEER_PROCESSES``
    worker processes on one Redis, with a backlog that outlasts the window at any rate they
    reach; every start stamped by the task itself, counted as sqlq's are."""

    rate_s: int
    version: str

    def execute(self) -> dict[str, Any]:
        import os
        import subprocess
        import sys

        from sqlq.bench.experiments.q_redis import Child
        from sqlq.bench.redis_celery import RATE_ENV
        from sqlq.bench.redispeers import DONE_ENV, PEERS, REDIS_ENV, stamps
        from sqlq.bench.redisserver import RedisServer

        peer = PEERS["celery"]
        jobs = int(PEER_PROCESSES * RATE * (self.rate_s + 4))
        with tempfile.TemporaryDirectory(prefix="sqlq-s-celery-") as d, \
                RedisServer("everysec") as r:  # fmt: skip
            done = Path(d) / "starts"
            env = {**os.environ, REDIS_ENV: r.url, DONE_ENV: str(done), RATE_ENV: f"{RATE:g}/s"}
            cmd = peer.worker(PEER_CONCURRENCY, r.url)
            workers = [Child([*cmd, "-n", f"s{i}@%h"], env, Path(d) / f"worker{i}.log")
                       for i in range(PEER_PROCESSES)]  # fmt: skip
            try:  # every worker up (it answers a ping), then the backlog at once
                code = ("from sqlq.bench.redis_celery import enqueue_limited as e; "
                        f"e({jobs}, {PEER_PROCESSES}, {PEER_UP_S})")  # fmt: skip
                subprocess.run([sys.executable, "-c", code], env=env, check=True)
                t0 = time.monotonic()
                while not stamps(done) and time.monotonic() - t0 < PEER_UP_S:
                    time.sleep(0.1)
                time.sleep(self.rate_s + 1)
                for w in workers:
                    w.check()  # (each still running: else its row would be two processes')
            finally:
                for w in workers:
                    w.stop()
            starts = stamps(done)
        if not starts:
            raise RuntimeError("the peer's workers started no job")
        until = starts[0] + self.rate_s
        starts = [t for t in starts if t <= until]
        most_1, fewest_1 = _windows(starts, 1.0, until)
        most_10, fewest_10 = _windows(starts, 10.0, until) if self.rate_s >= 10 else (0, 0)
        return {"rate": RATE, "rate_s": self.rate_s, "most_1s": most_1, "fewest_1s": fewest_1,
                "most_10s": most_10, "fewest_10s": fewest_10, "total": len(starts),
                "processes": PEER_PROCESSES, "version": self.version}  # fmt: skip


def runs(quick: bool, stores: tuple[str, ...], peers: bool = True) -> Iterator[Run]:
    """sqlq on each engine asked for, then the peer (Celery's ``rate_limit``) if installed."""
    for store in stores:
        if store in STORES:
            yield FairRun(
                experiment=NAME, store=store, label=f"S/{store}",
                rate_s=QUICK_RATE_S if quick else RATE_S,
                flood=QUICK_FLOOD if quick else FLOOD,
                per_key=QUICK_PER_KEY if quick else PG_PER_KEY if store == "postgres"
                else PER_KEY,
                jain_w=QUICK_JAIN_W if quick else JAIN_W,
                cost_jobs=QUICK_COST_JOBS if quick else COST_JOBS,
            )  # fmt: skip
    from sqlq.bench.redispeers import available

    version = available().get("celery") if peers else None
    if version is not None:
        yield CeleryRateRun(experiment=NAME, store="celery", label="S/celery",
                            rate_s=QUICK_RATE_S if quick else RATE_S, version=version)  # fmt: skip


def section(rep: Report) -> None:
    every, codes = rep.before_after(NAME, SRow)
    ran = [r for r in every if r.code == codes[-1]] if every else []
    rows = [r for r in ran if r.store in ALL]  # sqlq's; the peers' apart (``_peers``)
    if not rows:
        return
    first = rows[0]
    bound_1 = math.floor(first.rate) + 1
    bound_10 = math.floor(first.rate * 10) + 1
    rep.add(
        "## S. Fair claims by key: rate, flood, fairness, cost",
        "",
        f"A fresh server per engine (16 workers, `--sync full`; PostgreSQL: {PG_NODES} nodes "
        "on one database, every figure over both; only the rate's queue has a policy, the "
        "others are fair between keys by default), no-op jobs with a key; "
        "every start read back from the server. Rate: one key with a backlog and `rate` "
        f"{first.rate:g}/s, burst 1, over {first.rate_s:g} s; the most and the fewest starts "
        f"in any sliding window (bound from above: {bound_1} in 1 s, {bound_10} in 10 s; "
        f"from below, work-conserving: r·W). Flood: one job of key B behind {first.flood:,} "
        "due jobs of key A in a paused queue, resumed: B's start after the resume, and A's "
        "jobs started before it, fair and with `fair: false` (oldest first between keys). "
        f"Jain: {KEYS} equal keys, {first.params.get('per_key', PER_KEY):,} jobs of "
        f"{JAIN_MS} ms each ({PG_PER_KEY:,} on PostgreSQL, whose two nodes drain 1,000 a key "
        "in less than a window), Jain's index over each full window while all were backlogged "
        "(1.0: even). Cost: the same no-op jobs over 10, 1,000 and 100,000 keys (capped at "
        "the jobs) against none, each drained alone: server CPU per job and the drain rate. "
        "Medians over the repeats.",
        "",
        "| store | 1 s windows: most / fewest | 10 s windows: most / fewest | B's wait, fair / "
        "FIFO s | A before B, fair / FIFO | Jain (min of windows) |",
        "|---|---:|---:|---:|---:|---:|",
    )
    for store, rs in by_store(rows).items():
        rep.add(
            f"| {store} | {cell([r.most_1s for r in rs], '{:.0f}')} / "
            f"{cell([r.fewest_1s for r in rs], '{:.0f}')} | "
            f"{cell([r.most_10s for r in rs], '{:.0f}')} / "
            f"{cell([r.fewest_10s for r in rs], '{:.0f}')} | "
            f"{cell([r.fair_wait_s for r in rs], '{:.3f}')} / "
            f"{cell([r.fifo_wait_s for r in rs], '{:.2f}')} | "
            f"{cell([r.fair_before for r in rs], '{:.0f}')} / "
            f"{cell([r.fifo_before for r in rs], '{:.0f}')} | "
            f"{cell([min(r.jain) for r in rs if r.jain], '{:.4f}')} |"
        )
    labels = list(first.cost_cpu_us)
    rep.add(
        "",
        "| store | " + " | ".join(f"{k} keys: us a job (x none), jobs/s" for k in labels) + " |",
        "|---|" + "---:|" * len(labels),
    )
    for store, rs in by_store(rows).items():
        cells = []
        for k in labels:
            us = med([r.cost_cpu_us[k] for r in rs])
            ratio = med([r.cost_cpu_us[k] / r.cost_cpu_us[labels[0]] for r in rs])
            cells.append(f"{us:.1f} ({ratio:.2f}x), {med([r.cost_rate[k] for r in rs]):.0f}")
        rep.add(f"| {store} | " + " | ".join(cells) + " |")
    pg = [r for r in rows if r.bar_total]
    if pg:
        rep.add(
            "",
            f"PostgreSQL: the issue's bar (rate {BAR_RATE:g}/s, burst 1, {BAR_JOBS:,} due jobs "
            f"of one key, two nodes) over {pg[0].rate_s:g} s, and what the database pays a job "
            "(its processes' CPU, those that ended too) with the dead rows of `fair_keys` "
            "after each drain.",
            "",
            "| store | bar: most in 1 s (bound "
            f"{math.floor(BAR_RATE) + 1}) | bar: starts in {pg[0].rate_s:g} s | "
            + " | ".join(f"{k} keys: database us a job, fair_keys dead" for k in labels)
            + " |",
            "|---|---:|---:|" + "---:|" * len(labels),
        )
        for store, rs in by_store(pg).items():
            cells = [f"{med([r.cost_db_us.get(k, 0.0) for r in rs]):.0f}, "
                     f"{med([float(r.cost_dead.get(k, 0)) for r in rs]):.0f}"
                     for k in labels]  # fmt: skip
            bar = f"{cell([r.bar_most_1s for r in rs], '{:.0f}')} | " \
                  f"{cell([r.bar_total for r in rs], '{:.0f}')}"  # fmt: skip
            rep.add(f"| {store} | {bar} | " + " | ".join(cells) + " |")
    _peers(rep, rows, [r for r in ran if r.store not in ALL])
    rep.add("")


def _peers(rep: Report, rows: list[SRow], peers: list[SRow]) -> None:
    """The rate side by side: sqlq's key against a peer's task limited to the same rate."""
    if not peers:
        return
    p = peers[0]
    rep.add(
        "",
        f'The peer, in the same run: Celery {p.version}\'s `rate_limit="{p.rate:g}/s"` on one '
        f"task, {p.processes} worker processes (prefork, {PEER_CONCURRENCY} each) on one Redis, "
        "every worker up (it answers a ping) before a backlog that outlasts the window at "
        "three times the rate; each start stamped by the task. Celery limits each worker "
        "process on its own. Against sqlq's one key at the same rate, over "
        f"{p.rate_s:g} s from the first start:",
        "",
        f"| system | most in 1 s (bound {math.floor(p.rate) + 1}) | fewest in 1 s | most in 10 s "
        f"| fewest in 10 s | starts in {p.rate_s:g} s (r·W: {p.rate * p.rate_s:.0f}) |",
        "|---|---:|---:|---:|---:|---:|",
    )
    groups = [*by_store(rows).items(), *group(peers, lambda r: r.store).items()]
    for store, rs in groups:
        rep.add(
            f"| {store} | {cell([r.most_1s for r in rs], '{:.0f}')} | "
            f"{cell([r.fewest_1s for r in rs], '{:.0f}')} | "
            f"{cell([r.most_10s for r in rs], '{:.0f}')} | "
            f"{cell([r.fewest_10s for r in rs], '{:.0f}')} | "
            f"{cell([r.total for r in rs], '{:.0f}')} |"
        )
