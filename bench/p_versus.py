"""Experiment P's remote no-op rows, this tree against another, side by side in one run.

P's remote no-op rows (``P/noop/<store>/remote``: two ``sqlq worker --concurrency 32``
against ``sqlq serve --workers 0``, the bar's row; ``remote-wide``: the same with a full
claim's 100 slots each) run the whole remote path, the server's claims and outcomes and
the worker's HTTP client alike, so a change to either side is judged by them: the two
trees' jobs/s (P's figure: to the last durable completion) in a ratio taken within each
pair of runs made back to back, the order alternating pair by pair, so the machine's load
falls on both. Each run is a fresh interpreter of its tree's environment (this one's, or
``--other``) with the safe path on, so the ``sqlq serve`` and ``sqlq worker`` it starts are
that tree's, never the one in the current directory. The rest of P (in-process, CPU,
latency) is not run.

    python -m sqlq.bench.p_versus --other /path/to/other/.venv/bin/python \\
        --repeats 3 --out results --name P-httpx

Writes ``NAME.jsonl`` (every run's row) and ``NAME.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sqlq.bench import meta
from sqlq.bench.experiments.p_remote import NOOP_JOBS, WIDE_SLOTS
from sqlq.bench.experiments.p_runs import REMOTE_WORKERS, WORKERS
from sqlq.bench.report import cell, med
from sqlq.bench.versus import tree_commit

THIS, OTHER = "this", "other"
# what a remote no-op job's calls run through, both ends; each environment's are said
CLIENT_STACK = ("httpx", "httpcore", "h11", "anyio", "uvicorn", "uvloop", "httptools", "msgspec")
WIDTHS = ("remote", "remote-wide")
# One run, in the tree whose interpreter runs it: P's own run object, by its label.
CHILD = """
import json, sys
from sqlq.bench.experiments.p_remote import runs
store, label = sys.argv[1], sys.argv[2]
run = next(r for r in runs(False, (store,)) if r.label == label)
print(json.dumps(run.execute()))
"""


def one(python: str, store: str, label: str) -> dict[str, Any]:
    """One run of ``label`` by ``python``'s tree, in a directory of its own."""
    env = {**os.environ, "PYTHONSAFEPATH": "1"}  # (the workers and server it starts too)
    with tempfile.TemporaryDirectory(prefix="sqlq-pv-") as d:
        done = subprocess.run([python, "-c", CHILD, store, label], cwd=d, env=env,
                              capture_output=True, text=True, timeout=900)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{label} by {python} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def stack_of(python: str) -> str:
    """The versions of ``CLIENT_STACK`` in ``python``'s environment, in words."""
    code = ("import importlib.metadata as m, sys\n"
            "for n in sys.argv[1:]:\n"
            "    try: print(n, m.version(n))\n"
            "    except m.PackageNotFoundError: pass\n")  # fmt: skip
    done = subprocess.run([python, "-P", "-c", code, *CLIENT_STACK], capture_output=True,
                          text=True, check=True)  # fmt: skip
    return ", ".join(done.stdout.split("\n")[:-1])


def rate(row: dict[str, Any]) -> float:
    """P's jobs/s: completed jobs over the first start to the last durable completion."""
    return float(row["completed"]) / float(row["done_s"])


def per_job_us(row: dict[str, Any], key: str) -> float:
    return 1e6 * float(row[key]) / float(row["completed"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--other", required=True, help="the other tree's environment's python")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--stores", default="walq,sqlite")
    p.add_argument("--out", default="results")
    p.add_argument("--name", default="P-versus")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = meta.collect(str(out))
    trees = {THIS: tree_commit(sys.executable), OTHER: tree_commit(args.other)}
    pythons = {THIS: sys.executable, OTHER: args.other}
    stores = tuple(args.stores.split(","))
    rows: list[dict[str, Any]] = []
    pair = 0
    with open(out / f"{args.name}.jsonl", "w") as f:
        for repeat in range(args.repeats):
            for store in stores:
                for width in WIDTHS:
                    label = f"P/noop/{store}/{width}"
                    order = (THIS, OTHER) if pair % 2 == 0 else (OTHER, THIS)
                    pair += 1
                    for tree in order:
                        row = one(pythons[tree], store, label)
                        row.update(tree=tree, commit=trees[tree], label=label, store=store,
                                   width=width, repeat=repeat, meta=info)  # fmt: skip
                        f.write(json.dumps(row) + "\n")
                        f.flush()
                        rows.append(row)
                        print(f"{label} {tree} {trees[tree]}: {rate(row):,.0f} jobs/s", flush=True)
    text = report(rows, args, info, trees, stores)
    (out / f"{args.name}.md").write_text(text)
    print(text)


def report(
    rows: list[dict[str, Any]],
    args: argparse.Namespace,
    info: dict[str, Any],
    trees: dict[str, str],
    stores: tuple[str, ...],
) -> str:
    lines = [
        f"# Experiment P's remote no-op rows: {trees[THIS]} against {trees[OTHER]}",
        "",
        "Produced by `python -m sqlq.bench.p_versus --other OTHER/.venv/bin/python "
        f"--repeats {args.repeats} --stores {','.join(stores)} --name {args.name}`; do not "
        f"edit by hand. This tree: {trees[THIS]}; the other: {trees[OTHER]}, each from its "
        f"own environment. Each row is P's run: {NOOP_JOBS:,} no-op jobs enqueued first, then "
        f"{REMOTE_WORKERS} `sqlq worker` processes (`--concurrency {WORKERS // REMOTE_WORKERS}`: "
        f"`remote`; {WIDE_SLOTS}: `remote-wide`) against "
        "`sqlq serve --workers 0`, `--sync full`, over 127.0.0.1; jobs/s to the last durable "
        "completion, CPU per job of the server and of both workers. The two trees' runs of "
        "a row go back to back, the order alternating pair by pair; ratios are taken within "
        "each pair, medians [min-max] over the repeats.",
        "",
        f"- machine: {info.get('cpu', '?')}, {info.get('cores', '?')} cores; "
        f"{info.get('platform', '?')}",
        f"- Python {info.get('python', '?')}; {trees[THIS]}'s environment: "
        f"{stack_of(sys.executable)}; {trees[OTHER]}'s: {stack_of(args.other)}",
        "",
        f"| row | jobs/s {trees[THIS]} | jobs/s {trees[OTHER]} | jobs/s ratio | "
        f"worker CPU us/job {trees[THIS]} | worker CPU us/job {trees[OTHER]} | "
        f"server CPU us/job {trees[THIS]} | server CPU us/job {trees[OTHER]} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    verdicts = []
    for store in stores:
        for width in WIDTHS:
            label = f"P/noop/{store}/{width}"
            mine = [r for r in rows if r["label"] == label]
            by = {t: [r for r in mine if r["tree"] == t] for t in (THIS, OTHER)}
            ratios = []
            for repeat in sorted({r["repeat"] for r in mine}):
                a = [rate(r) for r in by[THIS] if r["repeat"] == repeat]
                b = [rate(r) for r in by[OTHER] if r["repeat"] == repeat]
                if a and b:
                    ratios.append(a[0] / b[0])
            lines.append(
                f"| {label} | {cell([rate(r) for r in by[THIS]])} | "
                f"{cell([rate(r) for r in by[OTHER]])} | {cell(ratios, '{:.3f}')} | "
                f"{cell([per_job_us(r, 'worker_cpu_s') for r in by[THIS]])} | "
                f"{cell([per_job_us(r, 'worker_cpu_s') for r in by[OTHER]])} | "
                f"{cell([per_job_us(r, 'server_cpu_s') for r in by[THIS]])} | "
                f"{cell([per_job_us(r, 'server_cpu_s') for r in by[OTHER]])} |"
            )
            verdicts.append(f"- {label}: {trees[THIS]} / {trees[OTHER]} jobs/s "
                            f"**{med(ratios):.3f}x** (pairs: "
                            f"{', '.join(f'{x:.3f}' for x in ratios)})")  # fmt: skip
    loads = [x for r in rows for x in (r.get("load_before"), r.get("load_after")) if x is not None]
    lines += ["", "Median ratios of jobs/s, within each pair:", "", *verdicts, ""]
    if loads:
        lines += [f"The machine's 1-minute load average around the runs: {cell(loads, '{:.1f}')}.",
                  ""]  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
