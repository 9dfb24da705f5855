"""B. Retries off vs on, with 20% of attempts failing on purpose."""

from __future__ import annotations

from collections.abc import Iterator

from sqlq.bench.experiments.base import BenchRun, off_on_table, off_then_on
from sqlq.bench.experiments.rows import LoadRow
from sqlq.bench.report import Report, med

NAME = "B"
ROW = LoadRow
FAIL_PROB = 0.2
ATTEMPTS = 5


def runs(quick: bool, stores: tuple[str, ...]) -> Iterator[BenchRun]:
    return off_then_on(
        NAME, "retries", "retries", "--no-retries", stores,
        jobs=200 if quick else 2000, fail_prob=FAIL_PROB,
    )  # fmt: skip


def section(rep: Report) -> None:
    rows = rep.rows(NAME, LoadRow)
    if not rows:
        return
    rep.add(
        "## B. Retries off vs on, 20% injected failures",
        "",
        f"2,000 x 20 ms jobs at 16 workers, each attempt failing with probability {FAIL_PROB}; "
        f"retries on: up to {ATTEMPTS} attempts with backoff from 10 ms.",
        "",
        "| store | retries | completed % | dead | retried | total s |",
        "|---|---|---:|---:|---:|---:|",
    )
    off_on_table(
        rep,
        rows,
        "retries",
        [("completion_pct", "{:.2f}"), ("dead", "{:,.0f}"), ("retried", "{:,.0f}"),
         ("total_s", "{:.2f}")],
    )  # fmt: skip
    on = med(r.completion_pct for r in rows if r.params["retries"])
    off = med(r.completion_pct for r in rows if not r.params["retries"])
    rep.add(
        "",
        f"Expected: {100 * (1 - FAIL_PROB):.0f}% completed without retries and "
        f"{100 * (1 - FAIL_PROB**ATTEMPTS):.2f}% (1 - {FAIL_PROB}^{ATTEMPTS}) with; measured "
        f"{off:.2f}% and {on:.2f}% (medians over every engine).",
        "",
    )
