"""N's runs: sqlq's schedules over HTTP and procrastinate's periodic tasks, each system alone,
with the window, the CPU readings and the tally of lost, doubled and late ticks that
both share. ``n_schedules`` holds the experiment's rows, sizes and report section."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from sqlq.bench.client.http import HttpPool
from sqlq.bench.client.server import ServerProcess
from sqlq.bench.experiments.base import Run
from sqlq.bench.experiments.j_runs import _peer, _peer_env, _wait, cluster
from sqlq.bench.peers import PEERS, PERIODIC_SQL, installed
from sqlq.bench.pgcluster import bindir
from sqlq.bench.stats import percentile

PEER = "procrastinate"
PAGE = 1000  # GET /jobs page size: the largest the server takes
CLK = os.sysconf("SC_CLK_TCK")


def tally(names: Iterable[str], ticks: Sequence[int],
          seen: Iterable[tuple[str, int, float]]) -> dict[str, Any]:  # fmt: skip
    """Lost, doubled and lateness (ms) of the jobs ``seen`` as (schedule, tick, enqueued at),
    over the pairs of ``names`` and ``ticks`` due; jobs of other ticks are not counted."""
    want, due = set(names), set(ticks)
    count: Counter[tuple[str, int]] = Counter()
    late: list[float] = []
    for name, tick, at in seen:
        if name in want and tick in due:
            count[name, tick] += 1
            late.append(1e3 * (at - tick))
    late.sort()
    expected = len(want) * len(due)
    return {
        "ticks": expected, "jobs": len(count), "lost": expected - len(count),
        "doubled": sum(c - 1 for c in count.values()),
        "late_p50_ms": round(percentile(late, 50), 3) if late else None,
        "late_p99_ms": round(percentile(late, 99), 3) if late else None,
        "late_max_ms": round(late[-1], 3) if late else None,
    }  # fmt: skip


def window(period: int, n: int, not_before: float) -> list[int]:
    """The ``n`` ticks of a window that starts on the first boundary at or after ``not_before``."""
    t0 = math.ceil(not_before / period) * period
    return [t0 + k * period for k in range(n)]


async def _until(t: float) -> None:
    await asyncio.sleep(max(0.0, t - time.time()))


def _margin(period: int) -> float:
    """How long before a tick the CPU is read: after the last tick's work, before the next's."""
    return min(0.5, 0.3 * period)


def proc_cpu(pid: int) -> float:
    """utime + stime of one process, seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def pg_cpu() -> float:
    """The CPU of the cluster's postmaster and every process it started, those that ended
    too (the postmaster's children's time, once it reaped them: an autovacuum worker's or a
    closed connection's backend would otherwise take its CPU with it, and a difference of
    two readings could come out below zero)."""
    root, total = cluster().pid(), 0.0
    for pid in (int(e) for e in os.listdir("/proc") if e.isdigit()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if pid == root:
                total += sum(int(x) for x in fields[11:15]) / CLK  # its own and its reaped
            elif int(fields[1]) == root:
                total += (int(fields[11]) + int(fields[12])) / CLK
        except OSError:
            continue  # gone meanwhile
    return total


def pg_version() -> str:
    """The throwaway cluster's version: "15.18" of "postgres (PostgreSQL) 15.18 (Debian ...)"."""
    d = bindir()
    out = subprocess.run([str(d / "postgres"), "--version"], capture_output=True, text=True) \
        if d else None  # fmt: skip
    return out.stdout.split(")", 1)[1].split()[0] if out and out.returncode == 0 else ""


def tick_of(job: dict[str, Any]) -> tuple[str, int] | None:
    """A job's schedule and tick: its ``schedule`` and ``tick`` fields, else its key."""
    if job.get("schedule") is not None and job.get("tick") is not None:
        return str(job["schedule"]), int(job["tick"])
    key = job.get("idempotency_key") or ""
    if not key.startswith("sched:"):
        return None
    name, _, tick = key.removeprefix("sched:").rpartition(":")
    return name, int(float(tick))


@dataclass(frozen=True, kw_only=True)
class SchedulesRun(Run):
    system: str
    schedules: int
    period_s: int
    ticks_n: int  # ticks per schedule in the window
    idle_s: float

    @property
    def shared(self) -> bool:
        return self.system == "sqlq-postgres"

    @property
    def names(self) -> list[str]:
        """The schedules (sqlq) or periodic ids' numbers (the peer's ``s`` argument)."""
        sqlq = self.system.startswith("sqlq-")
        return [f"n{i:04d}" if sqlq else str(i) for i in range(self.schedules)]

    def spec(self) -> dict[str, Any]:
        timing = {"cron": "* * * * *"} if self.period_s == 60 else {"every_s": self.period_s}
        return {"kind": "sleep", "args": {"work_ms": 0}, **timing}

    def execute(self) -> dict[str, Any]:
        store = self.system.removeprefix("sqlq-")
        flags = ("--dsn", cluster().create_database()) if self.shared else ()
        with ServerProcess.engine(store=store, workers=16, flags=flags) as srv:
            return asyncio.run(self._measure(srv.url))

    async def _measure(self, url: str) -> dict[str, Any]:
        names = self.names
        body = json.dumps(self.spec()).encode()
        async with HttpPool(url, 8) as pool:

            async def each(method: str, path: str, ok: int, items: list[str]) -> None:
                async def one(name: str) -> None:
                    status, got = await pool.request(method, path.format(name), body)
                    assert status == ok, (method, path.format(name), status, got[:300])

                for i in range(0, len(items), 64):
                    await asyncio.gather(*(one(n) for n in items[i : i + 64]))

            t0 = time.perf_counter()
            await each("PUT", "/schedules/{}", 201, names)
            setup_s = time.perf_counter() - t0

            async def cpu() -> float:
                _, stats = await pool.json("GET", "/stats")
                return float(stats["process_cpu_s"])

            w = await self._window(cpu)
            seen, after = [], ""
            while True:  # every job, page by page
                _, page = await pool.json("GET", f"/jobs?limit={PAGE}{after}")
                for job in page["jobs"]:
                    made = tick_of(job)
                    if made is not None:
                        seen.append((*made, float(job["created_at"])))
                if not page["next"]:
                    break
                after = f"&after={page['next']}"
            await each("POST", "/schedules/{}/pause", 200, names)
            idle0 = await cpu()
            await asyncio.sleep(self.idle_s)
            idle = await cpu() - idle0
        return {**self._row(w, seen, setup_s), "idle_s": self.idle_s,
                "idle_cpu_s": round(idle, 3)}  # fmt: skip

    async def _window(self, cpu: Callable[[], Awaitable[float]]) -> dict[str, Any]:
        """Wait for a window that starts on a tick, and the CPU ``cpu`` reads over it."""
        margin, shared = _margin(self.period_s), self.shared or self.system == PEER
        ticks = window(self.period_s, self.ticks_n, time.time() + 2 * margin)
        await _until(ticks[0] - margin)
        cpu0, pg0 = await cpu(), pg_cpu() if shared else 0.0
        await _until(ticks[-1] + self.period_s - margin)
        used, pg = await cpu() - cpu0, pg_cpu() - pg0 if shared else None
        await _until(ticks[-1] + self.period_s + settle(self.period_s))
        return {"ticks": ticks, "cpu": used, "pg": pg}

    def _row(self, w: dict[str, Any], seen: list[tuple[str, int, float]],
             setup_s: float) -> dict[str, Any]:  # fmt: skip
        return {"system": self.system, "schedules": self.schedules, "period_s": self.period_s,
                "window_s": float(self.ticks_n * self.period_s),
                **tally(self.names, w["ticks"], seen),
                "cpu_s": round(w["cpu"], 3), "pg_cpu_s": w["pg"] and round(w["pg"], 3),
                "setup_s": round(setup_s, 3),
                "pg_version": pg_version() if w["pg"] is not None else ""}  # fmt: skip


def settle(period: int) -> float:
    """How long after the window the jobs are read: a job later than this counts as lost."""
    return min(5.0, 0.5 * period)


@dataclass(frozen=True, kw_only=True)
class PeerSchedulesRun(SchedulesRun):
    """procrastinate: one worker process whose deferrer makes every periodic task's jobs."""

    def execute(self) -> dict[str, Any]:
        dsn, env = cluster().create_database(), _peer_env()
        subprocess.run(_peer(PEER, "install", dsn), check=True, env=env, capture_output=True)
        cron = "* * * * *" if self.period_s == 60 else f"* * * * * */{self.period_s}"
        worker = _peer(PEER, "worker", dsn, "--concurrency", "8", "--periodic",
                       str(self.schedules), "--cron", cron)  # fmt: skip
        t0 = time.perf_counter()
        with tempfile.TemporaryFile() as log:
            proc = subprocess.Popen(worker, env=env, stdout=log, stderr=log)
            try:
                return asyncio.run(self._measure_peer(dsn, proc, t0))
            except BaseException:
                log.seek(0)
                print(log.read()[-4000:].decode(errors="replace"))  # the worker's last words
                raise
            finally:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

    async def _measure_peer(self, dsn: str, proc: subprocess.Popen[bytes],
                            t0: float) -> dict[str, Any]:  # fmt: skip
        conn = await asyncpg.connect(dsn)
        try:
            count = "SELECT count(*) FROM procrastinate_jobs WHERE task_name = 'tick'"

            async def started() -> bool:  # at start it defers each task's newest tick
                if proc.poll() is not None:
                    raise RuntimeError(f"the {PEER} worker exited with {proc.returncode}")
                return int(await conn.fetchval(count)) >= self.schedules

            if await _wait(started, 120, 0.2) is None:
                raise RuntimeError(f"the {PEER} worker deferred no first tick within 120 s")
            setup_s = time.perf_counter() - t0

            async def cpu() -> float:
                return proc_cpu(proc.pid)

            w = await self._window(cpu)
            seen = [(str(s), int(t), float(t) + late) for s, t, late
                    in await conn.fetch(PERIODIC_SQL)]  # fmt: skip
        finally:
            await conn.close()
        row = self._row(w, seen, setup_s)
        row["version"] = installed(PEERS[PEER]) or ""
        return row
