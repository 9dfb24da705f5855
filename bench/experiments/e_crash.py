"""E. kill -9 mid-run: every acknowledged job must finish after a restart."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import uvloop

from sqlq.bench.client.http import HTTPError, HttpPool
from sqlq.bench.client.loadgen import wait_drained
from sqlq.bench.client.server import ServerProcess
from sqlq.bench.experiments.base import DURABLE, NAMES, BenchRun, Run
from sqlq.bench.experiments.rows import Row
from sqlq.bench.report import Report, cell, group

NAME = "E"


class CrashRow(Row, kw_only=True):
    acknowledged: int
    lost: int
    unfinished: int
    reruns: int
    done_at_kill: float
    restart_to_ready_s: float
    recovery: dict[str, Any]


ROW = CrashRow


@dataclass(frozen=True, kw_only=True)
class CrashRun(Run):
    jobs: int = 3000
    work_ms: int = 30
    workers: int = 16
    kill_at: float = 0.25

    def execute(self) -> dict[str, Any]:
        return uvloop.run(self._go())

    async def _go(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="sqlq-crash-") as d:
            first = ServerProcess.engine(store=self.store, data_dir=d, workers=self.workers)
            first.start()
            acked: list[str] = []
            body = msgspec.json.encode({"kind": "sleep", "args": {"work_ms": self.work_ms}})
            stop = asyncio.Event()
            async with HttpPool(first.url, 32) as pool, HttpPool(first.url, 1) as control:

                async def client() -> None:
                    while not stop.is_set() and len(acked) < self.jobs:
                        try:
                            status, reply = await pool.json("POST", "/jobs", body)
                        except (HTTPError, OSError):
                            return  # the server is gone; this submit was never acked
                        if status == 201:
                            acked.append(reply["id"])

                async def killer() -> float:
                    while True:
                        _, stats = await control.json("GET", "/stats")
                        done = stats["jobs"]["completed"]
                        if done >= self.kill_at * self.jobs:
                            first.kill()
                            stop.set()
                            return float(done)
                        await asyncio.sleep(0.005)

                clients = [asyncio.create_task(client()) for _ in range(32)]
                done_at_kill = await killer()
                await asyncio.gather(*clients)
            first.cleanup()
            second = ServerProcess.engine(store=self.store, data_dir=d, workers=self.workers)
            t0 = time.perf_counter()
            second.start()
            ready_s = time.perf_counter() - t0
            try:
                result = await self._drain_and_verify(second.url, acked)
            finally:
                second.cleanup()
        result.update(
            label=self.label,
            store=self.store,
            acknowledged=len(acked),
            done_at_kill=done_at_kill,
            restart_to_ready_s=round(ready_s, 4),
        )
        return result

    async def _drain_and_verify(self, url: str, acked: list[str]) -> dict[str, Any]:
        async with HttpPool(url, 32) as pool:
            recovery = await wait_drained(pool)
            lost = reruns = unfinished = 0

            async def get(job_id: str) -> dict[str, Any] | None:
                status, job = await pool.json("GET", f"/jobs/{job_id}")
                return job if status == 200 else None

            for job in await asyncio.gather(*(get(j) for j in acked)):
                if job is None:
                    lost += 1
                elif job["state"] not in ("completed", "dead"):
                    unfinished += 1
                elif job["attempts"] > 1:
                    reruns += 1  # it ran before the kill but its completion was not durable
        return {"lost": lost, "unfinished": unfinished, "reruns": reruns, "recovery": recovery}


def runs(quick: bool, stores: tuple[str, ...]) -> Iterator[BenchRun]:
    for store in stores:
        if store in DURABLE:
            yield CrashRun(
                experiment=NAME,
                store=store,
                label=f"E/{store}",
                jobs=300 if quick else 3000,
                params={"sync": "full"},
            )


def section(rep: Report) -> None:
    rows = rep.rows(NAME, CrashRow)
    if not rows:
        return
    rep.add(
        "## E. kill -9 recovery",
        "",
        "3,000 x 30 ms jobs at 16 workers, `--sync full`, 32 submitting clients; SIGKILL "
        "once ~25% are done; restart on the same data; drain; fetch every acknowledged "
        "id. `reruns`: acknowledged jobs that ran to completion before the kill but whose "
        "completion was not yet durable, so they ran again (at-least-once).",
        "",
        "| store | acknowledged | lost | unfinished | reruns | restart to ready s | "
        "found running | recovery s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    )
    for s, rs in sorted(group(rows, lambda r: r.store).items(), key=lambda kv: NAMES.index(kv[0])):
        rep.add(
            f"| {s} | {cell([r.acknowledged for r in rs])} | "
            f"{sum(r.lost for r in rs)} (all runs) | {sum(r.unfinished for r in rs)} | "
            f"{cell([r.reruns for r in rs])} | "
            f"{cell([r.restart_to_ready_s for r in rs], '{:.3f}')} | "
            f"{cell([r.recovery['found_running'] for r in rs])} | "
            f"{cell([r.recovery['seconds'] for r in rs], '{:.4f}')} |"
        )
        lost = sum(r.lost + r.unfinished for r in rs)
        rep.check(
            f"E: {s}, kill -9 over {len(rs)} runs",
            f"{lost} acknowledged jobs lost",
            lost == 0,
            "bar 0",
        )
    rep.add("")
