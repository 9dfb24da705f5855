"""O. Progress costs: a job reporting progress every 10 ms makes at most one store write
a second (issue 22).

On each durable engine, a fresh ``sqlq serve`` (``--import sqlq.bench.progresskind``)
runs one job of ``SECONDS`` that reports nothing, then the same job reporting progress
every ``EVERY_MS``, one at a time on an otherwise idle server. Around each, ``/stats``
gives the store's ``committed_calls`` and ``batches``; the progress job's writes are its
count minus the silent job's (both also pay for their submit, start and outcome). The
runtime coalesces reports to one write per job per ``progress_every_s`` (1 s), and the
latest goes with the outcome: so the bar is at most ``SECONDS`` + 1 writes (one per
second begun, the first at once), from some ``SECONDS`` x 100 reports. ``--quick``: 2 s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from sqlq.bench.client.http import HttpPool
from sqlq.bench.experiments.base import DURABLE, NAMES, Run
from sqlq.bench.experiments.rows import Row
from sqlq.bench.progresskind import IMPORT, KIND
from sqlq.bench.report import Report, cell, group, med

NAME = "O"
SECONDS, QUICK_SECONDS = 10.0, 2.0
EVERY_MS = 10


class ORow(Row, kw_only=True):
    seconds: float
    every_ms: int
    reports: int  # ctx.progress calls the job made
    commits_silent: int  # the store's committed calls over the job without progress
    commits_progress: int  # ... and over the job reporting progress
    batches_silent: int
    batches_progress: int
    last_percent: float | None  # the job's progress as stored at the end
    sync: str = "full"

    @property
    def progress_writes(self) -> int:
        return self.commits_progress - self.commits_silent

    @property
    def writes_per_s(self) -> float:
        return self.progress_writes / self.seconds


ROW = ORow


async def _job(pool: HttpPool, spec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
    """Submit ``spec``, wait until it is finished; the job, and the store's counters it cost."""

    async def store() -> dict[str, Any]:
        status, stats = await pool.json("GET", "/stats")
        assert status == 200, stats
        return dict(stats["store"])

    before = await store()
    status, job = await pool.json("POST", "/jobs", msgspec.json.encode(spec))
    if status != 201:
        raise RuntimeError(f"submit answered {status}: {job}")
    while job["state"] in ("scheduled", "running"):
        await asyncio.sleep(0.05)  # reads: they write nothing
        status, job = await pool.json("GET", f"/jobs/{job['id']}")
    after = await store()
    return job, {k: after[k] - before[k] for k in ("committed_calls", "batches")}


@dataclass(frozen=True, kw_only=True)
class ProgressRun(Run):
    seconds: float
    every_ms: int = EVERY_MS
    sync: str = "full"

    def execute(self) -> dict[str, Any]:
        from sqlq.bench.client.server import ServerProcess

        with ServerProcess.engine(
            store=self.store, sync=self.sync, flags=("--import", IMPORT)
        ) as srv:
            return asyncio.run(self._measure(srv.url))

    async def _measure(self, url: str) -> dict[str, Any]:
        def spec(every_ms: int) -> dict[str, Any]:
            return {"kind": KIND, "args": {"every_ms": every_ms, "seconds": self.seconds}}

        async with HttpPool(url, 1) as pool:
            silent, quiet = await _job(pool, spec(0))
            t0 = time.perf_counter()
            loud, costs = await _job(pool, spec(self.every_ms))
        for job in (silent, loud):
            if job["state"] != "completed":
                raise RuntimeError(f"the job ended {job['state']}: {job.get('last_error')}")
        progress = loud.get("progress") or {}
        return {
            "seconds": self.seconds, "every_ms": self.every_ms, "sync": self.sync,
            "reports": loud["result"]["reports"],
            "commits_silent": quiet["committed_calls"], "batches_silent": quiet["batches"],
            "commits_progress": costs["committed_calls"], "batches_progress": costs["batches"],
            "last_percent": progress.get("percent"), "job_s": round(time.perf_counter() - t0, 3),
        }  # fmt: skip


def runs(quick: bool, stores: tuple[str, ...]) -> Iterator[ProgressRun]:
    seconds = QUICK_SECONDS if quick else SECONDS
    for store in stores:
        if store in DURABLE:
            yield ProgressRun(
                experiment=NAME, store=store, label=f"O/{store}/every-{EVERY_MS}ms",
                seconds=seconds, params={"every_ms": EVERY_MS, "seconds": seconds},
            )  # fmt: skip


def section(rep: Report) -> None:
    rows = rep.rows(NAME, ORow)
    if not rows:
        return
    first = rows[0]
    rep.add(
        f"## O. Progress costs: store writes of a job reporting progress every {first.every_ms} ms",
        "",
        f"One job of {first.seconds:g} s that reports progress every {first.every_ms} ms, "
        "against the same job reporting nothing, one at a time on a fresh, otherwise idle "
        "server (`--sync full`); the store's committed calls and batches over each, from "
        "`/stats`. Progress writes: the difference. Median over the repeats.",
        "",
        "| store | reports | progress writes | writes/s | committed calls: silent / "
        "reporting | batches: silent / reporting | last percent |",
        "|---|---:|---:|---:|---:|---:|---:|",
    )
    by_store = group(rows, lambda r: r.store)
    for store in sorted(by_store, key=NAMES.index):
        rs = by_store[store]
        rep.add(
            f"| {store} | {cell([r.reports for r in rs])} | "
            f"{cell([r.progress_writes for r in rs])} | "
            f"{cell([r.writes_per_s for r in rs], '{:.2f}')} | "
            f"{cell([r.commits_silent for r in rs])} / {cell([r.commits_progress for r in rs])} | "
            f"{cell([r.batches_silent for r in rs])} / {cell([r.batches_progress for r in rs])} | "
            f"{cell([r.last_percent for r in rs], '{:.0f}')} |"
        )
    rep.add("")
    for store in sorted(by_store, key=NAMES.index):
        rs = by_store[store]
        writes, seconds = med(r.progress_writes for r in rs), rs[0].seconds
        rep.check(
            f"O: {store}, store writes of a job reporting progress every {first.every_ms} ms",
            f"{writes:.0f} in {seconds:g} s ({writes / seconds:.2f}/s), "
            f"from {med(r.reports for r in rs):,.0f} reports",
            writes <= seconds + 1 and all(r.last_percent == 100 for r in rs),
            "at most one a second begun, the latest with the outcome",
        )
    rep.add("")
