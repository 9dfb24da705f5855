"""R's peers: the same graphs on sqlq and on Celery's chords and RQ's ``depends_on``, in
one run, clean and through a kill -9 (issue 36; ``sqlq.bench.flowmarks`` judges them).

Each run: ``COUNT`` chains of ``CHAIN`` steps and ``COUNT`` fans 1 -> ``FAN`` -> 1, every
step 2 ms of work that marks its start and end, run by ``CONCURRENCY`` at once. sqlq: a
fresh ``sqlq serve --sync full`` on an engine, each graph one workflow. A peer: a fresh
``redis-server`` (``appendonly yes``, ``appendfsync always``: sqlq's ``--sync full``) and
the peer's usual worker; its graphs sent by its own API in a process of its own. In
``kill`` mode, once ``KILL_AT`` of the steps have ended (the same point for every system,
read from the marks), what runs the steps is killed -9 and started again: sqlq's server
(its queue and its workers in one process), the peer's worker (its whole process group;
Redis runs on). Then the run waits until every graph's last step has ended, or until no
step has ended for ``STALL_S``: the graphs left are stuck.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from sqlq.bench.client.http import HttpPool
from sqlq.bench.client.server import ServerProcess
from sqlq.bench.experiments.base import Run
from sqlq.bench.flowmarks import (
    CHAIN,
    FAN,
    IMPORT,
    MARKS_ENV,
    STEP_MS,
    Graph,
    counts,
    final,
    finished,
    graphs,
    judge,
)
from sqlq.bench.redispeers import PEERS, REDIS_ENV, RedisPeer
from sqlq.bench.redisserver import RedisServer
from sqlq.bench.report import med

COUNT, QUICK_COUNT = 10, 2
CONCURRENCY = 4
KILL_AT = 0.3  # of the steps ended: the kill's moment, the same share for every system
STALL_S = 20.0  # no step ended this long: what is left is stuck
MODES = ("clean", "kill")
FLOW_MODULES = {"celery": "sqlq.bench.redisflow_celery", "rq": "sqlq.bench.redisflow_rq"}
SYSTEMS = ("celery", "celery-acks-late", "rq")  # the peers R runs, where installed


def _wait(marks: Path, finals: list[str]) -> float:
    """Until every final step ended, or none ended for ``STALL_S``; the seconds waited."""
    t0 = last_change = time.monotonic()
    seen = -1
    while True:
        done = finished(marks, finals)
        now = time.monotonic()
        if done == len(finals):
            return now - t0
        if done != seen:
            seen, last_change = done, now
        elif now - last_change > STALL_S:
            return now - t0
        time.sleep(0.05)


def _body(g: Graph) -> bytes:
    jobs = [{"kind": "flow.step", "ref": k, "depends_on": parents,
             "args": {"key": k, "ms": STEP_MS}} for k, parents in g.items()]  # fmt: skip
    return msgspec.json.encode({"workflow": True, "jobs": jobs})


async def _send(url: str, every: list[Graph]) -> None:
    async with HttpPool(url, 1) as pool:
        for g in every:
            status, answer = await pool.json("POST", "/jobs/batch", _body(g))
            if status != 201:
                raise RuntimeError(f"a workflow's submit answered {status}: {answer}")


@dataclass(frozen=True, kw_only=True)
class FlowRun(Run):
    """One system's graphs (``store``: an engine's name, or a Redis peer's), clean or
    through a kill -9; its row is ``RRow``'s part ``peers``."""

    mode: str
    count: int
    version: str = ""

    def execute(self) -> dict[str, Any]:
        every = graphs(self.count)
        with tempfile.TemporaryDirectory(prefix="sqlq-r-") as d:
            marks = Path(d) / "marks"
            env = {MARKS_ENV: str(marks)}
            if self.store in PEERS:
                waited, kill, durability = self._peer(every, marks, env, Path(d))
            else:
                waited, kill, durability = self._sqlq(every, marks, env, Path(d))
            in_flight, killed_at = kill
            j = judge(every, marks, killed_at)
        return {
            "part": "peers", "mode": self.mode, "system": self.store, "version": self.version,
            "durability": durability, "graphs": len(every), "steps": j.steps,
            "stuck": j.stuck, "early": j.early, "doubled": j.doubled,
            "unexplained": j.unexplained,
            "hop_ms_p50": round(med(j.hops_ms), 3) if j.hops_ms else None,
            "fan_in_ms_p50": round(med(j.fan_in_ms), 3) if j.fan_in_ms else None,
            "waited_s": round(waited, 3), "concurrency": CONCURRENCY,
            "in_flight_at_kill": in_flight,
        }  # fmt: skip

    def _sqlq(
        self, every: list[Graph], marks: Path, env: dict[str, str], d: Path
    ) -> tuple[float, tuple[int, float | None], str]:
        (d / "data").mkdir()
        data = str(d / "data")
        flags = ("--import", IMPORT)
        lives: list[ServerProcess] = []

        def server() -> ServerProcess:
            srv = ServerProcess.engine(store=self.store, data_dir=data, workers=CONCURRENCY,
                                       flags=flags, env=env)  # fmt: skip
            lives.append(srv)  # (before it starts: a start that fails is stopped too)
            return srv.start()

        kill: tuple[int, float | None] = (0, None)
        try:
            srv = server()
            asyncio.run(_send(srv.url, every))
            if self.mode == "kill":
                kill = _at_kill_point(marks, every)
                srv.kill()
                server()
            waited = _wait(marks, [final(g) for g in every])
        finally:
            for srv in lives:
                srv.kill()
        return waited, kill, f"sqlq serve --store {self.store} --sync full"

    def _peer(
        self, every: list[Graph], marks: Path, env: dict[str, str], d: Path
    ) -> tuple[float, tuple[int, float | None], str]:
        from sqlq.bench.experiments.q_redis import Child

        peer = PEERS[self.store]
        flow = RedisPeer(peer.name, peer.package, FLOW_MODULES[peer.package], peer.env)
        kill: tuple[int, float | None] = (0, None)
        with RedisServer("always") as r:
            full = {**os.environ, REDIS_ENV: r.url, **env, **peer.env}
            log = d / "worker.log"
            worker = Child(flow.worker(CONCURRENCY, r.url), full, log)
            try:
                subprocess.run(
                    [sys.executable, "-m", "sqlq.bench.flowmarks", flow.module, str(self.count)],
                    env=full, check=True, timeout=300,
                )  # fmt: skip
                if self.mode == "kill":
                    kill = _at_kill_point(marks, every)
                    worker.kill()
                    worker.stop()
                    worker = Child(flow.worker(CONCURRENCY, r.url), full, log)
                waited = _wait(marks, [final(g) for g in every])
            finally:
                worker.stop()
        return waited, kill, "redis: appendonly yes, appendfsync always"


def _at_kill_point(marks: Path, every: list[Graph]) -> tuple[int, float]:
    """Once ``KILL_AT`` of the steps have ended (or ``STALL_S`` passed without one more),
    the kill's moment: how many steps were started and not ended then (by the marks),
    and the time (the marks' clock) just before the kill."""
    steps = sum(len(g) for g in every)
    deadline = time.monotonic() + STALL_S
    while True:
        started, ended = counts(marks)
        if ended >= KILL_AT * steps or time.monotonic() > deadline:
            return started - ended, time.time()
        time.sleep(0.002)


def runs(quick: bool, stores: tuple[str, ...], name: str) -> list[FlowRun]:
    """One repeat's peer runs: sqlq on ``stores`` and each peer installed, in each mode."""
    from sqlq.bench.redispeers import available
    from sqlq.bench.redisserver import redis_version

    count = QUICK_COUNT if quick else COUNT
    have = available() if redis_version() else {}
    systems = [*stores, *(p for p in SYSTEMS if p in have)]
    return [
        FlowRun(
            experiment=name,
            store=s,
            label=f"R/{s}/{mode}",
            mode=mode,
            count=count,
            version=have.get(s, ""),
            params={"mode": mode, "count": count, "chain": CHAIN, "fan": FAN},
        )
        for mode in MODES
        for s in systems
    ]
