"""H. Latency under steady load: open-loop arrivals at fractions of each engine's peak."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import uvloop

from sqlq.bench.client.loadgen import job_body, run_load
from sqlq.bench.client.server import ServerProcess
from sqlq.bench.experiments.base import NAMES, BenchRun, Run
from sqlq.bench.experiments.rows import Latency, Row
from sqlq.bench.report import Report, med

NAME = "H"


class Point(msgspec.Struct, kw_only=True):
    fraction: float
    rate: float
    submit_rate_req_s: float = 0.0
    submit_latency: Latency
    queue_to_start_p50_ms: float | None = None
    queue_to_start_p99_ms: float | None = None


class LatencyRow(Row, kw_only=True):
    peak_jobs_s: float
    points: list[Point]


ROW = LatencyRow


@dataclass(frozen=True, kw_only=True)
class LatencyRun(Run):
    """Measure the closed-loop peak, then open-loop arrivals at fractions of it."""

    fractions: tuple[float, ...]
    seconds: float
    peak_jobs: int = 3000

    def execute(self) -> dict[str, Any]:
        body = job_body(0, 0, 0, "sleep", 0)
        flags = ("--workers", "64")
        with ServerProcess.engine(store=self.store, flags=flags) as srv:
            peak = uvloop.run(
                run_load(srv.url, jobs=self.peak_jobs, concurrency=32, body=body, fetch_jobs=False)
            )
        peak_rate = peak["throughput_jobs_s"]
        points = []
        for frac in self.fractions:
            rate = peak_rate * frac
            with ServerProcess.engine(store=self.store, flags=flags) as srv:
                r = uvloop.run(
                    run_load(
                        srv.url, jobs=max(200, int(rate * self.seconds)), rate=rate,
                        concurrency=32, body=body,
                    )
                )  # fmt: skip
            r.pop("store_stats")
            points.append({"fraction": frac, "rate": round(rate, 1), **r})
        return {
            "label": self.label,
            "store": self.store,
            "peak_jobs_s": peak_rate,
            "points": points,
        }


def runs(quick: bool, stores: tuple[str, ...]) -> Iterator[BenchRun]:
    for store in stores:
        yield LatencyRun(
            experiment=NAME,
            store=store,
            label=f"H/{store}",
            fractions=(0.5,) if quick else (0.25, 0.5, 0.75, 0.9),
            seconds=0.5 if quick else 3.0,
            peak_jobs=500 if quick else 3000,
        )


def section(rep: Report) -> None:
    rows = rep.rows(NAME, LatencyRow)
    if not rows:
        return
    rep.add(
        "## H. Latency under steady load",
        "",
        "No-op jobs at 64 workers. Each engine's peak is its closed-loop end-to-end "
        "throughput, measured first in the same repeat; then open-loop arrivals at fixed "
        "fractions of it, latency measured from each request's scheduled send time (no "
        "coordinated omission).",
        "",
        "| store | peak jobs/s | load | rate/s | submit p50 ms | submit p99 ms | "
        "queue-to-start p50 ms | queue-to-start p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    )
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for s in NAMES:
        rs = [r for r in rows if r.store == s]
        if not rs:
            continue
        peak = med(r.peak_jobs_s for r in rs)
        for f in sorted({p.fraction for r in rs for p in r.points}):
            pts = [p for r in rs for p in r.points if p.fraction == f]
            p99 = med(p.submit_latency.p99_ms for p in pts)
            series[s].append((f, p99))
            rep.add(
                f"| {s} | {peak:,.0f} | {f:.0%} | {med(p.rate for p in pts):,.0f} | "
                f"{med(p.submit_latency.p50_ms for p in pts):.2f} | {p99:.2f} | "
                f"{med(p.queue_to_start_p50_ms or 0 for p in pts):.2f} | "
                f"{med(p.queue_to_start_p99_ms or 0 for p in pts):.2f} |"
            )

    def draw(ax: Any) -> None:
        for s, pts in series.items():
            ax.plot([100 * f for f, _ in pts], [v for _, v in pts], marker="o", label=s)
        ax.set_xlabel("offered load, % of the engine's own peak")
        ax.set_ylabel("submit latency p99, ms")
        ax.set_yscale("log")
        ax.set_title("H. latency under open-loop load")
        ax.legend()

    rep.plot("H_latency", draw)
