"""I. Sensitivity to disk latency, EMULATED: what group commit does on slower disks."""

from __future__ import annotations

from collections.abc import Iterator

from sqlq.bench.experiments.base import DURABLE, NAMES, BenchRun, LoadRun
from sqlq.bench.experiments.rows import LoadRow
from sqlq.bench.report import Report, cell, group, med

NAME = "I"
ROW = LoadRow


def runs(quick: bool, stores: tuple[str, ...]) -> Iterator[BenchRun]:
    """The D run (20 ms jobs, single submit) with 0, 1, 5 ms of EMULATED sync delay."""
    jobs = 200 if quick else 2000
    for delay in (1,) if quick else (0, 1, 5):
        for gc in (True, False):
            for store in stores:
                if store in DURABLE:
                    yield LoadRun(
                        experiment=NAME,
                        store=store,
                        label=f"I/{store}/emulated-{delay}ms/gc-{'on' if gc else 'off'}",
                        jobs=jobs,
                        drain_timeout=300,
                        flags=("--emulate-sync-delay-ms", str(delay))
                        + (() if gc else ("--no-group-commit",)),
                        params={"emulated_sync_delay_ms": delay, "group_commit": gc},
                    )


def section(rep: Report) -> None:
    rows = rep.rows(NAME, LoadRow)
    if not rows:
        return
    rep.add(
        "## I. Sensitivity to disk latency (EMULATED)",
        "",
        "The D run (2,000 x 20 ms jobs, 16 workers, single submit) with an **emulated** "
        "delay added after each engine's sync at `--sync full` (`--emulate-sync-delay-ms`), "
        "to show how group commit behaves on disks slower than this machine's. These are "
        "not measurements of a real slower disk.",
        "",
        "| store | emulated delay ms | group commit | submit s | total s | jobs/s | mean batch |",
        "|---|---:|---|---:|---:|---:|---:|",
    )
    g = group(
        rows,
        lambda r: (r.store, r.params["emulated_sync_delay_ms"], bool(r.params["group_commit"])),
    )
    for (s, d, gc), rs in sorted(
        g.items(), key=lambda kv: (NAMES.index(kv[0][0]), kv[0][1], not kv[0][2])
    ):
        rep.add(
            f"| {s} | {d} | {'on' if gc else 'off'} | "
            f"{cell([r.submit_s for r in rs], '{:.2f}')} | "
            f"{cell([r.total_s for r in rs], '{:.2f}')} | "
            f"{cell([r.throughput_jobs_s for r in rs])} | "
            f"{med(r.store_stats.get('mean_batch', 0) for r in rs):.1f} |"
        )
    rep.add("")
