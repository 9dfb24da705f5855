"""K. Close to the machine's limits: restart time and memory per queued job, walq's replay
speed against a plain decode loop, server CPU per job, and huey beside the engines.

``results/K.jsonl`` is the current tree's run; ``results/versus-before/K-before.jsonl``
is the same experiment run on the tree before the work on these costs (the same
machine), which ``--report-only --with-before`` sets beside its own copy of K.

- **restart**: N jobs delayed by a day are written through the engine and compacted
  (``sqlq.bench.fill --live --compact``); ``sqlq serve`` starts on them; seconds from
  spawn to ``/readyz`` 200, and the server's RSS (``VmRSS``) less an empty server's, per
  job. Beside it, in the same run (once before the server starts and once after it
  stops, the mean), the **plain read** of the same live jobs from the same files: a
  msgspec decode loop over every line of walq's log, or a ``SELECT`` of the live rows'
  columns through ``sqlite3`` (``PLAIN_SCRIPT``); ``ready x`` is the one over the other.
  **submit**: the same N jobs submitted over HTTP (``/jobs/batch``, 1,000 each) to a
  fresh server; its RSS less the empty server's, per job.
- **replay**: a walq log of 1,000,000 transitions (``sqlq.bench.fill``); in one
  process, alternately, the engine's recovery (``WalStore.open``) and the plain
  loop that decodes every line with msgspec; the ratio of their times.
- **cpu**: 30,000 no-op jobs by single POST from 32 clients, 64 workers,
  ``--sync full``; server process CPU (all threads) per job, every engine.
- **huey**: huey's ``SqliteHuey`` (fsync on), in process with its own consumer
  (no HTTP), no-op jobs end to end, beside sqlq's engines with batch submission
  in the same run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlq.bench.client.loadgen import run
from sqlq.bench.client.server import ServerProcess
from sqlq.bench.experiments.base import Run, compiled
from sqlq.bench.experiments.rows import CodedRow
from sqlq.bench.report import Report, med
from sqlq.engines.registry import DURABLE

NAME = "K"
READY_GOAL_X = 3.0  # ready within this many times the plain read of the same jobs
RSS_GOAL_B = 512
REPLAY_GOAL_X = 0.5
CPU_GOAL_US = 50.0
ENGINES = DURABLE


class KRow(CodedRow, kw_only=True):
    part: str  # restart, submit, replay, cpu, huey
    jobs: int = 0
    ready_s: float = 0.0
    plain_s: float = 0.0  # the plain read of the same live jobs from the same files
    rss_bytes: int = 0
    empty_rss_bytes: int = 0
    replay_s: float = 0.0
    decode_s: float = 0.0
    cpu_us_per_job: float = 0.0
    jobs_per_s: float = 0.0

    @property
    def ready_x(self) -> float:
        """Ready time over the plain read's (NaN where there was none: older rows)."""
        return self.ready_s / self.plain_s if self.plain_s else float("nan")

    @property
    def rss_per_job(self) -> float:
        return (self.rss_bytes - self.empty_rss_bytes) / self.jobs if self.jobs else 0.0


ROW = KRow


def rss(pid: int) -> int:
    """Resident set size of ``pid``, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def _server_rss(srv: ServerProcess) -> int:
    assert srv.proc is not None
    return rss(srv.proc.pid)


def _empty_rss(store: str) -> int:
    with ServerProcess.engine(store=store, workers=16) as srv:
        return _server_rss(srv)


def _submit_delayed(url: str, jobs: int) -> None:
    body = json.dumps(
        {"jobs": [{"kind": "sleep", "args": {"work_ms": 0}, "delay_ms": 86_400_000}] * 1000}
    ).encode()
    for _ in range(jobs // 1000):
        req = urllib.request.Request(url + "/jobs/batch", data=body, method="POST",
                                     headers={"content-type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 201


# The plain read of a restart's live jobs, in a process of its own, its own clock: walq,
# msgspec decoding every line of the log (the header's and every job's record); SQLite,
# every column of the live rows as sqlite3 gives them (the statement recovery runs).
PLAIN_SCRIPT = """
import sqlite3, sys, time, msgspec
store, path = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
if store == "walq":
    with open(path, "rb") as f:
        for line in f:
            msgspec.json.decode(line)
else:
    from sqlq.engines.sqlite.queries import Q
    db = sqlite3.connect(path)
    for row in db.execute(Q["live_jobs"]):
        pass
    db.close()
print(time.perf_counter() - t0)
"""
FILES = {"walq": "walq/walq.log", "sqlite": "sqlite/sqlq.db"}  # under the data directory


def plain_read(store: str, data: str) -> float:
    """Seconds the plain loop takes to read the live jobs of ``data``'s ``store``."""
    path = str(Path(data) / FILES[store])
    out = subprocess.run([sys.executable, "-c", PLAIN_SCRIPT, store, path], check=True,
                         capture_output=True, text=True)  # fmt: skip
    return float(out.stdout)


@dataclass(frozen=True, kw_only=True)
class MemoryRun(Run):
    """Restart on N live jobs (ready time, RSS), or N submitted to a fresh server (RSS)."""

    jobs: int
    part: str  # "restart" or "submit"

    def execute(self) -> dict[str, Any]:
        compiled()
        empty = _empty_rss(self.store)
        row: dict[str, Any] = {"part": self.part, "jobs": self.jobs, "empty_rss_bytes": empty}
        with tempfile.TemporaryDirectory(prefix="sqlq-k-") as d:
            plain: list[float] = []
            if self.part == "restart":
                subprocess.run([sys.executable, "-m", "sqlq.bench.fill", "--store", self.store,
                                "--data", d, "--live", str(self.jobs), "--compact"],
                               check=True)  # fmt: skip
                # The fill writes with ``sync=os``; a restarted server finds its files
                # durable (they were written with ``--sync full``): the fill's ~0.5 GB of
                # dirty pages are written back before the clock starts, not during it.
                os.sync()
                plain.append(plain_read(self.store, d))
            srv = ServerProcess.engine(store=self.store, data_dir=d, workers=16,
                                       ready_within=600)  # fmt: skip
            with srv:
                row["ready_s"] = srv.ready_s
                if self.part == "submit":
                    _submit_delayed(srv.url, self.jobs)
                row["rss_bytes"] = _server_rss(srv)
            if plain:
                plain.append(plain_read(self.store, d))
                row["plain_s"] = sum(plain) / len(plain)
        return row


REPLAY_SCRIPT = """
import asyncio, sys, time, msgspec
from sqlq.walq.store import WalStore
path, data, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
decode, replay = [], []
for _ in range(repeats):
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        for line in f:
            msgspec.json.decode(line)
    decode.append(time.perf_counter() - t0)
    async def go():
        s = WalStore(data, sync="os", retention=float("inf"))
        t0 = time.perf_counter()
        await s.open()
        took = time.perf_counter() - t0
        await s.close()
        return took
    replay.append(asyncio.run(go()))
decode.sort(); replay.sort()
print(decode[len(decode) // 2], replay[len(replay) // 2])
"""


@dataclass(frozen=True, kw_only=True)
class ReplayRun(Run):
    """walq's recovery of a log against the plain decode loop over the same file."""

    transitions: int

    def execute(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="sqlq-k-") as d:
            subprocess.run([sys.executable, "-m", "sqlq.bench.fill", "--store", "walq", "--data", d,
                            "--transitions", str(self.transitions)], check=True)  # fmt: skip
            walq = str(Path(d) / "walq")
            out = subprocess.run(
                [sys.executable, "-c", REPLAY_SCRIPT, str(Path(walq) / "walq.log"), walq, "3"],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
        decode_s, replay_s = (float(x) for x in out.stdout.split())
        return {"part": "replay", "jobs": self.transitions, "decode_s": decode_s,
                "replay_s": replay_s}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class CpuRun(Run):
    """No-op jobs by single POST (or by batch, for the huey comparison): CPU and rate."""

    jobs: int
    batch: int = 1

    def execute(self) -> dict[str, Any]:
        with ServerProcess.engine(store=self.store, workers=64) as srv:
            result = run(srv.url, jobs=self.jobs, work_ms=0, concurrency=32 if self.batch == 1
                         else 4, batch=self.batch, label=self.label)  # fmt: skip
        return {"part": "cpu" if self.batch == 1 else "huey", "jobs": self.jobs,
                "cpu_us_per_job": 1e6 * result["server_cpu_s"] / self.jobs,
                "jobs_per_s": self.jobs / result["total_s"]}  # fmt: skip


HUEY_SCRIPT = """
import sys, time, tempfile, os, threading
from huey import SqliteHuey
from huey.consumer import Consumer
n = int(sys.argv[1])
d = tempfile.mkdtemp()
huey = SqliteHuey(filename=os.path.join(d, "huey.db"), fsync=True)
done = []
@huey.task()
def noop():
    done.append(1)
t0 = time.perf_counter()
for _ in range(n):
    noop()
consumer = Consumer(huey, workers=16, worker_type="thread", periodic=False, initial_delay=0.001,
                    backoff=1.0, max_delay=0.01)
threading.Thread(target=consumer.run, daemon=True).start()
while len(done) < n:
    time.sleep(0.005)
print(time.perf_counter() - t0)
os._exit(0)
"""


@dataclass(frozen=True, kw_only=True)
class HueyRun(Run):
    jobs: int

    def execute(self) -> dict[str, Any]:
        out = subprocess.run([sys.executable, "-c", HUEY_SCRIPT, str(self.jobs)], check=True,
                             capture_output=True, text=True, timeout=600)  # fmt: skip
        return {"part": "huey", "jobs": self.jobs, "jobs_per_s": self.jobs / float(out.stdout)}


def runs(quick: bool, stores: tuple[str, ...]) -> Iterator[Any]:
    sizes = (10_000,) if quick else (100_000, 1_000_000)
    for n in sizes:
        for part in ("restart", "submit"):
            for store in ENGINES:
                yield MemoryRun(experiment=NAME, store=store, label=f"K/{part}/{store}/{n}",
                                jobs=n, part=part)  # fmt: skip
    transitions = 20_000 if quick else 1_000_000
    yield ReplayRun(experiment=NAME, store="walq", label=f"K/replay/{transitions}",
                    transitions=transitions)  # fmt: skip
    cpu_jobs = 3000 if quick else 30_000
    for store, batch in [*((s, 1) for s in ("memory", *ENGINES)), *((s, 100) for s in ENGINES)]:
        yield CpuRun(experiment=NAME, store=store, label=f"K/cpu/{store}/batch{batch}",
                     jobs=cpu_jobs, batch=batch)  # fmt: skip
    if importlib.util.find_spec("huey") is None:  # pip install -e '.[peers]'
        return
    yield HueyRun(experiment=NAME, store="huey", label="K/huey", jobs=cpu_jobs)


def section(rep: Report) -> None:
    rows, codes = rep.before_after(NAME, KRow)
    if not rows:
        return
    rep.add(
        "## K. Close to the machine's limits",
        "",
        (
            "Rows labelled `before` and `after` ran on the same machine, before and after the "
            "work on these costs; medians over repeats. "
            if "before" in codes
            else "This tree's run (`code` after); medians over repeats. "
        )
        + "`ready s`: spawn to `/readyz` 200, on jobs written and compacted, with sqlq's "
        "bytecode written first, as an install writes it. `plain read s`: "
        "in the same run, a plain loop reading the same live jobs from the same files (walq: "
        "msgspec decoding every line of its log; SQLite: a `SELECT` of the live rows' columns "
        "through `sqlite3`), the mean of once before the server and once after; `ready x`: "
        "the one over the other. "
        "`RSS/job`: the server's VmRSS less an empty server's, over the jobs. `replay x`: "
        "the plain msgspec decode loop's time over walq's recovery time on the same log "
        "(1 = recovery as fast as decoding). `CPU us/job`: server process CPU, all threads, "
        "no-op jobs by single POST (32 clients, 64 workers, `--sync full`). `no-op jobs/s "
        "(batch)`: end to end, 4 clients submitting 100 per POST; huey's `SqliteHuey` "
        "(fsync on) runs the same jobs in process with its own consumer (16 threads). What "
        "differs: huey has no HTTP in the path, and it is at-most-once on a crash (a task "
        "dequeued by a worker that dies is gone), where sqlq acknowledges a job only once it "
        "is durable and runs it again after a crash.",
        "",
        "| code | part | store | jobs | ready s | plain read s | ready x | RSS/job B |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    )
    for code in codes:
        for part in ("restart", "submit"):
            for store in ENGINES:
                for n in sorted({r.jobs for r in rows if r.part == part}):
                    rs = [r for r in rows if (r.code, r.part, r.store, r.jobs) ==
                          (code, part, store, n)]  # fmt: skip
                    if not rs:
                        continue
                    ready = plain = times = "-"
                    if part == "restart":
                        ready = f"{med(r.ready_s for r in rs):.2f}"
                        timed = [r for r in rs if r.plain_s]
                        if timed:
                            plain = f"{med(r.plain_s for r in timed):.2f}"
                            times = f"{med(r.ready_x for r in timed):.2f}"
                    rep.add(f"| {code} | {part} | {store} | {n:,} | {ready} | {plain} | {times} "
                            f"| {med(r.rss_per_job for r in rs):,.0f} |")  # fmt: skip
    rep.add("", "| code | replay: recovery s | decode loop s | replay x | CPU us/job: memory | "
            "walq | sqlite | no-op jobs/s (batch): walq | sqlite | huey |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")  # fmt: skip
    for code in codes:
        mine = [r for r in rows if r.code == code]
        rp = [r for r in mine if r.part == "replay"]
        cpu = {s: [r.cpu_us_per_job for r in mine if r.part == "cpu" and r.store == s]
               for s in ("memory", *ENGINES)}  # fmt: skip
        rate = {s: [r.jobs_per_s for r in mine if r.part == "huey" and r.store == s]
                for s in (*ENGINES, "huey")}  # fmt: skip

        def f(v: list[float], fmt: str = "{:,.0f}") -> str:
            return fmt.format(med(v)) if v else "-"

        rep.add(
            f"| {code} | {f([r.replay_s for r in rp], '{:.2f}')} | "
            f"{f([r.decode_s for r in rp], '{:.2f}')} | "
            f"{f([r.decode_s / r.replay_s for r in rp], '{:.2f}')} | "
            + " | ".join(f(cpu[s]) for s in ("memory", *ENGINES))
            + " | "
            + " | ".join(f(rate[s]) for s in (*ENGINES, "huey"))
            + " |"
        )
    after = [r for r in rows if r.code == codes[-1]]
    for store in ENGINES:
        big = [r for r in after if r.part == "restart" and r.store == store and r.plain_s]
        if big:
            n = max(r.jobs for r in big)
            took = med(r.ready_s for r in big if r.jobs == n)
            x = med(r.ready_x for r in big if r.jobs == n)
            rep.check(
                f"K: {store} ready with {n:,} live jobs, against the plain read of them",
                f"{took:.2f} s, {x:.2f}x", x <= READY_GOAL_X, f"goal <= {READY_GOAL_X:.0f}x",
            )  # fmt: skip
        for part in ("submit", "restart"):
            mem = [r for r in after if r.part == part and r.store == store]
            if mem:
                n = max(r.jobs for r in mem)
                per = med(r.rss_per_job for r in mem if r.jobs == n)
                rep.check(
                    f"K: {store} RSS per queued job at {n:,}, after {part}",
                    f"{per:,.0f} B", per <= RSS_GOAL_B, f"goal <= {RSS_GOAL_B} B",
                )  # fmt: skip
        used = med(r.cpu_us_per_job for r in after if r.part == "cpu" and r.store == store)
        if used == used:  # not NaN: there were rows
            rep.check(f"K: {store} server CPU per durable no-op job", f"{used:.0f} us",
                      used <= CPU_GOAL_US, f"goal <= {CPU_GOAL_US:.0f} us")  # fmt: skip
    rp = [r for r in after if r.part == "replay"]
    if rp:
        x = med(r.decode_s / r.replay_s for r in rp)
        rep.check("K: walq replay speed vs the plain decode loop", f"{x:.2f}x",
                  x >= REPLAY_GOAL_X, f"goal >= {REPLAY_GOAL_X}x")  # fmt: skip
