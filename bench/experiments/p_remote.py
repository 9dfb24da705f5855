"""P. Workers anywhere: jobs run by ``sqlq worker`` processes over the pull protocol,
against the same jobs run in the server's process, side by side in one run (issue 23).

- **noop**: ``NOOP_JOBS`` no-op jobs on each durable engine (``--sync full``), run by 64
  in-process workers, or by two ``sqlq worker --concurrency 32`` (as many slots) against
  ``sqlq serve --workers 0`` (every queue remote), which claim and report in batches, and
  by the same two with ``WIDE_SLOTS`` each (a claim's largest batch) and with
  ``ENOUGH_SLOTS`` each (two full claims: one runs while the other's round trip carries
  its outcomes and brings the next jobs). Every mode's workers are up before the clock:
  the queue is paused while the jobs go in and the remote workers start, then resumed.
  Jobs/s to the last durable completion (``p_runs``), beside the rate of decided
  outcomes, and server CPU per job (the workers' beside it, from the resume). Bars:
  remote (as many slots) >= 0.50x in-process; #35's, for workers with enough slots (the
  ``ENOUGH_SLOTS`` row): >= 0.90x in-process, with server CPU per job at most
  in-process's.
- **cpu**: ``CPU_JOBS`` jobs of ``sqlq.bench.spinkind.spin`` (pure-Python arithmetic,
  ~20-50 ms here) on SQLite: in the server's thread pool (``--workers 2``: one GIL), by
  ``sqlq worker --processes 1`` and ``--processes 2``, and by huey's process consumer
  (``huey_consumer -k process -w 1`` and ``-w 2``, ``SqliteHuey`` with fsync: see
  ``sqlq.bench.hueyspin`` for why that storage). Bars: ``--processes 2`` >= 1.8x
  ``--processes 1``, and at least huey ``-w 2``'s rate.
- **latency**: ``LATENCY_JOBS`` no-op jobs submitted one at a time to an idle server,
  each waited for: submit to start (the server's ``started_at - created_at``) and submit
  to the handler's own first line, remote against in-process.

``p_runs`` says how each run enqueues first and reads its drain from the jobs' clocks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from sqlq.bench.experiments.base import DURABLE, NAMES, by_store
from sqlq.bench.experiments.p_runs import (
    REMOTE_WORKERS,
    WORKERS,
    CpuRun,
    LatencyRun,
    NoopRun,
    PRun,
)
from sqlq.bench.experiments.rows import Row
from sqlq.bench.peers import HUEY, installed
from sqlq.bench.report import Report, cell, group, med
from sqlq.bench.spinkind import ROUNDS
from sqlq.common.protocol import MAX_CLAIM

NAME = "P"
NOOP_JOBS, QUICK_NOOP_JOBS = 20_000, 300
CPU_JOBS, QUICK_CPU_JOBS = 360, 6  # ~4 s a drain on 2 processes: steadier on a shared machine
LATENCY_JOBS, QUICK_LATENCY_JOBS = 100, 5
CPU_STORE = "sqlite"  # storage does not matter for 30 ms of CPU a job (experiment F)
NOOP_BAR = 0.50  # remote no-op jobs/s over in-process (as many slots as workers)
# #35's bars, for a worker with enough slots (the wide row): its no-op jobs/s over
# in-process, and the server's CPU a job over in-process (at most the same)
ENOUGH_BAR = 0.9
CPU_BAR = 1.0
WIDE_SLOTS = MAX_CLAIM  # the wide remote row: a claim's largest batch, each worker
# #35's row: enough slots that a worker's jobs never wait on a round trip. A claim carries
# the outcomes of the jobs it replaces, so with one claim's slots they all wait on it (a
# no-op's run is ~1 % of that round trip); with two, one claim's jobs run meanwhile
ENOUGH_SLOTS = 2 * MAX_CLAIM
SCALE_BAR = 1.8  # --processes 2 over --processes 1
PEER_BAR = 1.0  # sqlq --processes 2 over huey -w 2


class PRow(Row, kw_only=True):
    part: str  # noop, cpu, latency
    mode: str  # local (in the server's process), remote (sqlq worker), huey
    jobs: int
    completed: int = 0
    processes: int = 0  # cpu: the worker's --processes, huey's -w, the server's --workers
    workers: int = 0  # noop: in-process workers, or the remote workers' slots in all
    remote_workers: int = 0  # noop: sqlq worker processes
    rounds: int = 0
    drain_s: float = 0.0  # the first job's start to the last one's end
    done_s: float = 0.0  # noop: the first job's start to /stats counting all done (durable)
    wall_s: float = 0.0  # the release (resume, or worker spawn) to the last end seen
    enqueue_s: float = 0.0
    server_cpu_s: float = 0.0
    worker_cpu_s: float = 0.0
    handler_pids: int = 0  # processes whose handler ran a job
    job_ms: float = 0.0  # median handler time of one job
    start_p50_ms: float = 0.0
    start_p99_ms: float = 0.0
    handler_p50_ms: float = 0.0
    handler_p99_ms: float = 0.0
    load_before: float | None = None  # the machine's 1-minute load average, before the run
    load_after: float | None = None
    version: str = ""  # huey's
    command: tuple[str, ...] = ()  # the worker's or the consumer's

    @property
    def jobs_per_s(self) -> float | None:
        """Jobs done a second: a no-op run's over ``done_s`` (to the last durable
        completion), a CPU run's over the handlers' span (a few ms of writes behind 20 ms
        jobs, and huey's completions can't be seen from outside). None without its span
        (a row from before ``done_s`` was measured: no rate, rather than a wrong one)."""
        span = self.done_s if self.part == "noop" else self.drain_s
        return self.completed / span if span else None

    @property
    def handled_per_s(self) -> float | None:
        """Jobs a second over the handlers' span (the first start to the last decided end),
        whether or not those ends were durable yet."""
        return self.completed / self.drain_s if self.drain_s else None

    @property
    def server_us(self) -> float:
        return 1e6 * self.server_cpu_s / self.completed if self.completed else float("nan")

    @property
    def worker_us(self) -> float:
        return 1e6 * self.worker_cpu_s / self.completed if self.completed else float("nan")


ROW = PRow


def cpu_runs(quick: bool, store: str) -> Iterator[PRun]:
    jobs = QUICK_CPU_JOBS if quick else CPU_JOBS

    def one(store: str, label: str, mode: str, processes: int, version: str = "") -> CpuRun:
        return CpuRun(experiment=NAME, store=store, label=f"P/cpu/{label}", mode=mode,
                      processes=processes, jobs=jobs, rounds=ROUNDS, peer_version=version,
                      params={"mode": mode, "processes": processes})  # fmt: skip

    yield one(store, "sqlq-local-w2", "local", 2)
    yield one(store, "sqlq-serve-p2", "serve", 2)
    yield one(store, "sqlq-worker-p1", "remote", 1)
    yield one(store, "sqlq-worker-p2", "remote", 2)
    version = installed(HUEY)
    if version is None:  # pip install -e '.[peers]'
        return
    yield one("huey", "huey-w1", "huey", 1, version)
    yield one("huey", "huey-w2", "huey", 2, version)


def runs(quick: bool, stores: tuple[str, ...]) -> Iterator[PRun]:
    durable = [s for s in stores if s in DURABLE] or list(DURABLE)
    jobs = QUICK_NOOP_JOBS if quick else NOOP_JOBS
    for store in durable:
        for mode in ("local", "remote"):
            yield NoopRun(experiment=NAME, store=store, label=f"P/noop/{store}/{mode}",
                          mode=mode, jobs=jobs, params={"mode": mode})  # fmt: skip
        # the same workers with a full claim's slots each: fewer, larger calls per job
        yield NoopRun(experiment=NAME, store=store, label=f"P/noop/{store}/remote-wide",
                      mode="remote", jobs=jobs, slots=WIDE_SLOTS,
                      params={"mode": "remote", "slots": WIDE_SLOTS})  # fmt: skip
        yield NoopRun(experiment=NAME, store=store, label=f"P/noop/{store}/remote-enough",
                      mode="remote", jobs=jobs, slots=ENOUGH_SLOTS,
                      params={"mode": "remote", "slots": ENOUGH_SLOTS})  # fmt: skip
    yield from cpu_runs(quick, CPU_STORE if CPU_STORE in durable else durable[0])
    lat = QUICK_LATENCY_JOBS if quick else LATENCY_JOBS
    for store in durable:
        for mode in ("local", "remote"):
            yield LatencyRun(experiment=NAME, store=store, label=f"P/latency/{store}/{mode}",
                             mode=mode, jobs=lat, params={"mode": mode})  # fmt: skip


def ratios(
    rows: list[PRow], top: Callable[[PRow], bool], bottom: Callable[[PRow], bool]
) -> list[float]:
    """``top``'s jobs/s over ``bottom``'s, within each repeat that has both."""
    out = []
    for rs in group(rows, lambda r: r.repeat).values():
        t = [r.jobs_per_s for r in rs if top(r)]
        b = [r.jobs_per_s for r in rs if bottom(r)]
        if t and b and t[0] is not None and b[0]:
            out.append(t[0] / b[0])
    return out


def _is(
    mode: str, processes: int | None = None, store: str | None = None
) -> Callable[[PRow], bool]:
    return lambda r: (r.mode == mode and (processes is None or r.processes == processes)
                      and (store is None or r.store == store))  # fmt: skip


def _noop(rep: Report, rows: list[PRow]) -> None:
    r0 = rows[0]
    nproc = max((r.remote_workers for r in rows), default=0) or REMOTE_WORKERS
    in_process = next((r.workers for r in rows if r.mode == "local" and r.workers), WORKERS)
    slots = in_process // nproc
    wide = sorted({r.workers // nproc for r in rows if r.mode == "remote"} - {slots})
    rep.add(
        "### No-op jobs: remote workers against in-process",
        "",
        f"{r0.jobs:,} no-op jobs enqueued first (`POST /jobs/batch`), then run: by "
        f"{in_process} in-process workers (the queue paused while they go in, then "
        f"resumed), or by {nproc} `sqlq worker --concurrency {slots}` processes (as many "
        f"slots in all; the {NOOP_BAR:.1f}x bar's row)"
        + "".join(
            f", and by the same with {w} slots each (up to {min(w, MAX_CLAIM)} jobs a call)"
            for w in wide
        )
        + f" (the {ENOUGH_BAR:.1f}x bar's row is {ENOUGH_SLOTS}: two full claims a worker, "
        "so one claim's jobs run while the other's round trip carries their outcomes "
        "back and brings the next), against `sqlq serve --workers 0` (every queue "
        "remote), claiming and "
        "reporting in batches over 127.0.0.1. Every mode's workers are up before the "
        "clock: the queue is paused and the jobs go in, then the remote ones start and "
        "long-poll the paused queue until it resumes (their start, in each row's "
        "`worker_start_cpu_s`, is not in the figures). "
        "Jobs/s: completed jobs over the first `started_at` to the moment "
        "`/stats` first counts them all completed, which it does once each completion is "
        "durable (`/stats` polled 5 to 50 ms apart, the moment its answer came counted); the "
        "bar's ratio is of these. "
        "`decided/s` is over the first `started_at` to the last `updated_at` instead, the "
        "moment the last outcome was decided: an in-process server decides no-op outcomes "
        "faster than its store writes them, so by then many are still in memory, and a "
        "crash would run those jobs again. Server CPU over the drain; the workers' "
        "processes besides (all of them, from the resume). The ratios are taken within "
        "each repeat. On a shared machine CPU per job holds better than a rate.",
        "",
        "| store | runs in | jobs/s | decided/s | server CPU us/job | worker CPU us/job | "
        "jobs/s remote / in-process | server CPU remote / in-process |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    )
    stores = by_store(rows)
    for store, rs in stores.items():
        local = _is("local")
        widths = sorted({r.workers for r in rs if r.mode == "remote"})
        for mode, width in (("local", 0), *(("remote", w) for w in widths)):
            mine = [r for r in rs if r.mode == mode and (mode == "local" or r.workers == width)]
            if not mine:
                continue
            words, rate, cpu, worker = "server (in-process)", "-", "-", "-"
            if mode == "remote":
                n = max(r.remote_workers for r in mine) or REMOTE_WORKERS
                words = f"sqlq worker, {n} x {width // n} slots"
                these = _slots(width)
                rate = cell(ratios(rs, these, local), "{:.2f}")
                cpu = cell(_cpu_ratios(rs, these), "{:.2f}")
                worker = cell([r.worker_us for r in mine])
            rep.add(
                f"| {store} | {words} | {cell([r.jobs_per_s for r in mine])} | "
                f"{cell([r.handled_per_s for r in mine])} | "
                f"{cell([r.server_us for r in mine])} | {worker} | {rate} | {cpu} |"
            )
    rep.add("")
    for store, rs in stores.items():
        x = ratios(rs, _slots(WORKERS), _is("local"))
        if x:
            rep.check(
                f"P: {store}, no-op jobs/s through a remote worker over in-process",
                f"{med(x):.2f}x",
                med(x) >= NOOP_BAR,
                f"bar >= {NOOP_BAR:.2f}x",
            )
        enough = _slots(ENOUGH_SLOTS * REMOTE_WORKERS)
        x = ratios(rs, enough, _is("local"))
        if x:
            rep.check(
                f"P: {store}, no-op jobs/s through remote workers with two full claims' "
                "slots over in-process",
                f"{med(x):.2f}x",
                med(x) >= ENOUGH_BAR,
                f"bar >= {ENOUGH_BAR:.2f}x",
            )
        cpus = _cpu_ratios(rs, enough)
        if cpus:
            rep.check(
                f"P: {store}, server CPU a no-op job with remote workers (two full claims' "
                "slots) over in-process",
                f"{med(cpus):.2f}x",
                med(cpus) <= CPU_BAR,
                f"bar <= {CPU_BAR:.2f}x",
            )


def _slots(width: int) -> Callable[[PRow], bool]:
    """The remote no-op rows whose workers had ``width`` slots in all."""
    return lambda r: r.mode == "remote" and r.workers == width


def _cpu_ratios(rows: list[PRow], remote: Callable[[PRow], bool]) -> list[float]:
    out = []
    for rs in group(rows, lambda r: r.repeat).values():
        loc = [r.server_us for r in rs if r.mode == "local"]
        rem = [r.server_us for r in rs if remote(r)]
        if loc and rem and loc[0]:
            out.append(rem[0] / loc[0])
    return out


_CPU_ROWS = (
    ("local", 2, "sqlq serve, in-process threads (`--workers 2`)"),
    ("serve", 2, "`sqlq serve --processes 2` (`--workers 4`)"),
    ("remote", 1, "`sqlq worker --processes 1`"),
    ("remote", 2, "`sqlq worker --processes 2`"),
    ("huey", 1, "huey `-k process -w 1`"),
    ("huey", 2, "huey `-k process -w 2`"),
)


def _slots_said(rows: list[PRow]) -> str:
    """How the CPU runs' workers were given their slots, as their commands say."""
    given = {r.command[r.command.index("--concurrency") + 1]: r.processes for r in rows
             if r.mode == "remote" and "--concurrency" in r.command}  # fmt: skip
    if not given:
        return (
            "`sqlq worker` with its default slots (no `--concurrency`: max(10, 4 x "
            "processes), so jobs are claimed a few at a time while the processes run). "
        )
    said = ", ".join(f"{n} at `--processes {p}`" for n, p in sorted(given.items()))
    return f"`sqlq worker --concurrency`: {said}. "


def _cpu(rep: Report, rows: list[PRow]) -> None:
    r0 = rows[0]
    huey = next((r.version for r in rows if r.mode == "huey"), "")
    rep.add(
        "### A CPU-bound handler: processes against threads, and against huey",
        "",
        f"{r0.jobs} jobs of `sqlq.bench.spinkind.spin` ({r0.rounds:,} rounds of pure-Python "
        f"integer arithmetic: no I/O, the GIL held throughout) on {rep.cores} cores, enqueued "
        f"first, then drained. sqlq on {rows[0].store if r0.mode != 'huey' else CPU_STORE} "
        "(`--sync full`); "
        + _slots_said(rows)
        + (
            f"huey {huey}: `SqliteHuey` with fsync (no Redis here; see `sqlq.bench.hueyspin`), "
            "its process consumer started once its enqueue is done, its defaults otherwise. "
            if huey
            else "huey is not installed (`pip install -e '.[peers]'`): no peer rows. "
        )
        + "Jobs/s: jobs over the handlers' own first start to last end (every system alike, "
        "so no interpreter start is in it); `x p1`: over `sqlq worker --processes 1` in the "
        "same repeat.",
        "",
        "| runs in | jobs/s | x p1 | one job, ms | processes that ran jobs | drain s |",
        "|---|---:|---:|---:|---:|---:|",
    )
    p1 = _is("remote", 1)
    for mode, processes, words in _CPU_ROWS:
        mine = [r for r in rows if r.mode == mode and r.processes == processes]
        if not mine:
            continue
        rep.add(
            f"| {words} | {cell([r.jobs_per_s for r in mine], '{:.1f}')} | "
            f"{cell(ratios(rows, _is(mode, processes), p1), '{:.2f}')} | "
            f"{cell([r.job_ms for r in mine], '{:.1f}')} | "
            f"{cell([r.handler_pids for r in mine])} | "
            f"{cell([r.drain_s for r in mine], '{:.2f}')} |"
        )
    rep.add("")
    scale = ratios(rows, _is("remote", 2), p1)
    if scale:
        rep.check(
            "P: CPU-bound handler, `sqlq worker --processes 2` over `--processes 1`",
            f"{med(scale):.2f}x",
            med(scale) >= SCALE_BAR,
            f"bar >= {SCALE_BAR:.1f}x",
        )
    served = ratios(rows, _is("serve", 2), _is("local", 2))
    if served:
        rep.check(
            "P: CPU-bound handler, `sqlq serve --processes 2` over `--processes 0` (threads)",
            f"{med(served):.2f}x",
            med(served) >= SCALE_BAR,
            f"bar >= {SCALE_BAR:.1f}x",
        )
    peer = ratios(rows, _is("remote", 2), _is("huey", 2))
    if peer:
        two = med(r.jobs_per_s for r in rows if _is("remote", 2)(r))
        hw2 = med(r.jobs_per_s for r in rows if _is("huey", 2)(r))
        rep.check(
            "P: CPU-bound handler, `sqlq worker --processes 2` over huey `-k process -w 2`",
            f"{med(peer):.2f}x ({two:.1f} vs {hw2:.1f} jobs/s)",
            med(peer) >= PEER_BAR,
            "bar: at least as fast",
        )


def _latency(rep: Report, rows: list[PRow]) -> None:
    rep.add(
        "### Submit to start: remote against in-process",
        "",
        f"{rows[0].jobs} no-op jobs, each submitted alone (`POST /jobs`) to an otherwise idle "
        "server and waited for before the next. `server`: the job's `started_at - "
        "created_at` (the claim, durable); `handler`: the handler's own first line less "
        "`created_at` (for a remote worker, the claim's answer on its way to it too). "
        "Medians over the repeats of each run's percentiles.",
        "",
        "| store | runs in | server p50 ms | server p99 ms | handler p50 ms | handler p99 ms |",
        "|---|---|---:|---:|---:|---:|",
    )
    g = group(rows, lambda r: (r.store, r.mode))
    for (store, mode), rs in sorted(g.items(), key=lambda kv: (NAMES.index(kv[0][0]), kv[0][1])):
        words = "server (in-process)" if mode == "local" else "sqlq worker"
        rep.add(
            f"| {store} | {words} | {cell([r.start_p50_ms for r in rs], '{:.2f}')} | "
            f"{cell([r.start_p99_ms for r in rs], '{:.2f}')} | "
            f"{cell([r.handler_p50_ms for r in rs], '{:.2f}')} | "
            f"{cell([r.handler_p99_ms for r in rs], '{:.2f}')} |"
        )
    rep.add("")


def section(rep: Report) -> None:
    rows = rep.rows(NAME, PRow)
    if not rows:
        return
    loads = [x for r in rows for x in (r.load_before, r.load_after) if x is not None]
    rep.add(
        "## P. Workers anywhere: remote workers against in-process",
        "",
        "Real `sqlq serve` and `sqlq worker` processes (and huey's consumer) on 127.0.0.1, "
        "a fresh server and data directory each run, every run in one repeat side by side."
        + (
            f" The machine's 1-minute load average around the runs: {cell(loads, '{:.1f}')} "
            f"on {rep.cores} cores (above the cores, other work took CPU from these runs, and "
            "a rate, a scaling above all, reads low)."
            if loads
            else ""
        ),
        "",
    )
    for part, write in (("noop", _noop), ("cpu", _cpu), ("latency", _latency)):
        mine = [r for r in rows if r.part == part]
        if mine:
            write(rep, mine)


__all__ = ["NAME", "ROW", "PRow", "ratios", "runs", "section"]
