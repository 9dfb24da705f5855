"""G. Recovery time against log size, and walq's log over a long run with compaction."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import uvloop

from sqlq.bench.client.http import HttpPool
from sqlq.bench.client.loadgen import job_body, run_load
from sqlq.bench.client.server import ServerProcess
from sqlq.bench.experiments.base import DURABLE, NAMES, BenchRun, Run
from sqlq.bench.experiments.rows import Latency, Row
from sqlq.bench.report import Report, cell, group, med

NAME = "G"


class RecoveryRow(Row, kw_only=True):
    """Both parts of G share a file; ``params['part']`` tells them apart."""

    transitions: int = 0
    data_bytes: int = 0
    build_s: float = 0.0
    ready_s: float = 0.0
    recovery: dict[str, Any] = msgspec.field(default_factory=dict)
    # the compaction part
    jobs: int = 0
    compactions: int = 0
    max_log_bytes: int = 0
    final_log_bytes: int = 0
    max_compaction_stall_ms: float = 0.0
    log_samples: list[tuple[float, int]] = msgspec.field(default_factory=list)
    submit_latency: Latency | None = None


ROW = RecoveryRow


@dataclass(frozen=True)
class Summary:
    recovery_s: dict[tuple[str, int], float]  # (store, transitions) -> recovery seconds


@dataclass(frozen=True, kw_only=True)
class RecoveryRun(Run):
    transitions: int

    def execute(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="sqlq-recovery-") as d:
            t0 = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "sqlq.bench.fill", "--store", self.store, "--data", d,
                 "--transitions", str(self.transitions)],
                check=True,
            )  # fmt: skip
            build_s = time.perf_counter() - t0
            size = sum(
                os.path.getsize(os.path.join(root, f))
                for root, _, files in os.walk(d)
                for f in files
            )
            srv = ServerProcess.engine(store=self.store, data_dir=d, workers=16)
            t1 = time.perf_counter()
            srv.start()
            ready_s = time.perf_counter() - t1
            try:
                with urllib.request.urlopen(srv.url + "/stats") as r:
                    stats = json.loads(r.read())
            finally:
                srv.cleanup()
        return {
            "label": self.label,
            "store": self.store,
            "transitions": self.transitions,
            "data_bytes": size,
            "build_s": round(build_s, 3),
            "ready_s": round(ready_s, 4),
            "recovery": stats["recovery"],
        }


@dataclass(frozen=True, kw_only=True)
class CompactionRun(Run):
    """A long walq run with a small compaction floor, sampling the log size."""

    jobs: int

    def execute(self) -> dict[str, Any]:
        flags = ("--compact-floor-mb", "1", "--retention", "1", "--workers", "64")
        with ServerProcess.engine(store="walq", flags=flags) as srv:
            return uvloop.run(self._go(srv.url))

    async def _go(self, url: str) -> dict[str, Any]:
        samples: list[tuple[float, int]] = []
        t0 = time.perf_counter()
        done = asyncio.Event()

        async def sampler() -> None:
            async with HttpPool(url, 1) as control:
                while not done.is_set():
                    _, stats = await control.json("GET", "/stats")
                    samples.append(
                        (round(time.perf_counter() - t0, 3), stats["store"]["log_bytes"])
                    )
                    await asyncio.sleep(0.05)

        task = asyncio.create_task(sampler())
        result = await run_load(
            url, jobs=self.jobs, concurrency=32, body=job_body(0, 0, 0, "sleep", 0),
            label=self.label, fetch_jobs=False,
        )  # fmt: skip
        done.set()
        await task
        st = result.pop("store_stats")
        return {
            **result,
            "log_samples": samples,
            "max_log_bytes": max(b for _, b in samples),
            "final_log_bytes": st["log_bytes"],
            "compactions": st["compactions"],
            "max_compaction_stall_ms": st["max_compaction_stall_ms"],
        }


def runs(quick: bool, stores: tuple[str, ...]) -> Iterator[BenchRun]:
    sizes = (3_000, 30_000) if quick else (10_000, 100_000, 1_000_000)
    for n in sizes:
        for store in stores:
            if store in DURABLE:
                yield RecoveryRun(
                    experiment=NAME, store=store, label=f"G/{store}/{n}", transitions=n,
                    params={"part": "recovery"},
                )  # fmt: skip
    if "walq" in stores:
        yield CompactionRun(
            experiment=NAME, store="walq", label="G/walq/compaction",
            jobs=3_000 if quick else 40_000, params={"part": "compaction"},
        )  # fmt: skip


def section(rep: Report) -> None:
    rows = rep.rows(NAME, RecoveryRow)
    if not rows:
        return
    rec = [r for r in rows if r.params["part"] == "recovery"]
    comp = [r for r in rows if r.params["part"] == "compaction"]
    rep.add(
        "## G. Recovery time and compaction",
        "",
        "Time from starting `sqlq serve` to `/readyz` = 200 on a data directory holding N "
        "transitions (jobs submitted, started, completed; 1 in 30 left scheduled), with "
        "the recovery step alone as `/stats` reports it.",
        "",
        "| store | transitions | data MB | restart to ready s | recovery s | live jobs |",
        "|---|---:|---:|---:|---:|---:|",
    )
    g = group(rec, lambda r: (r.store, r.transitions))
    for (s, n), rs in sorted(g.items(), key=lambda kv: (NAMES.index(kv[0][0]), kv[0][1])):
        rep.add(
            f"| {s} | {n:,} | {med(r.data_bytes for r in rs) / 1e6:.1f} | "
            f"{cell([r.ready_s for r in rs], '{:.3f}')} | "
            f"{cell([r.recovery['seconds'] for r in rs], '{:.3f}')} | "
            f"{cell([r.recovery['live_jobs'] for r in rs])} |"
        )
    rep.summaries[NAME] = Summary(
        {key: med(r.recovery["seconds"] for r in rs) for key, rs in g.items()}
    )

    def draw(ax: Any) -> None:
        for s in DURABLE:
            pts = sorted((n, med(r.ready_s for r in rs)) for (st, n), rs in g.items() if st == s)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=s)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("transitions in the store")
        ax.set_ylabel("restart to ready, s")
        ax.set_title("G. recovery time vs log size")
        ax.legend()

    rep.plot("G_recovery", draw)
    if not comp:
        return
    rep.add(
        "walq over a long run with compaction (`--compact-floor-mb 1 --retention 1`, "
        "no-op jobs, 64 workers): the log stays bounded while appends go on.",
        "",
        "| jobs | compactions | max log MB | final log MB | longest append stall in a "
        "switch, ms | submit p99 ms | submit max ms |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    )
    for r in comp:
        lat = r.submit_latency
        rep.add(
            f"| {r.jobs:,} | {r.compactions} | {r.max_log_bytes / 1e6:.2f} | "
            f"{r.final_log_bytes / 1e6:.2f} | {r.max_compaction_stall_ms:.2f} | "
            f"{lat.p99_ms if lat else float('nan'):.2f} | "
            f"{lat.max_ms if lat else float('nan'):.2f} |"
        )

    def draw_log(ax: Any) -> None:
        r = comp[-1]
        ax.plot([t for t, _ in r.log_samples], [b / 1e6 for _, b in r.log_samples])
        ax.set_xlabel("seconds")
        ax.set_ylabel("walq log MB")
        ax.set_title("G. walq log size over a run with compaction")

    rep.plot("G_walq_log", draw_log)
