"""``sqlq serve --processes 2`` against ``--processes 0`` on a CPU-bound plain handler.

Experiment P's two server rows alone (``P/cpu/sqlq-local-w2``: two in-process worker
threads; ``P/cpu/sqlq-serve-p2``: the server's own workers, the handler in two worker
processes), alternated within each repeat so the machine's load falls on both, without
the rest of P (its no-op and latency parts take most of an hour). The ratio is taken
within each repeat; the median is reported.

    python -m sqlq.bench.p_serve --repeats 3 --out results

Writes ``P-serve.jsonl`` and ``P-serve.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from sqlq.bench import meta
from sqlq.bench.experiments.p_remote import CPU_STORE, SCALE_BAR, cpu_runs

THREADS, PROCESSES = "P/cpu/sqlq-local-w2", "P/cpu/sqlq-serve-p2"


def rate(row: dict[str, Any]) -> float:
    """Jobs over the handlers' own first start to last end, as P reads it."""
    return float(row["completed"]) / float(row["drain_s"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="results")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = meta.collect(str(out))
    runs = {r.label: r for r in cpu_runs(False, CPU_STORE)}
    rows: list[dict[str, Any]] = []
    with open(out / "P-serve.jsonl", "w") as f:
        for repeat in range(args.repeats):
            order = (THREADS, PROCESSES) if repeat % 2 == 0 else (PROCESSES, THREADS)
            for label in order:
                row = runs[label].execute()
                row.update(label=label, repeat=repeat, store=CPU_STORE, meta=info)
                f.write(json.dumps(row) + "\n")
                f.flush()
                rows.append(row)
    ratios = []
    for repeat in range(args.repeats):
        mine = {r["label"]: r for r in rows if r["repeat"] == repeat}
        ratios.append(rate(mine[PROCESSES]) / rate(mine[THREADS]))
    med = statistics.median(ratios)
    lines = [
        "# A CPU-bound plain handler: `sqlq serve --processes 2` against threads",
        "",
        "Produced by `python -m sqlq.bench.p_serve`; do not edit by hand. "
        f"{rows[0]['jobs']} jobs of `sqlq.bench.spinkind.spin` on {CPU_STORE}, enqueued on a "
        "paused queue, then drained; jobs/s over the handlers' own first start to last end. "
        f"{args.repeats} repeats, the two runs alternated within each.",
        "",
        f"- tree {info.get('git_commit', '?')}; Python {info.get('python', '?')}; "
        f"CPU: {info.get('cpu', '?')}",
        "",
        "| repeat | threads (`--workers 2`) jobs/s | `--processes 2` (`--workers 4`) jobs/s "
        "| processes / threads |",
        "|---:|---:|---:|---:|",
    ]
    for repeat, ratio in enumerate(ratios):
        mine = {r["label"]: r for r in rows if r["repeat"] == repeat}
        lines.append(f"| {repeat} | {rate(mine[THREADS]):.1f} | {rate(mine[PROCESSES]):.1f} "
                     f"| {ratio:.2f} |")  # fmt: skip
    verdict = "met" if med >= SCALE_BAR else "NOT met"
    lines += ["", f"Median ratio: **{med:.2f}x** (bar >= {SCALE_BAR:.1f}x: {verdict})."]
    (out / "P-serve.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
