"""The SQL engines' listings at scale, and what their indexes cost the write path.

    python -m sqlq.bench.listing --engine sqlite --jobs 200000          # listing page times
    python -m sqlq.bench.listing --engine postgres --write --index kind,id --index queue,id

``--jobs`` fills a store with finished no-op jobs (1 in 500 dead, the rest
completed) and times one page (limit 50) of each filter that matches few or none,
after ten warm-up runs (a prepared statement takes PostgreSQL's generic plan after
five). ``--write`` runs sqlq.bench.engines' submit -> start -> complete loop at C=64 with
the engine's indexes, then without the ones named by ``--index`` (dropped after
open), alternating, and reports transitions/s and the CPU per job of this process
and, for PostgreSQL, of the cluster. Short runs on a shared machine: read the spread.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time

from sqlq.bench.engines import _appender
from sqlq.common.models import Job, State
from sqlq.common.store import JobQuery, JobStore
from sqlq.engines.registry import make_store

NOW = 1_700_000_000.0
FILTERS = {
    "kind=nope": JobQuery(kind="nope", limit=50),
    "queue=nope": JobQuery(queue="nope", limit=50),
    "state=running": JobQuery(state=State.RUNNING, limit=50),
    "state=dead&queue=nope": JobQuery(state=State.DEAD, queue="nope", limit=50),
    "state=dead": JobQuery(state=State.DEAD, limit=50),
    "state=completed": JobQuery(state=State.COMPLETED, limit=50),
}


def _cluster_cpu(postmaster: int) -> float:
    """utime + stime of the postmaster's children, in seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total / tick


async def fill(store: JobStore, n: int, chunk: int = 1000) -> None:
    for base in range(0, n, chunk):
        jobs = [Job.new(kind="noop", args={}, now=NOW) for _ in range(min(chunk, n - base))]
        await store.commit(list(jobs))
        starts = [j.start(NOW) for j in jobs]
        await store.commit(list(starts))
        await store.commit(
            [
                j.apply(s).bury("x", NOW)
                if (base + i) % 500 == 0
                else j.apply(s).complete(None, NOW)
                for i, (j, s) in enumerate(zip(jobs, starts, strict=True))
            ]
        )


async def listing(store: JobStore, n: int) -> None:
    t0 = time.perf_counter()
    await fill(store, n)
    print(f"filled {n} jobs in {time.perf_counter() - t0:.1f} s", flush=True)
    if hasattr(store, "_conn"):
        async with store._conn() as conn:
            await conn.execute("ANALYZE jobs")
    for name, query in FILTERS.items():
        for _ in range(10):
            await store.list_jobs(query)
        times = []
        for _ in range(20):
            t = time.perf_counter()
            await store.list_jobs(query)
            times.append((time.perf_counter() - t) * 1000)
        print(f"{name:24} median {statistics.median(times):8.2f} ms  max {max(times):8.2f} ms")


async def _drop(store: JobStore, engine: str, indexes: list[str]) -> None:
    names = [f"jobs_{i.replace(',', '_')}" for i in indexes]
    if engine == "sqlite":
        db = store._conn()  # type: ignore[attr-defined]
        for n in names:
            await db.execute(f"DROP INDEX IF EXISTS {n}")
    else:
        async with store._conn() as conn:  # type: ignore[attr-defined]
            for n in names:
                await conn.execute(f"DROP INDEX IF EXISTS {n}")


async def _create(store: JobStore, engine: str, indexes: list[str]) -> None:
    """For PostgreSQL, the candidate indexes (not in the schema) for the "with" runs."""
    if engine != "postgres":
        return
    async with store._conn() as conn:  # type: ignore[attr-defined]
        for i in indexes:
            await conn.execute(
                f"CREATE INDEX IF NOT EXISTS jobs_{i.replace(',', '_')} ON jobs ({i})"
            )


async def write_once(
    engine: str, base: str, dsn: str | None, postmaster: int | None, drop: list[str] | None,
    create: list[str], transitions: int,
) -> dict[str, float]:  # fmt: skip
    d = tempfile.mkdtemp(dir=base)
    store = make_store(engine, d, dsn=dsn)
    await store.open()
    try:
        await _create(store, engine, create)
        if drop:
            await _drop(store, engine, drop)
        await asyncio.gather(*(_appender(store, [30], []) for _ in range(64)))
        lat: list[float] = []
        budget = [transitions]
        t0 = time.perf_counter()
        cpu0, pg0 = time.process_time(), _cluster_cpu(postmaster or -1)
        await asyncio.gather(*(_appender(store, budget, lat) for _ in range(64)))
        wall = time.perf_counter() - t0
        cpu, pg = time.process_time() - cpu0, _cluster_cpu(postmaster or -1) - pg0
    finally:
        await store.close()
    jobs = len(lat) / 3
    return {
        "per_s": len(lat) / wall,
        "cpu_us_per_job": cpu / jobs * 1e6,
        "pg_cpu_us_per_job": pg / jobs * 1e6,
    }


async def write(args: argparse.Namespace, dsn: str | None, postmaster: int | None) -> None:
    base = tempfile.mkdtemp(prefix="sqlq-listing-")
    rows: dict[str, list[dict[str, float]]] = {"with": [], "without": []}
    for _ in range(args.repeats):
        for label in ("with", "without"):
            drop = args.index if label == "without" else None
            r = await write_once(
                args.engine, base, dsn, postmaster, drop, args.index, args.transitions
            )
            rows[label].append(r)
            print(label, {k: round(v, 1) for k, v in r.items()}, flush=True)
    for label, rs in rows.items():
        med = {k: round(statistics.median(r[k] for r in rs), 1) for k in rs[0]}
        print(f"median {label:8} {med}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--engine", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--jobs", type=int, default=0)
    p.add_argument("--write", action="store_true")
    p.add_argument("--index", action="append", default=[], help="columns, e.g. kind,id")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--transitions", type=int, default=30_000)
    args = p.parse_args()
    cluster = None
    dsn = postmaster = None
    if args.engine == "postgres":
        from sqlq.bench.pgcluster import make_cluster

        cluster = make_cluster()
        dsn, postmaster = cluster.create_database(), cluster.pid()
    try:
        if args.jobs:
            d = tempfile.mkdtemp(prefix="sqlq-listing-")
            store = make_store(args.engine, d, dsn=dsn)

            async def run() -> None:
                await store.open()
                try:
                    await _create(store, args.engine, args.index)
                    await listing(store, args.jobs)
                finally:
                    await store.close()

            asyncio.run(run())
        if args.write:
            asyncio.run(write(args, dsn, postmaster))
    finally:
        if cluster is not None:
            cluster.end()


if __name__ == "__main__":
    main()
