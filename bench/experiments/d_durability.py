"""D. The cost of durability: engine x sync level x group commit, against memory."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlq.bench.experiments.base import DURABLE, NAMES, BenchRun, LoadRun
from sqlq.bench.experiments.rows import LoadRow
from sqlq.bench.report import Report, cell, group, med

NAME = "D"
ROW = LoadRow
SUBMIT_BAR = 1.25  # durable submit phase, x memory's, with group commit at --sync full


class Key(NamedTuple):
    workload: str
    store: str
    sync: str
    group_commit: bool


@dataclass(frozen=True)
class Cell:
    submit_x: float  # submit phase, x memory's in the same workload
    total_x: float  # first submit to last job done, x memory's
    total_s: float
    cpu_us_per_job: float  # server process CPU (all threads) per job


@dataclass(frozen=True)
class Summary:
    cells: dict[Key, Cell]

    def get(self, workload: str, store: str, sync: str = "full", gc: bool = True) -> Cell | None:
        return self.cells.get(Key(workload, store, sync, gc))


def runs(quick: bool, stores: tuple[str, ...]) -> Iterator[BenchRun]:
    jobs = 200 if quick else 2000
    workloads = [("20ms-single", 20, 32, 1), ("20ms-batch", 20, 4, 100), ("noop-single", 0, 32, 1)]
    if quick:
        workloads = workloads[:1]
    syncs = ("full",) if quick else ("os", "full")
    for name, work_ms, conc, batch in workloads:
        variants: list[tuple[str, str, bool]] = []
        if "memory" in stores:
            variants.append(("memory", "full", True))
        for sync in syncs:
            for gc in (True, False):
                variants += [(s, sync, gc) for s in stores if s in DURABLE]
        for store, sync, gc in variants:
            yield LoadRun(
                experiment=NAME,
                store=store,
                label=f"D/{name}/{store}/{sync}/gc-{'on' if gc else 'off'}",
                sync=sync,
                jobs=jobs,
                work_ms=work_ms,
                concurrency=conc,
                batch=batch,
                flags=() if gc else ("--no-group-commit",),
                params={"workload": name, "group_commit": gc},
            )


def _key(r: LoadRow) -> Key:
    return Key(
        str(r.params["workload"]), r.store, str(r.config["sync"]), bool(r.params["group_commit"])
    )


def section(rep: Report) -> None:
    rows = rep.rows(NAME, LoadRow)
    if not rows:
        return
    rep.add(
        "## D. The cost of durability",
        "",
        "2,000 jobs at 16 workers. Workloads: `20ms-single` (20 ms jobs, 32 clients, one "
        "job per POST), `20ms-batch` (4 clients, 100 per POST), `noop-single` (0 ms jobs: "
        "where storage cost shows most). `gc-off` commits every transition on its own "
        "(one fsync or one SQLite commit each, the seed design's fsync-per-submit). "
        "Ratios are against the memory baseline of the same workload in the same run. "
        "`CPU us/job`: server process CPU time, all threads, per job, the figure that "
        "holds best on a shared machine.",
        "",
        "| workload | store | sync | group commit | submit s | x memory | total s | "
        "x memory | CPU us/job | syncs | mean batch |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    )
    g = group(
        rows,
        lambda r: Key(
            str(r.params["workload"]),
            r.store,
            str(r.config["sync"]),
            bool(r.params["group_commit"]),
        ),
    )
    cells: dict[Key, Cell] = {}
    for wl in sorted({k.workload for k in g}):
        base = g.get(Key(wl, "memory", "full", True), [])
        b_sub, b_tot = med(r.submit_s for r in base), med(r.total_s for r in base)
        keys = sorted(
            (k for k in g if k.workload == wl),
            key=lambda k: (NAMES.index(k.store), k.sync, not k.group_commit),
        )
        for key in keys:
            rs = g[key]
            sub, tot = med(r.submit_s for r in rs), med(r.total_s for r in rs)
            cpu = med(r.cpu_us_per_job for r in rs)
            cells[key] = Cell(sub / b_sub, tot / b_tot, tot, cpu)
            durable = key.store in DURABLE
            syncs = f"{med(r.durable_syncs for r in rs):,.0f}" if durable else "-"
            batch = f"{med(r.store_stats.get('mean_batch', 0) for r in rs):.1f}" if durable else "-"
            rep.add(
                f"| {wl} | {key.store} | {key.sync} | {'on' if key.group_commit else 'off'} | "
                f"{cell([r.submit_s for r in rs], '{:.3f}')} | {sub / b_sub:.2f} | "
                f"{cell([r.total_s for r in rs], '{:.3f}')} | {tot / b_tot:.2f} | "
                f"{cell([r.cpu_us_per_job for r in rs])} | {syncs} | {batch} |"
            )
    summary = Summary(cells)
    rep.summaries[NAME] = summary
    for s in DURABLE:
        c = summary.get("20ms-single", s)
        if c is not None:
            rep.check(
                f"D: {s} `--sync full` with group commit, submit phase",
                f"{c.submit_x:.2f}x memory's",
                c.submit_x <= SUBMIT_BAR,
                f"bar <= {SUBMIT_BAR}x",
            )

    def draw(ax: Any) -> None:
        labels, vals, colors = [], [], []
        palette = {"walq": "tab:orange", "sqlite": "tab:green"}
        for s in DURABLE:
            for sync in ("os", "full"):
                for gc in (True, False):
                    c = summary.get("noop-single", s, sync, gc)
                    if c is not None:
                        labels.append(f"{s}\n{sync}\ngc {'on' if gc else 'off'}")
                        vals.append(c.total_x)
                        colors.append(palette.get(s, "tab:blue"))
        ax.bar(range(len(vals)), vals, color=colors)
        ax.set_xticks(range(len(vals)), labels, fontsize=7)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_ylabel("total time, x memory baseline")
        ax.set_title("D. no-op jobs end to end: what durability costs")

    rep.plot("D_durability", draw)
