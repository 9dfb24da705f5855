"""Engine micro-benchmark: how many transitions/s each engine commits, and how.

C concurrent appenders each loop submit -> start -> complete, one change per
``commit`` call, until N transitions are done in all. This measures the store
alone (no HTTP, no workers): what group commit buys as concurrency grows.

    python -m sqlq.bench.engines --repeats 3 --out results

Every run uses a fresh data directory; a warm-up is excluded; engines alternate
within each repeat so machine drift hits all of them alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlq.bench import meta
from sqlq.bench.stats import median_minmax, spread, summary_ms
from sqlq.common.models import Job
from sqlq.common.store import JobStore, SyncLevel
from sqlq.engines.registry import DURABLE, NAMES, make_store


async def _appender(store: JobStore, budget: list[int], latencies: list[float]) -> None:
    perf = time.perf_counter
    while budget[0] > 0:
        budget[0] -= 3
        now = time.time()
        job = Job.new(kind="noop", args={}, now=now)
        t0 = perf()
        await store.commit([job])
        t1 = perf()
        start = job.start(now)
        await store.commit([start])
        t2 = perf()
        await store.commit([job.apply(start).complete(None, now)])
        t3 = perf()
        latencies.extend((t1 - t0, t2 - t1, t3 - t2))


async def run_one(
    engine: str, sync: SyncLevel, concurrency: int, transitions: int, data_dir: str
) -> dict[str, Any]:
    store = make_store(engine, data_dir, sync=sync)
    await store.open()
    try:
        warm: list[float] = []
        await asyncio.gather(*(_appender(store, [30], warm) for _ in range(concurrency)))
        before = store.stats()
        latencies: list[float] = []
        budget = [transitions]
        t0 = time.perf_counter()
        await asyncio.gather(*(_appender(store, budget, latencies) for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
        after = store.stats()
    finally:
        await store.close()
    done = len(latencies)
    syncs = after.syncs - before.syncs
    batches = after.batches - before.batches
    return {
        "engine": engine,
        "sync": sync,
        "concurrency": concurrency,
        "transitions": done,
        "seconds": round(elapsed, 4),
        "transitions_per_s": round(done / elapsed, 1),
        "syncs_per_s": round(syncs / elapsed, 1),
        "mean_batch": round(done / batches, 2) if batches else None,
        **summary_ms(latencies),
    }


def budget_for(concurrency: int, quick: bool) -> int:
    if quick:
        return 600
    return 6_000 if concurrency == 1 else 60_000


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    base = tempfile.mkdtemp(prefix="sqlq-engines-", dir=args.dir)
    try:
        for repeat in range(args.repeats):
            for sync in args.sync:
                for concurrency in args.concurrency:
                    for engine in args.engines:  # alternate engines inside each repeat
                        d = os.path.join(base, f"{engine}-{sync}-{concurrency}-{repeat}")
                        row = await run_one(
                            engine, sync, concurrency, budget_for(concurrency, args.quick), d
                        )
                        row["repeat"] = repeat
                        rows.append(row)
                        shutil.rmtree(d, ignore_errors=True)
                        print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return rows


def report(rows: list[dict[str, Any]], info: dict[str, Any]) -> str:
    out = [
        "# Engine micro-benchmark",
        "",
        "C concurrent appenders, each looping submit -> start -> complete with one change per "
        "`commit`; the store alone, no HTTP. Medians over repeats, with [min-max]. "
        "`syncs/s` is fdatasyncs (walq) or committed transactions (sqlite; each is synced at "
        "`full`). Produced by `python -m sqlq.bench.engines`; do not edit by hand.",
        "",
        f"- command: `{info['command']}`",
        f"- git commit: {info['git_commit']}; Python {info['python']} on {info['platform']}",
        f"- CPU: {info['cpu']}, {info['cores']} cores; data disk: {info['disk']}",
        f"- packages: {', '.join(f'{k} {v}' for k, v in info['packages'].items())}",
        f"- event loop: {info['loop']}; repeats: {info['repeats']}",
        "",
        "| sync | engine | C | transitions/s | syncs/s | mean batch | p50 ms | p99 ms | vs C=1 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["sync"], r["engine"], r["concurrency"]), []).append(r)
    noisy: list[str] = []
    for (sync, engine, c), rs in sorted(groups.items()):
        tps = [r["transitions_per_s"] for r in rs]
        med, lo, hi = median_minmax(tps)
        base_rs = groups.get((sync, engine, 1))
        ratio = med / statistics.median(r["transitions_per_s"] for r in base_rs) if base_rs else 0
        batches = [r["mean_batch"] for r in rs if r["mean_batch"] is not None]
        batch = f"{statistics.median(batches):.1f}" if batches else "n/a"
        if len(rs) > 1 and spread(tps) > 0.25:
            noisy.append(f"{sync}/{engine}/C={c} (spread {spread(tps):.0%})")
        out.append(
            f"| {sync} | {engine} | {c} | {med:,.0f} [{lo:,.0f}-{hi:,.0f}] | "
            f"{statistics.median(r['syncs_per_s'] for r in rs):,.0f} | {batch} | "
            f"{statistics.median(r['p50_ms'] for r in rs):.3f} | "
            f"{statistics.median(r['p99_ms'] for r in rs):.3f} | {ratio:.1f}x |"
        )
    out += ["", "High variance (max-min over median > 25%): " + (", ".join(noisy) or "none")]
    out += ["", "## Against the bar (computed from the rows above)", ""]
    for engine in DURABLE:
        one, many = groups.get(("full", engine, 1)), groups.get(("full", engine, 64))
        if not one or not many:
            continue
        m1 = statistics.median(r["transitions_per_s"] for r in one)
        m64 = statistics.median(r["transitions_per_s"] for r in many)
        out.append(
            f"- {engine}, `--sync full`: {m64:,.0f} transitions/s at C=64 = {m64 / m1:.1f}x "
            f"its C=1 rate (bar: >= 10x)"
            + (
                f"; bar for walq: >= 50,000/s: {'met' if m64 >= 50_000 else 'NOT met'}"
                if engine == "walq"
                else ""
            )
        )
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--engines", nargs="+", default=list(NAMES))
    p.add_argument("--sync", nargs="+", default=["full", "os"], choices=["full", "os"])
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 64, 256])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="tiny budgets, for a smoke test")
    p.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    p.add_argument("--dir", default=None, help="where the fresh data directories go")
    p.add_argument("--out", default=None, help="write engines.jsonl and engines.md here")
    args = p.parse_args()
    info = meta.collect(args.dir or tempfile.gettempdir())
    info["loop"] = args.loop
    info["repeats"] = args.repeats
    if args.loop == "uvloop":
        import uvloop

        rows = uvloop.run(main_async(args))
    else:
        rows = asyncio.run(main_async(args))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "engines.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps({**r, "meta": info}) + "\n")
        (out / "engines.md").write_text(report(rows, info))


if __name__ == "__main__":
    main()
