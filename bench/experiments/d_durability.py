"""D. The cost of durability: engine x sync level x group commit, against memory.

``results/versus-before/D-before.jsonl`` is the same experiment run on the tree before
a change to an engine (memory and that engine only), its repeats interleaved with the
current tree's; the section sets the two side by side, each against its own run's memory.
Today's: SQLite on aiosqlite's connection, against the plain thread that owned a sqlite3
connection before it.
"""

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
CPU_BAR = 1.05  # an engine change: CPU per no-op job, x the tree's before it


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


def _drift(before: dict[Key, list[LoadRow]], now: Summary, workload: str) -> str:
    """Memory's CPU per job in the current run over the before run's, in ``workload``."""
    base, mem = before.get(Key(workload, "memory", "full", True)), now.get(workload, "memory")
    if not base or mem is None:
        return f"- ({workload})"
    return f"{mem.cpu_us_per_job / med(r.cpu_us_per_job for r in base):.2f}x ({workload})"


def _before_after(rep: Report, now: Summary) -> None:
    """The engines ``D-before`` ran, cell by cell against the current rows."""
    before = rep.rows(f"{NAME}-before", LoadRow)
    stores = sorted({r.store for r in before} - {"memory"}, key=NAMES.index)
    if not before or not stores:
        return
    g = group(before, _key)
    commits = sorted({str(r.meta.get("git_commit", "?")) for r in before})
    current = rep.rows(NAME, LoadRow)
    after = sorted({str(r.meta.get("git_commit", "?")) for r in current if r.store in stores})
    rep.add(
        "",
        f"### D, before and after: {', '.join(stores)}",
        "",
        f"`before` ran on {', '.join(commits)}, the tree before the change (for SQLite: a "
        "plain thread owning a sqlite3 connection), `after` on "
        f"{', '.join(after)} (SQLite on aiosqlite's connection through its public API; "
        "what a batch costs there, by commit, is in results/engines.md), "
        f"{len({r.repeat for r in before})} repeats interleaved with the current tree's. "
        "Each `x memory` is against the memory baseline of its own run.",
        "",
        "| workload | store | sync | group commit | CPU us/job before | after | after/before "
        "| CPU x memory before | after | total x memory before | after |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    )
    ratios: dict[Key, float] = {}  # CPU per job, after over before
    normal: dict[Key, float] = {}  # the same, each first over its own run's memory CPU
    for key in sorted(g, key=lambda k: (k.workload, NAMES.index(k.store), k.sync,
                                        not k.group_commit)):  # fmt: skip
        cell_now = now.cells.get(key)
        base = g.get(Key(key.workload, "memory", "full", True), [])
        if key.store == "memory" or cell_now is None or not base:
            continue
        rs = g[key]
        cpu = med(r.cpu_us_per_job for r in rs)
        total_x = med(r.total_s for r in rs) / med(r.total_s for r in base)
        ratios[key] = cell_now.cpu_us_per_job / cpu
        mem_now = now.get(key.workload, "memory")
        cpu_x = cpu / med(r.cpu_us_per_job for r in base)
        cpu_x_now = cell_now.cpu_us_per_job / mem_now.cpu_us_per_job if mem_now else 0.0
        normal[key] = cpu_x_now / cpu_x
        rep.add(
            f"| {key.workload} | {key.store} | {key.sync} | "
            f"{'on' if key.group_commit else 'off'} | {cell([r.cpu_us_per_job for r in rs])} | "
            f"{cell_now.cpu_us_per_job:,.0f} | {ratios[key]:.2f} | {cpu_x:.2f} | "
            f"{cpu_x_now:.2f} | {total_x:.2f} | {cell_now.total_x:.2f} |"
        )
    if not ratios:
        return
    on = [v for k, v in ratios.items() if k.group_commit]
    off = [v for k, v in ratios.items() if not k.group_commit]
    rep.add(
        "",
        f"CPU per job, after over before, median over the cells: {med(on):.2f} with group "
        f"commit (range {min(on):.2f}-{max(on):.2f})"
        + (f", {med(off):.2f} without it (range {min(off):.2f}-{max(off):.2f})" if off else "")
        + f". Over each run's own memory CPU first (which cancels the machine's drift "
        f"between the runs): {med(list(normal.values())):.2f} (range "
        f"{min(normal.values()):.2f}-{max(normal.values()):.2f}). Memory's own CPU per job, "
        "which no change touched, moved by "
        + ", ".join(_drift(g, now, wl) for wl in sorted({k.workload for k in ratios}))
        + " between the two trees' runs.",
    )
    for store in stores:
        key = Key("noop-single", store, "full", True)
        if key in ratios:
            rep.check(
                f"D: {store} CPU per no-op job against the tree before the change "
                "(noop-single, `--sync full`, group commit)",
                f"{ratios[key]:.2f}x",
                ratios[key] <= CPU_BAR,
                f"bar <= {CPU_BAR}x",
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
        "holds best on a shared machine. `writing s`: the group-commit batches written during "
        "the submit phase (the submits, and the workers' commits beside them), each from its "
        "write to durable, summed (the server's `sqlq_store_commit_seconds`): the time the "
        "engine's one writer was writing; `share` is that over the phase, the median of the "
        "repeats' own. With group commit and one job per POST, a batch holds nearly every "
        "client's job and they all wait while it is written "
        "(`results/D-write-0753204/`: there the phase is that writing and the loop's work "
        "between the batches, one after the other).",
        "",
        "| workload | store | sync | group commit | submit s | x memory | writing s | share | "
        "total s | x memory | CPU us/job | syncs | mean batch |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
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
            timed = [r for r in rs if r.submit_commit_s is not None and r.submit_s > 0]
            waits = [r.submit_commit_s for r in timed if r.submit_commit_s is not None]
            wait = f"{cell(waits, '{:.3f}')} | " if durable and waits else "- | "
            shares = [(r.submit_commit_s or 0.0) / r.submit_s for r in timed]
            rest = f"{med(shares):.2f} | " if durable and shares else "- | "
            rep.add(
                f"| {wl} | {key.store} | {key.sync} | {'on' if key.group_commit else 'off'} | "
                f"{cell([r.submit_s for r in rs], '{:.3f}')} | {sub / b_sub:.2f} | {wait}{rest}"
                f"{cell([r.total_s for r in rs], '{:.3f}')} | {tot / b_tot:.2f} | "
                f"{cell([r.cpu_us_per_job for r in rs])} | {syncs} | {batch} |"
            )
    summary = Summary(cells)
    rep.summaries[NAME] = summary
    _before_after(rep, summary)
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
