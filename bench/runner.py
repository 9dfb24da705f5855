"""``sqlq bench``: the comparative benchmark suite.

Every run starts a fresh ``sqlq serve`` subprocess with a fresh data directory
on a free port, drives it, and stops it. Within each repeat the engines
alternate (memory, walq, sqlite, memory, ...) so that drift on this shared
machine hits all of them alike. Each run is one JSON line in
``<out>/<experiment>.jsonl`` carrying the machine, versions and exact command;
each experiment's section (``sqlq.bench.experiments``) turns its lines into its part
of ``REPORT.md``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

from sqlq.bench import meta
from sqlq.bench.experiments import EXPERIMENTS, ORDER, BenchRun


def plan(
    only: tuple[str, ...], stores: tuple[str, ...], repeats: int, quick: bool,
    extra: dict[str, dict[str, Any]],
) -> list[tuple[str, int, BenchRun]]:  # fmt: skip
    runs = []
    for name in sorted(only, key=ORDER.index):
        for repeat in range(repeats):
            for run in EXPERIMENTS[name].runs(quick, stores, **extra.get(name, {})):
                runs.append((name, repeat, run))
    return runs


def run_suite(
    *,
    only: tuple[str, ...],
    stores: tuple[str, ...],
    repeats: int,
    quick: bool,
    out: Path,
    extra: dict[str, dict[str, Any]] | None = None,
    show_progress: bool = True,
) -> list[dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    info = meta.collect(str(out))
    info["quick"] = quick
    info["repeats"] = repeats
    runs = plan(only, stores, repeats, quick, extra or {})
    # Every experiment asked for starts its file afresh, even one with no runs here (a peer
    # not installed): rows an older tree left in it must not pass for this run's.
    files = {name: open(out / f"{name}.jsonl", "w") for name in only}
    rows: list[dict[str, Any]] = []
    bar = tqdm(runs, desc="sqlq bench", unit="run", disable=not show_progress)
    try:
        for name, repeat, run in bar:
            bar.set_postfix_str(run.label)
            t0 = time.perf_counter()
            row = run.execute()
            row.update(
                experiment=name,
                store=run.store,
                label=run.label,
                repeat=repeat,
                params=run.params,
                run_s=round(time.perf_counter() - t0, 3),
                meta=info,
            )
            files[name].write(json.dumps(row) + "\n")
            files[name].flush()
            rows.append(row)
    finally:
        for f in files.values():
            f.close()
    return rows
