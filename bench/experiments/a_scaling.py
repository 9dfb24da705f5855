"""A. Worker scaling: 2,000 x 20 ms jobs at 1..256 workers; efficiency = throughput / ideal."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlq.bench.experiments.base import DURABLE, NAMES, BenchRun, LoadRun
from sqlq.bench.experiments.rows import LoadRow
from sqlq.bench.report import Report, cell, group, med

NAME = "A"
ROW = LoadRow
BARS = ((16, 97.0), (64, 90.0))  # (workers, % of ideal) the durable engines must reach


def runs(quick: bool, stores: tuple[str, ...], workers: tuple[int, ...] = ()) -> Iterator[BenchRun]:
    counts = workers or ((16,) if quick else (1, 4, 16, 64, 256))
    jobs = 200 if quick else 2000
    for w in counts:
        # Below 16 workers submission is never the limit, so batch adds nothing there.
        modes = [("single", 32, 1)] + ([("batch", 4, 100)] if w >= 16 else [])
        for mode, conc, batch in modes:
            for store in stores:
                yield LoadRun(
                    experiment=NAME,
                    store=store,
                    label=f"A/{store}/w{w}/{mode}",
                    workers=w,
                    jobs=jobs,
                    concurrency=conc,
                    batch=batch,
                    params={"submit": mode, "ideal_jobs_s": w * 1000 / 20},
                )


def section(rep: Report) -> None:
    rows = rep.rows(NAME, LoadRow)
    if not rows:
        return
    rep.add(
        "## A. Worker scaling",
        "",
        "2,000 x 20 ms `sleep` jobs. Throughput = jobs / (first submit to last job done); "
        "efficiency = throughput / ideal (workers x 50 jobs/s). `single`: 32 clients, one "
        "job per `POST /jobs`; `batch`: 4 clients, 100 jobs per `POST /jobs/batch`.",
        "",
        "| workers | submit | ideal | " + " | ".join(f"{s} jobs/s (eff.)" for s in NAMES) + " |",
        "|---:|---|---:|" + "---:|" * len(NAMES),
    )
    g = group(rows, lambda r: (int(r.config["workers"]), str(r.params["submit"]), r.store))

    def efficiency(w: int, mode: str, s: str) -> float:
        return 100 * med(r.throughput_jobs_s for r in g.get((w, mode, s), [])) / (w * 50)

    for w, mode in sorted({(k[0], k[1]) for k in g}):
        cells = []
        for s in NAMES:
            v = [r.throughput_jobs_s for r in g.get((w, mode, s), [])]
            cells.append(f"{cell(v)} ({efficiency(w, mode, s):.1f}%)" if v else "-")
        rep.add(f"| {w} | {mode} | {w * 50:,} | " + " | ".join(cells) + " |")
    for w, need in BARS:
        for mode in ("single", "batch"):
            for s in DURABLE:
                if g.get((w, mode, s)):
                    eff = efficiency(w, mode, s)
                    rep.check(
                        f"A: {w} workers, {mode} submit, {s}",
                        f"{eff:.1f}% of ideal",
                        eff >= need,
                        f"bar {need:.0f}%",
                    )

    def draw(ax: Any) -> None:
        for s in NAMES:
            pts = sorted(
                (w, efficiency(w, mode, st)) for (w, mode, st) in g if st == s and mode == "single"
            )
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=s)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers")
        ax.set_ylabel("efficiency, % of ideal (single submit)")
        ax.set_title("A. worker scaling, 2,000 x 20 ms jobs")
        ax.legend()

    rep.plot("A_scaling", draw)
    # What the prose says is computed: the largest gap to the memory baseline at each size.
    counts = sorted({w for w, _, _ in g})
    small = [w for w in counts if w <= 16]
    if small and all(g.get((w, "single", "memory")) for w in small):
        gap = max(
            abs(efficiency(w, "single", s) - efficiency(w, "single", "memory"))
            for w in small
            for s in DURABLE
            if g.get((w, "single", s))
        )
        rep.add(
            f"Up to {max(small)} workers, the durable engines' single-submit efficiency is "
            f"within {gap:.1f} points of the memory baseline's in this run.",
            "",
        )
    for w in (64, 256):
        single = {s: efficiency(w, "single", s) for s in NAMES if g.get((w, "single", s))}
        batch = {s: efficiency(w, "batch", s) for s in NAMES if g.get((w, "batch", s))}
        if single and batch:
            rep.add(
                f"At {w} workers (ideal {w * 50:,} jobs/s) the server takes in every job over "
                "HTTP on the same event loop that runs the jobs: one job per POST gives "
                + ", ".join(f"{v:.1f}% ({s})" for s, v in single.items())
                + "; batch submission, which takes ingestion off the critical path, gives "
                + ", ".join(f"{v:.1f}% ({s})" for s, v in batch.items())
                + ".",
                "",
            )
