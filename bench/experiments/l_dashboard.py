"""L. What an open dashboard costs the queue: experiment D's ``20ms-single`` workload
(20 ms jobs, 32 clients, one job per POST, ``--sync full``, group commit) with the
dashboard off (``--no-ui``), with one viewer and with ten.

A viewer does what an open overview tab does (``common/ui/static/ui.js``): every
second, ``GET /ui/`` with ``HX-Request: true``, the page's live part. It is a
thread in the benchmark process rather than a browser, so that a browser's own CPU
on this 2-core machine is not charged to the server; the server's work per refresh
is the same. Within a repeat the three variants run back to back per engine, and
each ratio is taken against ``--no-ui`` of the same repeat before the median.
"""

from __future__ import annotations

import statistics
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bench.client.loadgen import run
from bench.client.server import ServerProcess
from bench.experiments.base import BenchRun, LoadRun
from bench.experiments.rows import LoadRow
from bench.report import Report, cell, group, med

NAME = "L"
BAR = 0.95  # submit rate with the dashboard open, x without it
VIEWERS = (0, 1, 10)  # 0: --no-ui
ENGINES = ("walq", "sqlite")


class LRow(LoadRow, kw_only=True):
    refreshes: int = 0  # live-part requests the viewers made during the run
    refresh_ms_p50: float = 0.0


class Viewers:
    """``n`` dashboard tabs, each refreshing once a second, in threads."""

    def __init__(self, url: str, n: int, every_s: float = 1.0) -> None:
        self.url, self.n, self.every_s = url, n, every_s
        self.times: list[float] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._view, daemon=True) for _ in range(n)]

    def __enter__(self) -> Viewers:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join()

    def _view(self) -> None:
        request = urllib.request.Request(self.url + "/ui/", headers={"HX-Request": "true"})
        next_at = time.monotonic()
        while not self._stop.is_set():
            t0 = time.perf_counter()
            with urllib.request.urlopen(request, timeout=10) as r:
                r.read()
            self.times.append(time.perf_counter() - t0)
            next_at += self.every_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))


@dataclass(frozen=True, kw_only=True)
class ViewedRun(LoadRun):
    viewers: int = 0

    def execute(self) -> dict[str, Any]:
        flags = self.flags + (("--no-ui",) if self.viewers == 0 else ())
        with (
            ServerProcess.engine(
                store=self.store, sync=self.sync, workers=self.workers, flags=flags
            ) as srv,  # fmt: skip
            Viewers(srv.url, self.viewers) as viewers,
        ):
            result = run(
                srv.url,
                jobs=self.jobs,
                work_ms=self.work_ms,
                concurrency=self.concurrency,
                batch=self.batch,
                label=self.label,
                drain_timeout=self.drain_timeout,
            )
        result["refreshes"] = len(viewers.times)
        result["refresh_ms_p50"] = (
            round(1000 * statistics.median(viewers.times), 3) if viewers.times else 0.0
        )
        result["config"] = {"workers": self.workers, "sync": self.sync, "jobs": self.jobs,
                            "work_ms": self.work_ms, "concurrency": self.concurrency,
                            "batch": self.batch, "flags": list(flags)}  # fmt: skip
        return result


def runs(quick: bool, stores: tuple[str, ...]) -> Iterator[BenchRun]:
    jobs = 2000 if quick else 20_000  # a submit phase of seconds, so refreshes land in it
    for store in (s for s in ENGINES if s in stores):
        for viewers in VIEWERS:
            yield ViewedRun(
                experiment=NAME,
                store=store,
                label=f"L/{store}/viewers-{viewers}",
                jobs=jobs,
                work_ms=20,
                concurrency=32,
                viewers=viewers,
                drain_timeout=300.0,
                params={"viewers": viewers},
            )


def _ratios(rows: list[LRow], store: str, viewers: int, field: str) -> list[float]:
    """Per repeat: the variant's figure over ``--no-ui``'s, for the same engine."""
    by = {(r.repeat, int(r.params["viewers"])): r for r in rows if r.store == store}
    return [
        getattr(by[rep, viewers], field) / getattr(base, field)
        for (rep, v), base in by.items()
        if v == 0 and (rep, viewers) in by and getattr(base, field)
    ]


def section(rep: Report) -> None:
    rows = rep.rows(NAME, LRow)
    if not rows:
        return
    n = rows[0].jobs
    rep.add(
        "## L. What an open dashboard costs",
        "",
        f"Experiment D's `20ms-single` workload ({n:,} jobs of 20 ms, 32 clients, one job "
        "per POST, 16 workers, `--sync full`, group commit) with `--no-ui`, and with the "
        "dashboard served and 1 or 10 viewers refreshing the overview's live part once a "
        "second (what an open tab does). `x no-ui`: the median over repeats of each "
        "repeat's ratio to `--no-ui` on the same engine (submit rate: higher is better; "
        "CPU per job: lower is better).",
        "",
        "| store | viewers | submit jobs/s | x no-ui | CPU us/job | x no-ui | refreshes | "
        "refresh p50 ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    )
    g = group(rows, lambda r: (r.store, int(r.params["viewers"])))
    for (store, viewers), rs in sorted(g.items(), key=lambda kv: (ENGINES.index(kv[0][0]),
                                                                   kv[0][1])):  # fmt: skip
        rate_x = med(_ratios(rows, store, viewers, "submit_rate_jobs_s"))
        cpu_x = med(_ratios(rows, store, viewers, "server_cpu_s"))
        rep.add(
            f"| {store} | {viewers or 'no-ui'} | {cell([r.submit_rate_jobs_s for r in rs])} | "
            f"{rate_x:.3f} | {cell([r.cpu_us_per_job for r in rs])} | {cpu_x:.3f} | "
            f"{cell([float(r.refreshes) for r in rs])} | "
            f"{cell([r.refresh_ms_p50 for r in rs], '{:.2f}')} |"
        )
        if viewers == 1:
            rep.check(
                f"L: {store}, submit rate with the dashboard open (1 viewer)",
                f"{rate_x:.3f}x --no-ui's",
                rate_x >= BAR,
                f"bar >= {BAR}x",
            )
