"""F. Real CPU jobs: chained SHA-256 in a process pool, at 1..16 workers."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlq.bench.experiments.base import BenchRun, LoadRun
from sqlq.bench.experiments.rows import LoadRow
from sqlq.bench.report import Report, cell, group, med

NAME = "F"
ROW = LoadRow


def runs(quick: bool, stores: tuple[str, ...]) -> Iterator[BenchRun]:
    """Storage does not matter for CPU-bound jobs, so this runs on one engine (the
    default, sqlite). At the most workers it also runs with heartbeats suppressed while
    a job waits for a free process, which is what a naive design does."""
    jobs, rounds = (10, 50_000) if quick else (200, 500_000)
    store = "sqlite" if "sqlite" in stores else stores[0]
    counts = (1, 4) if quick else (1, 2, 4, 16)
    variants = [(w, True) for w in counts] + [(counts[-1], False)]
    for w, beat in variants:
        yield LoadRun(
            experiment=NAME,
            store=store,
            label=f"F/{store}/w{w}" + ("" if beat else "/naive"),
            workers=w,
            jobs=jobs,
            kind="cpu",
            rounds=rounds,
            concurrency=4,
            batch=50,
            drain_timeout=600,
            flags=() if beat else ("--no-cpu-beat-while-queued",),
            params={"beat_while_queued": beat},
        )


def _done_rate(r: LoadRow) -> float:
    return r.done / r.total_s if r.total_s else 0.0


def section(rep: Report) -> None:
    rows = rep.rows(NAME, LoadRow)
    if not rows:
        return
    r0 = rows[0]
    rep.add(
        "## F. Real CPU jobs",
        "",
        f"{r0.config['jobs']} jobs of {r0.config.get('rounds', 500_000):,} chained SHA-256 "
        f"rounds in a process pool of one process per core ({rep.cores} cores here), on the "
        f"{r0.store} engine (storage does not matter for CPU-bound work). `naive`: the job "
        "only heartbeats once its process reports progress, not while it waits for a free "
        "process.",
        "",
        "| workers | heartbeat while queued | completed jobs/s | completed % | "
        "requeued as hung | total s |",
        "|---:|---|---:|---:|---:|---:|",
    )
    g = group(rows, lambda r: (int(r.config["workers"]), bool(r.params["beat_while_queued"])))
    for (w, beat), rs in sorted(g.items()):
        rep.add(
            f"| {w} | {'yes' if beat else 'no (naive)'} | "
            f"{cell([_done_rate(r) for r in rs], '{:.1f}')} | "
            f"{cell([r.completion_pct for r in rs], '{:.1f}')} | "
            f"{cell([r.requeued for r in rs])} | "
            f"{cell([r.total_s for r in rs], '{:.1f}')} |"
        )
    ok = {w: med(_done_rate(r) for r in rs) for (w, b), rs in g.items() if b}
    naive = {w: med(_done_rate(r) for r in rs) for (w, b), rs in g.items() if not b}
    naive_pct = {w: med(r.completion_pct for r in rs) for (w, b), rs in g.items() if not b}
    requeued_ok = sum(r.requeued for (_, b), rs in g.items() if b for r in rs)
    if ok and naive:
        w = max(naive)
        one, best = ok.get(1, float("nan")), max(ok.values())
        rep.add(
            "",
            f"One worker completes {one:.1f} jobs/s; the best worker count completes "
            f"{best:.1f} ({best / one:.2f}x), with {rep.cores} cores doing the work and more "
            f"workers only queueing for them. Jobs waiting for a core keep beating, so "
            f"{requeued_ok} were requeued as hung across these runs. With the naive "
            f"heartbeat at {w} workers, jobs waiting for a core go silent, are declared hung "
            f"and requeued, and the requeued attempts compete for the same cores: "
            f"{naive_pct[w]:.1f}% complete ({naive[w]:.1f} jobs/s against "
            f"{ok.get(w, float('nan')):.1f}).",
        )

    def draw(ax: Any) -> None:
        pts = sorted(ok.items())
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label="beat while queued")
        if naive:
            npts = sorted(naive.items())
            ax.plot([p[0] for p in npts], [p[1] for p in npts], "rx", ms=10, label="naive")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers")
        ax.set_ylabel("jobs/s")
        ax.set_title(f"F. CPU jobs on {rep.cores} cores")
        ax.legend()

    rep.plot("F_cpu", draw)
