"""L. What an open dashboard costs the queue: the submit phase of experiment D's
``20ms-single`` workload (20 ms jobs, 32 clients, one job per POST, ``--sync full``,
group commit; the workers run the jobs meanwhile) with the dashboard off
(``--no-ui``), with one viewer and with ten.

A viewer does what an open overview tab does (``sqlq/ui/static/ui.js``): every
second, ``GET /ui/`` with ``HX-Request: true``, the page's live part. The viewers
are threads in a process of their own rather than a browser, so that a browser's
own CPU on this 2-core machine is not charged to the server; the server's work per
refresh is the same.

Only the submit phase is timed (no drain), so a run takes seconds and a repeat can
hold each variant twice: per engine, in order and then in reverse (no-ui, 1, 10,
10, 1, no-ui), so drift within a repeat favours none. Each ratio is a repeat's
mean over its ``--no-ui`` mean, and the table shows the median over repeats. An
earlier design that drained 20,000 jobs (27 s a run, 8 repeats, three variants
in one order) gave 1-viewer ratios of 0.97-0.99 in one run and 0.82-0.94 in the
next, with CPU per job unmoved in the first: its noise was larger than the effect.

A few refreshes land in a submit phase, and on this shared machine its rate varies
by more than they can move it; so the **refresh** part also measures what one
refresh costs directly: a server with ``QUEUED`` jobs
waiting and no load, ``REFRESHES`` refreshes on one keep-alive connection, and
the server's process CPU (``/stats``) before and after.
"""

from __future__ import annotations

import http.client
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlq.bench.client.loadgen import run
from sqlq.bench.client.server import ServerProcess
from sqlq.bench.experiments.base import BenchRun, LoadRun, Run
from sqlq.bench.experiments.rows import LoadRow
from sqlq.bench.report import Report, cell, group, med

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
    The process imports only the standard library and is running (its first
    refreshes done) before ``__enter__`` returns, so its start is not in the load.
    """

    def __init__(self, url: str, n: int) -> None:
        self.url, self.n = url, n
        self.times: list[float] = []
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Viewers:
        if self.n:
            self._proc = subprocess.Popen(
                [sys.executable, "-S", "-c", VIEWER_CODE, self.url, str(self.n)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert self._proc.stdout is not None
            if self._proc.stdout.readline().strip() != "ready":
                raise RuntimeError("the viewers did not start")
        return self

    def __exit__(self, *_: object) -> None:
        if self._proc is not None:
            out = self._proc.communicate("", timeout=60)[0]  # closing stdin stops them
            self.times = json.loads(out)


# The viewers' process: stdlib only (and ``-S``), so that starting it costs next to
# nothing; it says "ready" once every viewer's first refresh is done, and the load
# starts after that. It prints the refreshes' times when its stdin closes.
VIEWER_CODE = """
import json, sys, threading, time, urllib.request

def main(url, n):
    stop, times, started = threading.Event(), [], threading.Semaphore(0)

    def one():
        request = urllib.request.Request(url + "/ui/", headers={"HX-Request": "true"})
        next_at, first = time.monotonic(), True
        while not stop.is_set():
            t0 = time.perf_counter()
            with urllib.request.urlopen(request, timeout=10) as r:
                r.read()
            times.append(time.perf_counter() - t0)
            if first:
                started.release()
                first = False
            next_at += 1.0
            stop.wait(max(0.0, next_at - time.monotonic()))

    threads = [threading.Thread(target=one, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    for _ in threads:
        started.acquire()
    print("ready", flush=True)
    sys.stdin.read()
    stop.set()
    for t in threads:
        t.join()
    print(json.dumps(times[n:]))  # the first refreshes were before the load

main(sys.argv[1], int(sys.argv[2]))
"""


@dataclass(frozen=True, kw_only=True)
class ViewedRun(LoadRun):
    viewers: int = 0

    def execute(self) -> dict[str, Any]:
        """The submit phase only: the server's CPU and the rate, from first POST to last
        acknowledgement (the workers run the jobs meanwhile, as in D)."""
        extra = ("--no-ui",) if self.viewers == 0 else ()
        with self.server(extra) as srv, Viewers(srv.url, self.viewers) as viewers:
            before = _stats(srv.url)
            result = run(
                srv.url,
                jobs=self.jobs,
                work_ms=self.work_ms,
                concurrency=self.concurrency,
                batch=self.batch,
                label=self.label,
                drain=False,
            )
            after = _stats(srv.url)
        result["server_cpu_s"] = round(after["process_cpu_s"] - before["process_cpu_s"], 3)
        result["store_stats"] = after["store"]
        result["refreshes"] = len(viewers.times)
        result["refresh_ms_p50"] = (
            round(1000 * statistics.median(viewers.times), 3) if viewers.times else 0.0
        )
        result["config"] = self.config(extra)
        return result


def _stats(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/stats", timeout=30) as r:
        stats: dict[str, Any] = json.loads(r.read())
    return stats


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
    """Per engine, the variants in order and then in reverse (no-ui, 1, 10, 10, 1, no-ui),
    so that drift within a repeat does not favour whichever runs first."""
    jobs = 500 if quick else 30_000  # a submit phase of about three seconds
    engines = [s for s in ENGINES if s in stores][: 1 if quick else None]
    variants = VIEWERS[:2] if quick else VIEWERS
    for store in engines:
        for half, order in enumerate((variants, variants[::-1])):
            for viewers in order:
                yield ViewedRun(
                    experiment=NAME,
                    store=store,
                    label=f"L/{store}/viewers-{viewers}/{half}",
                    jobs=jobs,
                    work_ms=20,
                    concurrency=32,
                    viewers=viewers,
                    params={"viewers": viewers, "half": half},
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
    """Per repeat: the variant's figure over ``--no-ui``'s, same engine, each the mean of
    the repeat's two runs (one in each half)."""
    runs: dict[tuple[int, int], list[float]] = {}
    for r in rows:
        if r.store == store:
            runs.setdefault((r.repeat, int(r.params["viewers"])), []).append(getattr(r, field))
    return [
        statistics.fmean(runs[rep, viewers]) / statistics.fmean(base)
        for (rep, v), base in runs.items()
        if v == 0 and (rep, viewers) in runs and statistics.fmean(base)
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
        f"The submit phase of experiment D's `20ms-single` workload ({n:,} jobs of 20 ms, 32 "
        "clients, one job per POST, 16 workers running them meanwhile, `--sync full`, group "
        "commit) with `--no-ui`, and with the dashboard served and 1 or 10 viewers "
        "refreshing the overview's live part once a second (what an open tab does). Each "
        "variant runs twice a repeat, in order and in reverse. `x no-ui`: the median over "
        "repeats of each repeat's mean over its `--no-ui` mean, same engine (submit rate: "
        "higher is better; server CPU per job in the submit phase: lower is better).",
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
        "server's CPU per second in the `--no-ui` submit phases above.",
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
