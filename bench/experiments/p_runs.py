"""P's runs: real ``sqlq serve`` and ``sqlq worker`` processes (and huey's consumer) on
127.0.0.1, each bounded in jobs and in time. ``p_remote`` holds the rows, the order of the
runs and the report section.

Every run enqueues all of its jobs first and only then lets them run: an in-process
server's queue is paused while the jobs go in and resumed after; a remote queue has no
worker until the jobs are in, then ``sqlq worker`` starts; huey's consumer starts after its
enqueue. The drain is read from the jobs' own clocks (the first start to the last end:
``started_at`` and ``updated_at`` of the completed jobs, or the handlers' ``pid start end``
log, ``sqlq.bench.spinkind``), so a worker's interpreter start is not in it, for any
system. A no-op run also ends where ``/stats`` first counts every job completed, which is
once its completion is durable (``done_s``, from the same first start): an in-process
server decides no-op outcomes faster than its store writes them, so its last
``updated_at`` comes well before its last durable completion, and only the latter is a
job done (a crash before it runs the job again). Server CPU is ``/stats``
``process_cpu_s`` over the drain; a worker's is its process tree's, from ``/proc``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import msgspec

from sqlq.bench.client.http import HttpPool
from sqlq.bench.client.server import ServerProcess
from sqlq.bench.experiments.base import Run, compiled
from sqlq.bench.spinkind import HUEY_DB_ENV, IMPORT, LOG_ENV, NOOP, SPIN, read_log
from sqlq.bench.stats import percentile

WORKERS = 64  # no-op jobs: in-process workers, and the remote workers' slots in all
REMOTE_WORKERS = 2  # no-op jobs: sqlq worker processes, WORKERS // REMOTE_WORKERS slots each
LEASE_S = 30
DRAIN_CAP_S = 300.0  # no run waits longer for its jobs
STOP_S = 30.0  # a worker or consumer that has not exited this long after its signal: SIGKILL
LATENCY_GAP_S = 0.02  # idle time between two latency jobs: each is submitted alone
BATCH = 1000  # jobs per POST /jobs/batch


class RunFailed(RuntimeError):
    """A run did not finish its jobs; the message ends with what its processes printed."""


def cpu_of_tree(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and every live process below it."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it ended meanwhile
        parent[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    total = 0.0
    for p, seconds in cpu.items():
        q = p
        while q > 1 and q != pid:
            q = parent.get(q, 0)
        if q == pid:
            total += seconds
    return total


class Child:
    """A process this run started, in its own session so that its children end with it."""

    def __init__(self, cmd: list[str], log: Path, env: dict[str, str]) -> None:
        self.cmd = cmd
        self.log_path = log
        self._log: IO[bytes] = open(log, "ab")
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RunFailed(f"{self.cmd[2:4]} exited with {self.proc.returncode}:\n{self.tail()}")

    def tail(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-3000:]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """``sig``, then SIGKILL to its session past ``STOP_S``; idempotent."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # its own session: only ours
                self.proc.wait()
        self._log.close()


def worker_cmd(url: str, *, concurrency: int | None, processes: int, name: str) -> list[str]:
    """``sqlq worker`` as the issue's CLI has it (no token: the bench server has none), quiet
    and with no grace, as the bench's servers are: it is stopped once its jobs are all done,
    and with a grace its idle long-poll claim held the stop for all of it (10 s a run).
    ``concurrency`` None: the worker's default (``sqlq.worker_main.concurrency``)."""
    slots = [] if concurrency is None else ["--concurrency", str(concurrency)]
    return [sys.executable, "-m", "sqlq", "worker", "--url", url, "--import", IMPORT,
            "--queue", "default", *slots, "--processes", str(processes), "--lease",
            str(LEASE_S), "--name", name, "--log-level", "warning", "--grace", "0"]  # fmt: skip


async def _stats(pool: HttpPool) -> dict[str, Any]:
    status, stats = await pool.json("GET", "/stats")
    if status != 200:
        raise RunFailed(f"/stats answered {status}: {stats}")
    return dict(stats)


async def _submit(pool: HttpPool, jobs: int, spec: dict[str, Any]) -> None:
    for i in range(0, jobs, BATCH):
        body = msgspec.json.encode({"jobs": [spec] * min(BATCH, jobs - i)})
        status, reply = await pool.json("POST", "/jobs/batch", body)
        if status != 201:
            raise RunFailed(f"POST /jobs/batch answered {status}: {reply}")


async def _drained(
    pool: HttpPool, jobs: int, children: list[Child]
) -> tuple[dict[str, Any], float]:
    """``/stats`` once ``jobs`` jobs are finished (completed or dead: counted once their end
    is durable), within the cap; and when that was seen (``time.time()``, the clock the
    jobs' stamps use), taken once that answer came (never before the last completion). Polls
    come 5 to 50 ms apart (1 % of the time since the first poll, within those bounds)."""
    started = time.perf_counter()
    deadline = started + DRAIN_CAP_S
    while True:
        stats = await _stats(pool)
        if stats["jobs"]["completed"] + stats["jobs"]["dead"] >= jobs:
            return stats, time.time()
        for c in children:
            c.check()
        if time.perf_counter() > deadline:
            tail = "".join(c.tail() for c in children)
            raise RunFailed(f"{stats['jobs']} after {DRAIN_CAP_S:g} s\n{tail}")
        # at most ~100 polls a drain, 5 to 50 ms apart: the drain is read from the jobs'
        # clocks, and a poll every 10 ms cost the server ~1 s of CPU in a 10 s drain
        await asyncio.sleep(min(0.05, max(0.005, (time.perf_counter() - started) / 100)))


async def _polling(pool: HttpPool, children: list[Child]) -> None:
    """Once every worker in ``children`` is up: seen by the server, and as many claims
    long-polling as there are workers (the queue is paused, so each waits), within the cap."""
    deadline = time.perf_counter() + DRAIN_CAP_S
    while True:
        stats = await _stats(pool)
        status, seen = await pool.json("GET", "/workers")
        if status != 200:
            raise RunFailed(f"GET /workers answered {status}: {seen}")
        names = {w["name"] for w in seen["workers"]}
        if stats["remote"]["claims_waiting"] >= len(children) and all(
            c.cmd[c.cmd.index("--name") + 1] in names for c in children
        ):
            return
        for c in children:
            c.check()
        if time.perf_counter() > deadline:
            tail = "".join(c.tail() for c in children)
            raise RunFailed(f"workers not polling after {DRAIN_CAP_S:g} s\n{tail}")
        await asyncio.sleep(0.02)


async def _logged(log: Path, jobs: int, child: Child | None) -> None:
    """Until the handlers' log has ``jobs`` lines, read every 20 ms, within the cap."""
    deadline = time.perf_counter() + DRAIN_CAP_S
    while len(read_log(log)) < jobs:
        if child is not None:
            child.check()
        if time.perf_counter() > deadline:
            tail = child.tail() if child is not None else ""
            raise RunFailed(f"{len(read_log(log))} of {jobs} jobs ran in {DRAIN_CAP_S:g} s\n{tail}")
        await asyncio.sleep(0.02)


async def _job_span(pool: HttpPool) -> tuple[float, float]:
    """The first ``started_at`` and the last ``updated_at`` of the completed jobs."""
    first, last, after = float("inf"), 0.0, ""
    while True:
        status, page = await pool.json("GET", f"/jobs?state=completed&limit=1000{after}")
        if status != 200:
            raise RunFailed(f"GET /jobs answered {status}: {page}")
        for job in page["jobs"]:
            first, last = min(first, job["started_at"]), max(last, job["updated_at"])
        if not page["next"]:
            return first, last
        after = f"&after={page['next']}"


@dataclass(frozen=True, kw_only=True)
class PRun(Run):
    part: str
    mode: str  # local (in-process), serve (in-process, --processes), remote (sqlq worker), huey
    jobs: int
    processes: int = 0

    def execute(self) -> dict[str, Any]:
        """The run's row, with the machine's 1-minute load average before and after it: on
        a shared 2-core machine, what else ran says how far a rate can be read."""
        compiled()
        before = os.getloadavg()[0]
        row = self.measure()
        return {**row, "load_before": round(before, 2), "load_after": round(os.getloadavg()[0], 2)}

    def measure(self) -> dict[str, Any]:
        raise NotImplementedError

    def server(self, log: Path | None = None) -> ServerProcess:
        workers = 0 if self.mode == "remote" else self.workers_local
        env = {LOG_ENV: str(log)} if log is not None else None
        flags: tuple[str, ...] = ("--import", IMPORT)
        if self.mode == "serve":  # the server's own workers, plain handlers in processes
            flags = (*flags, "--processes", str(self.processes))
        return ServerProcess.engine(store=self.store, workers=workers, flags=flags, env=env)

    @property
    def workers_local(self) -> int:
        return WORKERS


@dataclass(frozen=True, kw_only=True)
class NoopRun(PRun):
    """No-op jobs through ``WORKERS`` in-process workers, or ``REMOTE_WORKERS`` ``sqlq
    worker`` processes of ``slots`` slots each (default: as many slots in all)."""

    part: str = "noop"
    slots: int = WORKERS // REMOTE_WORKERS

    def measure(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="sqlq-p-") as d, self.server() as srv:
            return asyncio.run(self._measure(srv.url, Path(d)))

    async def _measure(self, url: str, d: Path) -> dict[str, Any]:
        children: list[Child] = []
        slots = self.slots
        async with HttpPool(url, 2) as pool:
            try:
                local = self.mode in ("local", "serve")
                # every mode alike: the queue paused while the jobs go in and the workers
                # come up (in-process ones are up with the server; remote ones start here
                # and long-poll), then resumed, so the drain times workers, not start-ups
                await pool.request("POST", "/queues/default/pause")
                await _submit(pool, self.jobs, {"kind": NOOP, "args": {}})
                if not local:
                    for i in range(REMOTE_WORKERS):
                        cmd = worker_cmd(url, concurrency=slots, processes=0, name=f"p-noop{i}")
                        children.append(Child(cmd, d / f"worker{i}.log", dict(os.environ)))
                    await _polling(pool, children)
                started_cpu = sum(cpu_of_tree(c.proc.pid) for c in children)
                before = await _stats(pool)
                t0 = time.perf_counter()
                await pool.request("POST", "/queues/default/resume")
                after, done_at = await _drained(pool, self.jobs, children)
                wall_s = time.perf_counter() - t0
                worker_cpu = sum(cpu_of_tree(c.proc.pid) for c in children) - started_cpu
            finally:
                for c in children:
                    c.stop()
            first, last = await _job_span(pool)
        return {
            "part": self.part, "mode": self.mode, "jobs": self.jobs,
            "completed": after["jobs"]["completed"] - before["jobs"]["completed"],
            "drain_s": round(last - first, 4), "done_s": round(done_at - first, 4),
            "wall_s": round(wall_s, 4),
            "server_cpu_s": round(after["process_cpu_s"] - before["process_cpu_s"], 4),
            "worker_cpu_s": round(worker_cpu, 4), "worker_start_cpu_s": round(started_cpu, 4),
            "workers": WORKERS if local else slots * len(children),
            "remote_workers": len(children), "command": children[0].cmd[1:] if children else [],
        }  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class CpuRun(PRun):
    """``bench.spin`` jobs: in-process (threads), ``sqlq worker --processes P``, or huey."""

    part: str = "cpu"
    rounds: int
    peer_version: str = ""

    @property
    def workers_local(self) -> int:
        # threads: one a core asked for; processes: two workers a process, so one waits
        # with its claim while the other's job runs and no process idles between jobs
        return 2 * self.processes if self.mode == "serve" else self.processes

    def measure(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="sqlq-p-") as d:
            log = Path(d) / "spin.log"
            if self.mode == "huey":
                row = self._huey(Path(d), log)
            else:
                with self.server(log) as srv:
                    row = asyncio.run(self._sqlq(srv.url, Path(d), log))
            spans = read_log(log)
        if len(spans) < self.jobs:
            raise RunFailed(f"{len(spans)} of {self.jobs} jobs ran")
        return {
            "part": self.part, "mode": self.mode, "jobs": self.jobs, "rounds": self.rounds,
            "processes": self.processes, "completed": len(spans),
            "drain_s": round(max(e for _, _, e in spans) - min(s for _, s, _ in spans), 4),
            "handler_pids": len({p for p, _, _ in spans}),
            "job_ms": round(1000 * sorted(e - s for _, s, e in spans)[len(spans) // 2], 3),
            **row,
        }  # fmt: skip

    async def _sqlq(self, url: str, d: Path, log: Path) -> dict[str, Any]:
        child: Child | None = None
        async with HttpPool(url, 2) as pool:
            try:
                local = self.mode in ("local", "serve")
                if local:
                    await pool.request("POST", "/queues/default/pause")
                await _submit(pool, self.jobs, {"kind": SPIN, "args": {"rounds": self.rounds}})
                before = await _stats(pool)
                t0 = time.perf_counter()
                if local:
                    await pool.request("POST", "/queues/default/resume")
                else:
                    # the default slots (10 here): jobs are claimed a few at a time while
                    # the processes run; with two a process, each job cost a claim of its
                    # own, ~1 ms of the worker's CPU taken from a handler's core (measured)
                    p = self.processes
                    cmd = worker_cmd(url, concurrency=None, processes=p, name=f"p-cpu{p}")
                    child = Child(cmd, d / "worker.log", {**os.environ, LOG_ENV: str(log)})
                await _logged(log, self.jobs, child)  # a file read: no load on the server
                after, _ = await _drained(pool, self.jobs, [child] if child is not None else [])
                wall_s = time.perf_counter() - t0
                worker_cpu = cpu_of_tree(child.proc.pid) if child is not None else 0.0
            finally:
                if child is not None:
                    child.stop()
        if after["jobs"]["dead"] - before["jobs"]["dead"]:
            raise RunFailed(f"jobs died: {after['jobs']}")
        return {
            "wall_s": round(wall_s, 4),
            "server_cpu_s": round(after["process_cpu_s"] - before["process_cpu_s"], 4),
            "worker_cpu_s": round(worker_cpu, 4),
            "command": child.cmd[1:] if child is not None else [],
        }

    def _huey(self, d: Path, log: Path) -> dict[str, Any]:
        env = {**os.environ, HUEY_DB_ENV: str(d / "huey.db"), LOG_ENV: str(log)}
        enq = subprocess.run(
            [sys.executable, "-m", "sqlq.bench.hueyspin", "enqueue", str(self.jobs),
             str(self.rounds)], env=env, capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        cmd = [sys.executable, "-m", "huey.bin.huey_consumer", "sqlq.bench.hueyspin.huey",
               "-k", "process", "-w", str(self.processes)]  # fmt: skip
        t0 = time.perf_counter()
        child = Child(cmd, d / "consumer.log", env)
        try:
            asyncio.run(_logged(log, self.jobs, child))
            wall_s = time.perf_counter() - t0
            worker_cpu = cpu_of_tree(child.proc.pid)
        finally:
            child.stop(signal.SIGINT)  # huey's graceful stop: it ends its worker processes
        return {
            "enqueue_s": round(float(enq.stdout.strip().splitlines()[-1]), 4),
            "wall_s": round(wall_s, 4), "worker_cpu_s": round(worker_cpu, 4),
            "command": cmd[1:], "version": self.peer_version,
        }  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class LatencyRun(PRun):
    """No-op jobs submitted one at a time to an idle server, each waited for before the next:
    ``started_at - created_at`` (the server's clock), and the handler's own start less
    ``created_at`` (the same machine's wall clock), which adds the claim's trip to a worker."""

    part: str = "latency"

    def measure(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="sqlq-p-") as d:
            log = Path(d) / "noop.log"
            with self.server(log if self.mode == "local" else None) as srv:
                return asyncio.run(self._measure(srv.url, Path(d), log))

    async def _measure(self, url: str, d: Path, log: Path) -> dict[str, Any]:
        child: Child | None = None
        if self.mode == "remote":
            cmd = worker_cmd(url, concurrency=4, processes=0, name="p-latency")
            child = Child(cmd, d / "worker.log", {**os.environ, LOG_ENV: str(log)})
        created: list[float] = []
        started: list[float] = []
        try:
            async with HttpPool(url, 1) as pool:
                for i in range(self.jobs + 1):  # the first is the warm-up: the worker is up
                    status, job = await pool.json(
                        "POST", "/jobs", msgspec.json.encode({"kind": NOOP, "args": {}})
                    )
                    if status != 201:
                        raise RunFailed(f"POST /jobs answered {status}: {job}")
                    job = await self._finished(pool, job["id"], child)
                    if i:
                        created.append(job["created_at"])
                        started.append(job["started_at"])
                    await asyncio.sleep(LATENCY_GAP_S)
        finally:
            if child is not None:
                child.stop()
        handler = [s for _, s, _ in read_log(log)][1:]
        if len(handler) != len(created):
            raise RunFailed(f"{len(handler)} handler starts for {len(created)} jobs")

        def ms(xs: list[float], q: float) -> float:
            return round(1000 * percentile(sorted(xs), q), 3)

        server = [s - c for s, c in zip(started, created, strict=True)]
        ran = [h - c for h, c in zip(handler, created, strict=True)]
        return {
            "part": self.part, "mode": self.mode, "jobs": self.jobs,
            "start_p50_ms": ms(server, 50), "start_p99_ms": ms(server, 99),
            "handler_p50_ms": ms(ran, 50), "handler_p99_ms": ms(ran, 99),
            "command": child.cmd[1:] if child is not None else [],
        }  # fmt: skip

    @staticmethod
    async def _finished(pool: HttpPool, job_id: str, child: Child | None) -> dict[str, Any]:
        deadline = time.perf_counter() + 60
        while True:
            status, job = await pool.json("GET", f"/jobs/{job_id}?wait=5")
            if status == 200 and job["state"] == "completed":
                return dict(job)
            if status != 200 or job["state"] in ("dead", "cancelled"):
                raise RunFailed(f"GET /jobs/{job_id}: {status} {job}")
            if child is not None:
                child.check()
            if time.perf_counter() > deadline:
                raise RunFailed(f"job {job_id} not finished within 60 s")
