"""L. What an open dashboard costs the queue: experiment D's ``20ms-single`` workload
(20 ms jobs, 32 clients, one job per POST, ``--sync full``, group commit) with the
dashboard off (``--no-ui``), with one viewer and with ten.

A viewer does what an open overview tab does (``common/ui/static/ui.js``): every
second, ``GET /ui/`` with ``HX-Request: true``, the page's live part. The viewers
are threads in a process of their own rather than a browser, so that a browser's
own CPU on this 2-core machine is not charged to the server; the server's work per
refresh is the same. Within a repeat the three variants run back to back per engine, and
each ratio is taken against ``--no-ui`` of the same repeat before the median.

The submit phase is about two seconds, and on this shared machine its rate varies
by more than the few refreshes that land in it can move it; so the **refresh**
part measures what one refresh costs directly: a server with ``QUEUED`` jobs
waiting and no load, ``REFRESHES`` refreshes on one keep-alive connection, and
the server's process CPU (``/stats``) before and after.
"""

from __future__ import annotations

import http.client
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bench.client.loadgen import run
from bench.client.server import ServerProcess
from bench.experiments.base import BenchRun, LoadRun, Run
from bench.experiments.rows import LoadRow
from bench.report import Report, cell, group, med

NAME = "L"
BAR = 0.95  # submit rate with the dashboard open, x without it
VIEWERS = (0, 1, 10)  # 0: --no-ui
ENGINES = ("walq", "sqlite")
QUEUED = (0, 20_000)  # jobs waiting while the refresh part runs
REFRESHES = 1000


class LRow(LoadRow, kw_only=True):
    part: str = "load"  # load, or refresh
    jobs: int = 0
    refreshes: int = 0  # live-part requests the viewers made during the run
    refresh_ms_p50: float = 0.0
    queued: int = 0  # refresh part: jobs waiting
    refresh_cpu_us: float = 0.0  # refresh part: server CPU per refresh


class Viewers:
    """``n`` dashboard tabs, each refreshing once a second, in a process of their own.

    Not threads of the benchmark's process: they would take the GIL from the load
    generator's event loop and so slow the submissions they are meant to observe.
    """

    def __init__(self, url: str, n: int) -> None:
        self.url, self.n = url, n
        self.times: list[float] = []
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Viewers:
        if self.n:
            code = f"from bench.experiments.l_dashboard import view; view({self.url!r}, {self.n})"
            self._proc = subprocess.Popen(
                [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        return self

    def __exit__(self, *_: object) -> None:
        if self._proc is not None:
            out = self._proc.communicate("", timeout=60)[0]  # closing stdin stops them
            self.times = json.loads(out)


def view(url: str, n: int, every_s: float = 1.0) -> None:
    """The viewers' process: refresh until stdin closes, then print every refresh's time."""
    stop = threading.Event()
    times: list[float] = []

    def one() -> None:
        request = urllib.request.Request(url + "/ui/", headers={"HX-Request": "true"})
        next_at = time.monotonic()
        while not stop.is_set():
            t0 = time.perf_counter()
            with urllib.request.urlopen(request, timeout=10) as r:
                r.read()
            times.append(time.perf_counter() - t0)
            next_at += every_s
            stop.wait(max(0.0, next_at - time.monotonic()))

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    sys.stdin.read()
    stop.set()
    for t in threads:
        t.join()
    print(json.dumps(times))


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


@dataclass(frozen=True, kw_only=True)
class RefreshRun(Run):
    queued: int
    refreshes: int = REFRESHES

    def execute(self) -> dict[str, Any]:
        with ServerProcess.engine(store=self.store) as srv:
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
            for i in range(0, self.queued, 1000):
                batch = [{"kind": "sleep", "delay_ms": 86_400_000}] * min(1000, self.queued - i)
                conn.request("POST", "/jobs/batch", json.dumps({"jobs": batch}),
                             {"content-type": "application/json"})  # fmt: skip
                conn.getresponse().read()
            before = _cpu(conn)
            times = []
            for _ in range(self.refreshes):
                t0 = time.perf_counter()
                conn.request("GET", "/ui/", headers={"hx-request": "true"})
                reply = conn.getresponse()
                reply.read()
                times.append(time.perf_counter() - t0)
                assert reply.status == 200, reply.status
            cpu_s = _cpu(conn) - before
            conn.close()
        return {
            "part": "refresh",
            "queued": self.queued,
            "refreshes": self.refreshes,
            "refresh_cpu_us": round(1e6 * cpu_s / self.refreshes, 1),
            "refresh_ms_p50": round(1000 * statistics.median(times), 3),
        }


def _cpu(conn: http.client.HTTPConnection) -> float:
    conn.request("GET", "/stats")
    return float(json.loads(conn.getresponse().read())["process_cpu_s"])


def runs(quick: bool, stores: tuple[str, ...]) -> Iterator[BenchRun]:
    jobs = 500 if quick else 20_000  # a submit phase of seconds, so refreshes land in it
    engines = [s for s in ENGINES if s in stores][: 1 if quick else None]
    for store in engines:
        for viewers in VIEWERS[:2] if quick else VIEWERS:
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
        for queued in QUEUED[:1] if quick else QUEUED:
            yield RefreshRun(
                experiment=NAME,
                store=store,
                label=f"L/{store}/refresh/queued-{queued}",
                queued=queued,
                refreshes=100 if quick else REFRESHES,
                params={"queued": queued},
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
    every = rep.rows(NAME, LRow)
    rows = [r for r in every if r.part == "load"]
    refresh = [r for r in every if r.part == "refresh"]
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
    if not refresh:
        return
    busy = {  # the server's CPU seconds per second in the --no-ui load runs
        s: med(r.server_cpu_s / r.total_s for r in rows if r.store == s and not r.params["viewers"])
        for s in ENGINES
    }
    rep.add(
        "",
        f"What one refresh costs the server: {refresh[0].refreshes:,} refreshes of the "
        "overview's live part on one keep-alive connection, no other load, with 0 or 20,000 "
        "jobs waiting. `share of the run's CPU`: one viewer's cost per second over the "
        "server's CPU per second in the `--no-ui` runs above.",
        "",
        "| store | jobs waiting | server CPU us/refresh | refresh p50 ms | "
        "share of the run's CPU (1 viewer) |",
        "|---|---:|---:|---:|---:|",
    )
    g2 = group(refresh, lambda r: (r.store, r.queued))
    for (store, queued), rs in sorted(g2.items(), key=lambda kv: (ENGINES.index(kv[0][0]),
                                                                   kv[0][1])):  # fmt: skip
        cpu = med(r.refresh_cpu_us for r in rs)
        share = 100 * cpu / 1e6 / busy[store] if busy.get(store) else float("nan")
        rep.add(
            f"| {store} | {queued:,} | {cell([r.refresh_cpu_us for r in rs], '{:.0f}')} | "
            f"{cell([r.refresh_ms_p50 for r in rs], '{:.2f}')} | {share:.2f}% |"
        )
