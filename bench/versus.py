"""Server CPU per no-op job, this tree against another tree, side by side in one run.

A refactor's bar is "no slower than before": this measures it the way the house
asks, as a ratio of two servers run alternately on the same machine in the same
minutes, so the load the machine carries from elsewhere falls on both. Each repeat
runs, for every engine, both trees (in alternating order) on a fresh server: N
no-op jobs by single POST from 32 clients, 64 workers, ``--sync full`` (K's cpu
part). The server's own CPU (all threads, from ``/stats``) over the jobs is the
figure; the ratio is taken within a repeat, and the table shows medians.

    python -m sqlq.bench.versus --other /path/to/other/tree/.venv/bin/python --out results

``--other`` is the interpreter of the other tree's environment (an editable
install of it); this tree's is the one running this script. Writes
``versus.jsonl`` and ``versus.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from sqlq.bench import meta
from sqlq.bench.client.loadgen import run
from sqlq.bench.client.server import ServerProcess
from sqlq.bench.pgcluster import Cluster, make_cluster
from sqlq.engines.registry import ALL, engine

THIS, OTHER = "this", "other"


def tree_commit(python: str) -> str:
    """The git commit of the tree that ``python``'s environment runs sqlq from."""
    code = "import pathlib, sqlq; print(pathlib.Path(sqlq.__file__).resolve().parent.parent)"
    root = subprocess.run([python, "-P", "-c", code], capture_output=True, text=True, check=True)
    out = subprocess.run(
        ["git", "-C", root.stdout.strip(), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() or "unknown"


def one(python: str, store: str, jobs: int, cluster: Cluster | None) -> float:
    """Server CPU (us) per no-op job on a fresh ``store`` server run by ``python``."""
    flags: tuple[str, ...] = ()
    if engine(store).shared:
        assert cluster is not None
        # Empty, then migrated by the tree that runs on it: a database at this tree's schema
        # is newer than an older tree's, which refuses it.
        name = cluster.create_database().rsplit("/", 1)[1]
        dsn = cluster.recycle(name, migrated=False)
        subprocess.run([python, "-m", "sqlq", "migrate", "--dsn", dsn], check=True,
                       capture_output=True, env={**os.environ, "PYTHONSAFEPATH": "1"})  # fmt: skip
        flags = ("--dsn", dsn)
    srv = ServerProcess.engine(store=store, workers=64, flags=flags)
    srv.cmd = [python, *srv.cmd[1:]]
    srv.env["PYTHONSAFEPATH"] = "1"  # the tree its environment installs, not the one in cwd
    with srv:
        result = run(srv.url, jobs=jobs, work_ms=0, concurrency=32, batch=1, label=store)
    return 1e6 * float(result["server_cpu_s"]) / jobs


def measure(other: str, stores: list[str], jobs: int, repeats: int) -> list[dict[str, Any]]:
    cluster = make_cluster() if any(engine(s).shared for s in stores) else None
    pythons = {THIS: sys.executable, OTHER: other}
    rows: list[dict[str, Any]] = []
    try:
        for repeat in range(repeats):
            for store in stores:
                order = (THIS, OTHER) if repeat % 2 == 0 else (OTHER, THIS)
                for tree in order:
                    cpu = one(pythons[tree], store, jobs, cluster)
                    rows.append({"store": store, "tree": tree, "repeat": repeat, "jobs": jobs,
                                 "cpu_us_per_job": round(cpu, 2)})  # fmt: skip
                    print(f"repeat {repeat} {store:8} {tree:5} {cpu:7.1f} us/job", flush=True)
    finally:
        if cluster is not None:
            cluster.end()
    return rows


def report(rows: list[dict[str, Any]]) -> str:
    runs = {json.dumps(r["meta"], sort_keys=True): r["meta"] for r in rows}
    lines = [
        "# Server CPU per no-op job: this tree against another, side by side",
        "",
        "Produced by `python -m sqlq.bench.versus`; do not edit by hand. Each repeat runs "
        f"both trees on every engine, in alternating order: {rows[0]['jobs']:,} no-op jobs "
        "by single POST from 32 clients, 64 workers, `--sync full`, a fresh server each. "
        "`this / other` is the median of the per-repeat ratios.",
        "",
    ]
    for info in runs.values():
        engines = sorted({r["store"] for r in rows if r["meta"] == info})
        lines += [
            f"- {', '.join(engines)}: this tree {info['this']}, other tree {info['other']}; "
            f"{info['repeats']} repeats; Python {info['python']} on {info['platform']}; "
            f"CPU: {info['cpu']}, {info['cores']} cores; data disk: {info['disk']}",
        ]
    lines += [
        "",
        "| engine | this us/job | other us/job | this / other |",
        "|---|---:|---:|---:|",
    ]
    for store in dict.fromkeys(r["store"] for r in rows):
        mine = {r["repeat"]: r["cpu_us_per_job"] for r in rows if r["store"] == store
                and r["tree"] == THIS}  # fmt: skip
        theirs = {r["repeat"]: r["cpu_us_per_job"] for r in rows if r["store"] == store
                  and r["tree"] == OTHER}  # fmt: skip
        ratio = statistics.median(mine[k] / theirs[k] for k in mine if k in theirs)
        lines.append(
            f"| {store} | {statistics.median(mine.values()):.1f} "
            f"[{min(mine.values()):.1f}-{max(mine.values()):.1f}] | "
            f"{statistics.median(theirs.values()):.1f} "
            f"[{min(theirs.values()):.1f}-{max(theirs.values()):.1f}] | {ratio:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--other", required=True, help="the other tree's environment's python")
    p.add_argument("--engines", nargs="+", default=list(ALL), choices=list(ALL))
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None, help="write versus.jsonl and versus.md here")
    args = p.parse_args()
    if args.jobs < 1 or args.repeats < 1:
        p.error("--jobs and --repeats take a whole number of at least 1")
    info = meta.collect()
    info.update(this=tree_commit(sys.executable), other=tree_commit(args.other),
                repeats=args.repeats)  # fmt: skip
    rows = [{**r, "meta": info} for r in measure(args.other, args.engines, args.jobs,
                                                 args.repeats)]  # fmt: skip
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / "versus.jsonl"
        if path.exists():  # the engines this run left out keep their last rows
            kept = [json.loads(line) for line in path.read_text().splitlines() if line]
            rows = [r for r in kept if r["store"] not in args.engines] + rows
        with open(path, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        (out / "versus.md").write_text(report(rows))
    print(report(rows))


if __name__ == "__main__":
    main()
