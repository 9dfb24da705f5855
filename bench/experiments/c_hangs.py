"""C. 1% of jobs hang; without the health check their workers are lost for good."""

from __future__ import annotations

from collections.abc import Iterator

from sqlq.bench.experiments.base import BenchRun, off_on_table, off_then_on
from sqlq.bench.experiments.rows import LoadRow
from sqlq.bench.report import Report

NAME = "C"
ROW = LoadRow


def runs(quick: bool, stores: tuple[str, ...]) -> Iterator[BenchRun]:
    return off_then_on(
        NAME, "health", "healthcheck", "--no-healthcheck", stores,
        flags=("--seed", "7"), off_drain=2.0 if quick else 20.0,
        jobs=200 if quick else 2000, hang_prob=0.02 if quick else 0.01,
    )  # fmt: skip


def section(rep: Report) -> None:
    rows = rep.rows(NAME, LoadRow)
    if not rows:
        return
    rep.add(
        "## C. 1% hanging jobs, health check off vs on",
        "",
        "2,000 x 20 ms jobs at 16 workers; each attempt hangs forever (no heartbeat) with "
        "probability 0.01. Health check off: the run is cut at 20 s. On: a worker silent "
        "for 200 ms is declared hung, its job requeued with a new epoch, a replacement "
        "started.",
        "",
        "| store | health check | completed % | total s | requeued as hung |",
        "|---|---|---:|---:|---:|",
    )
    off_on_table(
        rep,
        rows,
        "healthcheck",
        [("completion_pct", "{:.2f}"), ("total_s", "{:.2f}"), ("requeued", "{:,.0f}")],
    )
    rep.add("")
