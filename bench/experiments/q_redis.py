"""Q. The Redis queues side by side: Celery, RQ, dramatiq and arq against sqlq, one run.

Every peer runs on Debian's ``redis-server``, which the bench starts itself
(``sqlq.bench.redisserver``): ``appendonly yes`` with ``appendfsync always`` beside sqlq
``--sync full`` (each acknowledged enqueue is on disk), and ``appendfsync everysec``
beside ``--sync os``. Each row states its pair (``level`` full or os).

- **noop** / **sleep**: ``NOOP_JOBS`` no-op jobs, and ``SLEEP_JOBS`` jobs of 20 ms
  (``time.sleep``; arq's ``asyncio.sleep``), at ``CONCURRENCY``-way concurrency for every
  system: Celery's prefork pool ``-c 16``, ``rq worker-pool -n 16``, dramatiq's
  processes x threads = 16, arq ``max_jobs=16``, ``sqlq serve --workers 16`` (in-process).
  End to end: the worker runs, warmed up by one job; then one client enqueues all the
  jobs with the peer's batch API (``sqlq.bench.redispeers``), or ``POST /jobs/batch``,
  ``BATCH`` a call, while the workers drain; the span ends when the last job has run
  (its mark, or sqlq's ``/stats`` counting it completed, durable). CPU: user + system
  seconds over the span of every process of the broker and the workers, children
  included (``/proc/PID/stat``; for sqlq its server, which is both, by its own finer
  clock, see ``SqlqRun``); the enqueuing
  client's is not counted, on either side.
- **kill**: ``KILL_JOBS`` 20 ms jobs enqueued (all acknowledged) at full durability,
  the worker started, and once ``KILL_AT`` of them have run, SIGKILL to the worker's whole
  process group, or to redis-server; then each is started again (the broker on its own
  directory and port) and the jobs get up to ``KILL_WAIT_S``. Lost: acknowledged jobs that
  never ran. sqlq's workers live in its server, so its worker and its server are one
  kill. Celery's ``held``: messages left in its ``unacked`` hash, which it restores only
  after its visibility timeout (an hour by default). The kill trials run in the first
  repeat only (``_kills_planned``): a spot check, not a rate.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sqlq.bench.client.http import HttpPool
from sqlq.bench.client.loadgen import run as loadgen
from sqlq.bench.client.loadgen import wait_drained
from sqlq.bench.client.server import ServerProcess, end_process
from sqlq.bench.experiments.base import DURABLE, NAMES, Run
from sqlq.bench.experiments.rows import Row
from sqlq.bench.redispeers import (
    BATCH,
    CONCURRENCY_ENV,
    DONE_ENV,
    PEERS,
    REDIS_ENV,
    THROUGHPUT,
    available,
    marked,
    marks,
)
from sqlq.bench.redisserver import RedisServer, redis_version
from sqlq.bench.report import Report, cell, group, med

NAME = "Q"
NOOP_JOBS, QUICK_NOOP_JOBS = 1000, 100
SLEEP_JOBS, QUICK_SLEEP_JOBS = 400, 32
SLEEP_S = 0.020
CONCURRENCY = 16
KILL_JOBS, QUICK_KILL_JOBS = 1000, 0
KILL_AT = 0.3  # the kill lands once this share of the jobs has run
KILL_WAIT_S = 60.0  # after the restart, the most the jobs get to finish
QUIET_S = 8.0  # ... or until no job has run for this long
DRAIN_S = 300.0  # a throughput run not done in this long: an error
MAX_RESTARTS = 3  # a killed broker: times a worker that exited is started again
STOP_S = 5.0  # a worker not gone this long after SIGTERM: SIGKILL to its group
LEVELS = {"full": ("always", "full"), "os": ("everysec", "os")}  # level: (appendfsync, --sync)
CLK = os.sysconf("SC_CLK_TCK")


class QRow(Row, kw_only=True):
    part: str  # noop, sleep, kill
    level: str  # full (appendfsync always / --sync full) or os (everysec / --sync os)
    durability: str  # as the row's system was configured
    version: str = ""  # the peer's, or redis-server's beside it
    jobs: int
    completed: int = 0  # distinct jobs that ran (noop, sleep: all of them)
    span_s: float = 0.0
    enqueue_s: float = 0.0
    cpu_s: float = 0.0  # broker and workers (sqlq: its server)
    broker_cpu_s: float = 0.0
    proc_cpu_s: float = 0.0  # sqlq: its server's CPU as /proc counts it (10 ms ticks)
    concurrency: int = CONCURRENCY
    target: str = ""  # kill: worker, broker or server
    acknowledged: int = 0
    ran_twice: int = 0
    lost: int = 0
    held: int = 0
    restarts: int = 0  # kill: workers started again after they exited on their own
    command: tuple[str, ...] = ()

    @property
    def jobs_per_s(self) -> float | None:
        return self.completed / self.span_s if self.span_s else None

    @property
    def cpu_us(self) -> float | None:
        return 1e6 * self.cpu_s / self.completed if self.completed else None


ROW = QRow


def tree_cpu(roots: list[int]) -> tuple[float, dict[int, float]]:
    """CPU seconds of ``roots`` and all their descendants (reaped children included), and
    each root's own tree's share."""
    stat: dict[int, tuple[int, float]] = {}
    for e in os.listdir("/proc"):
        if not e.isdigit():
            continue
        try:
            with open(f"/proc/{e}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        stat[int(e)] = (int(fields[1]), sum(int(x) for x in fields[11:15]) / CLK)
    per = dict.fromkeys(roots, 0.0)
    for pid, (_, cpu) in stat.items():
        p, seen = pid, 0
        while p in stat and p not in per and seen < 64:
            p, seen = stat[p][0], seen + 1
        if p in per:
            per[p] += cpu
    return sum(per.values()), per


class Child:
    """A worker process in a session of its own, so that a kill takes all its processes."""

    def __init__(self, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.cmd = cmd
        self._log: IO[bytes] = open(log, "ab")
        self.log = log
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # fmt: skip

    @property
    def pid(self) -> int:
        return self.proc.pid

    def check(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.cmd[:4]} exited with {self.proc.returncode}:\n{tail}")

    def kill(self) -> None:
        """SIGKILL to its whole group: the box it ran on died."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                self.kill()
        try:  # its pool's processes, had they outlived it
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._log.close()


def _wait(what: str, done: Any, within: float, alive: Any = None) -> None:
    deadline = time.monotonic() + within
    while not done():
        if alive is not None:
            alive()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {within}s")
        time.sleep(0.005)


@dataclass(frozen=True, kw_only=True)
class PeerRun(Run):
    """A Redis peer's no-op or 20 ms jobs, end to end (see the module's docstring)."""

    part: str
    level: str
    jobs: int
    sleep_s: float
    version: str

    def execute(self) -> dict[str, Any]:
        peer = PEERS[self.store]
        fsync = LEVELS[self.level][0]
        with tempfile.TemporaryDirectory(prefix="sqlq-q-") as d, RedisServer(fsync) as r:
            done = Path(d) / "done"
            env = {**os.environ, REDIS_ENV: r.url, DONE_ENV: str(done),
                   CONCURRENCY_ENV: str(CONCURRENCY), **peer.env}  # fmt: skip
            worker = Child(peer.worker(CONCURRENCY, r.url), env, Path(d) / "worker.log")
            enq = subprocess.Popen(
                [sys.executable, "-m", "sqlq.bench.redispeers", "enqueue", peer.name,
                 str(self.jobs), str(self.sleep_s), "--go"],
                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            assert enq.stdin is not None
            assert enq.stdout is not None
            try:
                if enq.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"{peer.name}'s enqueuer did not start")
                _wait("the warm-up job", lambda: marked(done) >= 1, 120, worker.check)
                c0, b0 = tree_cpu([r.pid, worker.pid])
                t0 = time.perf_counter()
                enq.stdin.write("go\n")
                enq.stdin.flush()
                enqueue_s = float(enq.stdout.readline())
                _wait("the drain", lambda: marked(done) >= self.jobs + 1, DRAIN_S, worker.check)
                span = time.perf_counter() - t0
                c1, b1 = tree_cpu([r.pid, worker.pid])
            finally:
                worker.stop()
                end_process(enq, signal.SIGKILL, 5.0)  # type: ignore[arg-type]
                enq.stdin.close()
                enq.stdout.close()
            completed = len(set(marks(done)))
        return {"part": self.part, "level": self.level, "jobs": self.jobs,
                "durability": f"redis {redis_version()}: appendonly yes, appendfsync {fsync}",
                "version": self.version, "completed": completed,
                "span_s": round(span, 4), "enqueue_s": round(enqueue_s, 4),
                "cpu_s": round(c1 - c0, 3), "broker_cpu_s": round(b1[r.pid] - b0[r.pid], 3),
                "command": worker.cmd[1:]}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class SqlqRun(Run):
    """sqlq's side: ``sqlq serve`` with in-process workers, ``POST /jobs/batch``."""

    part: str
    level: str
    jobs: int
    work_ms: int

    def execute(self) -> dict[str, Any]:
        sync = LEVELS[self.level][1]
        with ServerProcess.engine(store=self.store, sync=sync, workers=CONCURRENCY) as srv:
            assert srv.proc is not None
            c0, _ = tree_cpu([srv.proc.pid])
            res = loadgen(srv.url, jobs=self.jobs, work_ms=self.work_ms, concurrency=1,
                          batch=BATCH, label=self.label, drain_timeout=DRAIN_S,
                          fetch_jobs=False)  # fmt: skip
            c1, _ = tree_cpu([srv.proc.pid])
        # sqlq's server has no children, and its own clock (``/stats``' process_cpu_s,
        # process_time to the ms) reads finer than /proc's 10 ms ticks: a no-op row here
        # is a few ticks of CPU in all. /proc's reading is kept beside it.
        cpu = res["server_cpu_s"]
        return {"part": self.part, "level": self.level, "jobs": self.jobs,
                "durability": f"sqlq serve --store {self.store} --sync {sync}",
                "completed": res["done"], "span_s": res["total_s"],
                "enqueue_s": res["submit_s"], "cpu_s": round(cpu, 3),
                "broker_cpu_s": round(cpu, 3), "proc_cpu_s": round(c1 - c0, 3),
                "command": srv.cmd[1:]}  # fmt: skip


def _settle(count: Any, total: int) -> float:
    """Wait until ``count()`` reaches ``total``, stops moving for ``QUIET_S``, or
    ``KILL_WAIT_S`` passes; the seconds it took."""
    t0 = last_t = time.monotonic()
    last = count()
    while last < total and time.monotonic() - t0 < KILL_WAIT_S:
        time.sleep(0.05)
        now = count()
        if now != last:
            last, last_t = now, time.monotonic()
        elif time.monotonic() - last_t > QUIET_S:
            break
    return time.monotonic() - t0


def _celery_held(port: int) -> int:
    out = subprocess.run(["redis-cli", "-p", str(port), "HLEN", "unacked"],
                         capture_output=True, text=True)  # fmt: skip
    return int(out.stdout.strip() or 0)


@dataclass(frozen=True, kw_only=True)
class PeerKill(Run):
    target: str  # worker or broker
    jobs: int
    version: str

    def execute(self) -> dict[str, Any]:
        peer = PEERS[self.store]
        with tempfile.TemporaryDirectory(prefix="sqlq-q-") as d, RedisServer("always") as r:
            done = Path(d) / "done"
            env = {**os.environ, REDIS_ENV: r.url, DONE_ENV: str(done),
                   CONCURRENCY_ENV: str(CONCURRENCY), **peer.env}  # fmt: skip
            out = subprocess.run(
                [sys.executable, "-m", "sqlq.bench.redispeers", "enqueue", peer.name,
                 str(self.jobs), str(SLEEP_S)],
                env=env, capture_output=True, text=True, timeout=300, check=True,
            )  # fmt: skip
            acked = int(out.stdout.split()[-1])
            log = Path(d) / "worker.log"
            worker = Child(peer.worker(CONCURRENCY, r.url), env, log)
            try:
                _wait("the kill point", lambda: marked(done) >= KILL_AT * self.jobs, 120,
                      worker.check)  # fmt: skip
                if self.target == "broker":
                    r.kill()
                    r.start()
                else:
                    worker.kill()
                    worker.stop()
                    worker = Child(peer.worker(CONCURRENCY, r.url), env, log)
                restarts = 0

                def count() -> int:
                    """Jobs run so far; a worker that gave up (its broker gone) is started
                    again, as its supervisor would."""
                    nonlocal worker, restarts
                    if worker.proc.poll() is not None and restarts < MAX_RESTARTS:
                        worker.stop()
                        worker = Child(peer.worker(CONCURRENCY, r.url), env, log)
                        restarts += 1
                    return len(set(marks(done)))

                wait_s = _settle(count, self.jobs)
                held = _celery_held(r.port) if peer.package == "celery" else 0
            finally:
                worker.stop()
            ran = marks(done)
        distinct = len(set(ran))
        return {"part": "kill", "level": "full", "target": self.target, "jobs": self.jobs,
                "durability": "redis: appendonly yes, appendfsync always",
                "version": self.version, "acknowledged": acked, "completed": distinct,
                "ran_twice": len(ran) - distinct, "lost": acked - distinct, "held": held,
                "span_s": round(wait_s, 3), "restarts": restarts,
                "command": worker.cmd[1:]}  # fmt: skip


async def _sqlq_kill(store: str, jobs: int, data: str) -> dict[str, Any]:
    body = json.dumps({"jobs": [{"kind": "sleep", "args": {"work_ms": int(SLEEP_S * 1000)}}]
                       * BATCH}).encode()  # fmt: skip
    ids: list[str] = []
    srv = ServerProcess.engine(store=store, data_dir=data, workers=CONCURRENCY).start()
    try:
        async with HttpPool(srv.url, 1) as pool:
            for _ in range(jobs // BATCH):
                status, reply = await pool.json("POST", "/jobs/batch", body)
                if status == 201:
                    ids.extend(reply["ids"])
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                _, stats = await pool.json("GET", "/stats")
                if stats["jobs"]["completed"] >= KILL_AT * jobs:
                    break
                await asyncio.sleep(0.005)
    finally:
        srv.kill()
    again = ServerProcess.engine(store=store, data_dir=data, workers=CONCURRENCY).start()
    t0 = time.monotonic()
    try:
        async with HttpPool(again.url, 8) as pool:
            await wait_drained(pool, KILL_WAIT_S)
            completed = twice = 0
            for i in range(0, len(ids), 256):
                got = await asyncio.gather(
                    *(pool.json("GET", f"/jobs/{j}") for j in ids[i : i + 256])
                )
                for status, job in got:
                    if status == 200 and job["state"] == "completed":
                        completed += 1
                        twice += int(job.get("attempts", 1) > 1)
    finally:
        again.cleanup()
    return {"acknowledged": len(ids), "completed": completed, "ran_twice": twice,
            "lost": len(ids) - completed, "span_s": round(time.monotonic() - t0, 3)}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class SqlqKill(Run):
    jobs: int

    def execute(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="sqlq-q-") as d:
            row = asyncio.run(_sqlq_kill(self.store, self.jobs, d))
        return {"part": "kill", "level": "full", "target": "server", "jobs": self.jobs,
                "durability": f"sqlq serve --store {self.store} --sync full", **row}  # fmt: skip


_kills_planned: list[bool] = []  # the kill trials go into the first repeat's plan only


def runs(quick: bool, stores: tuple[str, ...], peers: tuple[str, ...] = ()) -> Iterator[Run]:
    """One repeat: for each level, each part, sqlq's engines and the peers alternating.
    ``peers``: only these (the test's), of those installed."""
    have = available()
    chosen = [p for p in THROUGHPUT if p in have and (not peers or p in peers)]
    engines = [s for s in stores if s in DURABLE] or list(DURABLE)
    for level in LEVELS:
        for part, n, q, ms in (("noop", NOOP_JOBS, QUICK_NOOP_JOBS, 0),
                               ("sleep", SLEEP_JOBS, QUICK_SLEEP_JOBS, 20)):  # fmt: skip
            jobs = q if quick else n
            for store in engines:
                yield SqlqRun(experiment=NAME, store=store, label=f"Q/{part}/{level}/{store}",
                              part=part, level=level, jobs=jobs, work_ms=ms,
                              params={"part": part, "level": level})  # fmt: skip
            for p in chosen:
                yield PeerRun(experiment=NAME, store=p, label=f"Q/{part}/{level}/{p}",
                              part=part, level=level, jobs=jobs, sleep_s=ms / 1000,
                              version=have[p], params={"part": part, "level": level})  # fmt: skip
    kill = QUICK_KILL_JOBS if quick else KILL_JOBS
    if not kill or _kills_planned:
        return
    _kills_planned.append(True)
    for store in engines:
        yield SqlqKill(experiment=NAME, store=store, label=f"Q/kill/{store}", jobs=kill,
                       params={"part": "kill", "target": "server"})  # fmt: skip
    for p in [x for x in PEERS if x in have and (not peers or PEERS[x].package in peers)]:
        for target in ("worker", "broker"):
            yield PeerKill(experiment=NAME, store=p, label=f"Q/kill/{p}/{target}",
                           target=target, jobs=kill, version=have[p],
                           params={"part": "kill", "target": target})  # fmt: skip


# -- the report -------------------------------------------------------------------------------

ORDER = (*NAMES, *PEERS)


def ratios(rows: list[QRow], system: str, base: str, value: str) -> list[float]:
    """``system``'s ``value`` over ``base``'s, within each repeat that has both."""
    out = []
    for rs in group(rows, lambda r: r.repeat).values():
        a = [getattr(r, value) for r in rs if r.store == system]
        b = [getattr(r, value) for r in rs if r.store == base]
        if a and b and a[0] is not None and b[0]:
            out.append(a[0] / b[0])
    return out


def _table(rep: Report, rows: list[QRow], part: str) -> None:
    mine = [r for r in rows if r.part == part]
    if not mine:
        return
    base = next((s for s in ("walq", "sqlite") if any(r.store == s for r in mine)), "")
    what = "no-op jobs" if part == "noop" else f"{int(SLEEP_S * 1000)} ms jobs"
    rep.add(
        f"### {mine[0].jobs:,} {what}, {CONCURRENCY}-way",
        "",
        f"`x {base}`: the ratio to sqlq on {base} at the same durability, within each repeat "
        "(jobs/s: above 1 is faster than sqlq; CPU: above 1 costs more than sqlq).",
        "",
        f"| durability | system | jobs/s | x {base} | CPU us/job | x {base} | "
        "broker CPU us/job | enqueue s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    )
    for level in LEVELS:
        at = [r for r in mine if r.level == level]
        for system in sorted({r.store for r in at}, key=ORDER.index):
            rs = [r for r in at if r.store == system]
            said = rs[0].durability
            name = system if system not in NAMES else f"sqlq ({system})"
            if rs[0].version:
                name += f" {rs[0].version}"
            broker = [1e6 * r.broker_cpu_s / r.completed for r in rs if r.completed]
            rep.add(
                f"| {said} | {name} | {cell([r.jobs_per_s for r in rs])} | "
                f"{cell(ratios(at, system, base, 'jobs_per_s'), '{:.3g}')} | "
                f"{cell([r.cpu_us for r in rs])} | "
                f"{cell(ratios(at, system, base, 'cpu_us'), '{:.3g}')} | "
                f"{cell(broker) if system not in NAMES else '-'} | "
                f"{cell([r.enqueue_s for r in rs], '{:.2f}')} |"
            )
    rep.add("")


def _kills(rep: Report, rows: list[QRow]) -> None:
    mine = [r for r in rows if r.part == "kill"]
    if not mine:
        return
    rep.add(
        "### kill -9 mid-drain (a spot check)",
        "",
        f"{mine[0].jobs:,} jobs of {int(SLEEP_S * 1000)} ms enqueued (all acknowledged), full "
        f"durability; SIGKILL once {KILL_AT:.0%} have run, to the worker's process group or "
        f"the broker (sqlq: its server, which runs its workers), then restarted; up to "
        f"{KILL_WAIT_S:.0f} s (or {QUIET_S:.0f} s with no job run) to finish. `lost`: "
        "acknowledged jobs not run by the end of that wait (a peer's own recovery may run "
        "some later: dramatiq requeues a dead worker's messages after its 60 s heartbeat "
        "timeout, arq after a job's in-progress key expires); `held`: Celery's messages "
        "left in its `unacked` hash, which come back only after its visibility timeout (1 h "
        "by default); "
        "`ran twice`: jobs that ran more than once (sqlq: attempts above 1); `restarts`: "
        "workers that exited on their own after the broker's kill, started again.",
        "",
        "| system | killed | acknowledged | ran | lost | held | ran twice | restarts | wait s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    )
    for r in sorted(mine, key=lambda r: (ORDER.index(r.store), r.target)):
        name = r.store if r.store not in NAMES else f"sqlq ({r.store})"
        rep.add(f"| {name} | {r.target} | {r.acknowledged:,} | {r.completed:,} | {r.lost:,} "
                f"| {r.held:,} | {r.ran_twice:,} | {r.restarts} | {r.span_s:.1f} |")  # fmt: skip
    rep.add("")


def section(rep: Report) -> None:
    rows = rep.rows(NAME, QRow)
    if not rows:
        return
    rep.add(
        "## Q. The Redis queues side by side",
        "",
        "Celery (prefork, Redis broker), RQ (`rq worker-pool`), dramatiq (`RedisBroker`) and "
        "arq against `sqlq serve` with in-process workers, on this machine in one run, on "
        "Debian's `redis-server` started by the bench (a fresh one each run, `appendonly "
        "yes`). Durability is matched and stated per row: `appendfsync always` beside "
        "`--sync full`, `everysec` beside `--sync os`. End to end: one client enqueues with "
        f"the peer's batch API ({BATCH:,} a call; sqlq: `POST /jobs/batch`) while a warmed-up "
        "worker drains; jobs/s over enqueue start to the last job run. CPU: every process "
        "of the broker and the workers over that span, children included; sqlq's is its "
        "server's (broker and workers in one). Medians with [min-max] over the repeats.",
        "",
    )
    _table(rep, rows, "noop")
    _table(rep, rows, "sleep")
    _kills(rep, rows)
    full = [r for r in rows if r.part == "noop" and r.level == "full"]
    for system in sorted({r.store for r in full} - set(NAMES), key=ORDER.index):
        x = ratios(full, system, "walq", "cpu_us")
        y = ratios(full, system, "walq", "jobs_per_s")
        if x and y:
            rep.check(f"Q: no-op jobs, {system} (appendfsync always) over sqlq walq (--sync "
                      "full): CPU a job, jobs/s", f"{med(x):.3g}x, {med(y):.3g}x",
                      med(x) >= 1.0, "bar: in the report; met when sqlq's CPU a job is at "
                      "most the peer's")  # fmt: skip
    kills = [r for r in rows if r.part == "kill"]
    if kills:
        said = ", ".join(
            f"{r.store} ({r.target}) {r.lost}"
            for r in sorted(kills, key=lambda r: (ORDER.index(r.store), r.target))
        )
        ours = sum(r.lost for r in kills if r.store in NAMES)
        rep.check("Q: acknowledged jobs lost under kill -9 (not run by the end of the wait)",
                  said, ours == 0, "bar: in the report; met when sqlq lost none")  # fmt: skip


__all__ = ["NAME", "ROW", "QRow", "runs", "section"]
