"""Build ``results/REPORT.md`` from the ``results/*.jsonl`` files of a real run.

Every number in the report is computed here from the JSON lines; nothing is
typed in by hand. ``sqlq bench --report-only`` reruns just this.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

Rows = list[dict[str, Any]]
STORE_ORDER = ("memory", "walq", "sqlite")


def load(out: Path, name: str) -> Rows:
    path = out / f"{name}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def cell(values: list[float], fmt: str = "{:,.0f}") -> str:
    if not values:
        return "-"
    m = med(values)
    if len(values) == 1:
        return fmt.format(m)
    return f"{fmt.format(m)} [{fmt.format(min(values))}-{fmt.format(max(values))}]"


def spread(values: list[float]) -> float:
    m = med(values)
    return (max(values) - min(values)) / m if values and m else 0.0


def machine(rows: Rows) -> list[str]:
    if not rows:
        return []
    m = rows[0]["meta"]
    pk = ", ".join(f"{k} {v}" for k, v in m["packages"].items())
    return [
        f"- machine: {m['cpu']}, {m['cores']} cores; disk {m['disk']}; {m['platform']}",
        f"- Python {m['python']}; {pk}",
        f"- git commit {m['git_commit']}; command: `{m['command']}`",
    ]


def section_a(rows: Rows) -> list[str]:
    if not rows:
        return []
    out = [
        "## A. Worker scaling",
        "",
        "2,000 x 20 ms `sleep` jobs; throughput = jobs / (first submit to last job done); "
        "efficiency = throughput / ideal (workers x 50 jobs/s). `single`: 32 clients, one "
        "job per POST; `batch`: 4 clients, 100 jobs per `POST /jobs/batch`. Medians "
        f"[min-max] over {max(r['repeat'] for r in rows) + 1} repeats.",
        "",
        "| workers | submit | ideal jobs/s | "
        + " | ".join(f"{s} jobs/s (eff.)" for s in STORE_ORDER)
        + " |",
        "|---:|---|---:|" + "---:|" * len(STORE_ORDER),
    ]
    groups: dict[tuple[int, str, str], list[float]] = defaultdict(list)
    for r in rows:
        groups[(r["config"]["workers"], r["params"]["submit"], r["store"])].append(
            r["throughput_jobs_s"]
        )
    keys = sorted({(w, mode) for w, mode, _ in groups})
    for w, mode in keys:
        ideal = w * 50
        cells = []
        for s in STORE_ORDER:
            v = groups.get((w, mode, s), [])
            cells.append(f"{cell(v)} ({100 * med(v) / ideal:.1f}%)" if v else "-")
        out.append(f"| {w} | {mode} | {ideal:,} | " + " | ".join(cells) + " |")
    out += [
        "",
        "Against the bar (>= 97% of ideal at 16 workers, >= 90% at 64; walq and "
        "sqlite, `--sync full`):",
        "",
    ]
    for w, need in ((16, 97.0), (64, 90.0)):
        for mode in ("single", "batch"):
            for s in ("walq", "sqlite"):
                v = groups.get((w, mode, s), [])
                if v:
                    eff = 100 * med(v) / (w * 50)
                    verdict = "met" if eff >= need else "NOT met"
                    out.append(f"- {w} workers, {mode} submit, {s}: {eff:.1f}% ({verdict})")
    return [*out, ""]


SECTIONS: list[tuple[str, Callable[[Rows], list[str]]]] = [("A", section_a)]


def build(out: Path) -> str:
    lines = [
        "# sqlq benchmark report",
        "",
        "Produced by `sqlq bench` / `python -m bench.report` from the `*.jsonl` files "
        "beside it; do not edit numbers by hand. Absolute numbers drift on this shared "
        "2-core machine; compare the engines side by side within one run.",
        "",
    ]
    first = True
    for name, make in SECTIONS:
        rows = load(out, name)
        if rows and first:
            lines += [*machine(rows), ""]
            first = False
        lines += make(rows)
    text = "\n".join(lines) + "\n"
    (out / "REPORT.md").write_text(text)
    return text


if __name__ == "__main__":
    import sys

    print(build(Path(sys.argv[1] if len(sys.argv) > 1 else "results")))
