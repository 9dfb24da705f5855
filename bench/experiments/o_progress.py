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

What a write costs: the same pair of jobs, each first saving a checkpoint of
``CHECKPOINT_KIB`` (64 KiB, the most a checkpoint may be), and the bytes the server process
sent to storage over each (``write_bytes`` of ``/proc/<pid>/io``: pages dirtied in files,
so a write of a few bytes that is synced counts its page). A store that rewrites the whole
job at every progress write writes the checkpoint again each time; one that writes what
changed writes a few hundred bytes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from sqlq.bench.client.http import HttpPool
from sqlq.bench.experiments.base import DURABLE, Run, by_store
from sqlq.bench.experiments.rows import CodedRow
from sqlq.bench.progresskind import IMPORT, KIND
from sqlq.bench.report import Report, cell, med

NAME = "O"
SECONDS, QUICK_SECONDS = 10.0, 2.0
EVERY_MS = 10
CHECKPOINT_KIB = 64


class ORow(CodedRow, kw_only=True):
    seconds: float
    every_ms: int
    reports: int  # ctx.progress calls the job made
    commits_silent: int  # the store's committed calls over the job without progress
    commits_progress: int  # ... and over the job reporting progress
    batches_silent: int
    batches_progress: int
    last_percent: float | None  # the job's progress as stored at the end
    sync: str = "full"
    checkpoint_kib: int = 0  # the checkpoint each job saved first (0: none)
    bytes_silent: int = 0  # bytes the server wrote to storage over the silent job
    bytes_progress: int = 0  # ... and over the job reporting progress

    @property
    def progress_bytes_per_s(self) -> float:
        return (self.bytes_progress - self.bytes_silent) / self.seconds

    @property
    def progress_writes(self) -> int:
        return self.commits_progress - self.commits_silent

    @property
    def writes_per_s(self) -> float:
        return self.progress_writes / self.seconds


ROW = ORow


def written(pid: int) -> int:
    """Bytes ``pid`` has sent to storage so far (its pages dirtied in files)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise RuntimeError(f"no write_bytes for {pid}")


async def _job(
    pool: HttpPool, spec: dict[str, Any], pid: int
) -> tuple[dict[str, Any], dict[str, int]]:
    """Submit ``spec``, wait until it is finished; the job, and the store's counters and the
    bytes written it cost."""

    async def store() -> dict[str, Any]:
        status, stats = await pool.json("GET", "/stats")
        assert status == 200, stats
        return dict(stats["store"])

    before = await store()
    began = written(pid)
    status, job = await pool.json("POST", "/jobs", msgspec.json.encode(spec))
    if status != 201:
        raise RuntimeError(f"submit answered {status}: {job}")
    while job["state"] in ("scheduled", "running"):
        await asyncio.sleep(0.05)  # reads: they write nothing
        status, job = await pool.json("GET", f"/jobs/{job['id']}")
    after = await store()
    costs = {k: after[k] - before[k] for k in ("committed_calls", "batches")}
    return job, {**costs, "bytes": written(pid) - began}


@dataclass(frozen=True, kw_only=True)
class ProgressRun(Run):
    seconds: float
    every_ms: int = EVERY_MS
    sync: str = "full"
    checkpoint_kib: int = 0

    def execute(self) -> dict[str, Any]:
        from sqlq.bench.client.server import ServerProcess

        with ServerProcess.engine(
            store=self.store, sync=self.sync, flags=("--import", IMPORT)
        ) as srv:
            assert srv.proc is not None
            return asyncio.run(self._measure(srv.url, srv.proc.pid))

    async def _measure(self, url: str, pid: int) -> dict[str, Any]:
        def spec(every_ms: int) -> dict[str, Any]:
            args = {"every_ms": every_ms, "seconds": self.seconds}
            return {"kind": KIND, "args": {**args, "checkpoint_kib": self.checkpoint_kib}}

        async with HttpPool(url, 1) as pool:
            silent, quiet = await _job(pool, spec(0), pid)
            t0 = time.perf_counter()
            loud, costs = await _job(pool, spec(self.every_ms), pid)
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
            "checkpoint_kib": self.checkpoint_kib, "bytes_silent": quiet["bytes"],
            "bytes_progress": costs["bytes"],
        }  # fmt: skip


def runs(quick: bool, stores: tuple[str, ...]) -> Iterator[ProgressRun]:
    seconds = QUICK_SECONDS if quick else SECONDS
    for kib in (0, CHECKPOINT_KIB):
        for store in stores:
            if store in DURABLE:
                yield ProgressRun(
                    experiment=NAME, store=store, label=f"O/{store}/every-{EVERY_MS}ms"
                    + (f"/checkpoint-{kib}k" if kib else ""), seconds=seconds,
                    checkpoint_kib=kib,
                    params={"every_ms": EVERY_MS, "seconds": seconds, "checkpoint_kib": kib},
                )  # fmt: skip


def section(rep: Report) -> None:
    every, codes = rep.before_after(NAME, ORow)
    rows = [r for r in every if r.code == codes[-1] and not r.checkpoint_kib] if every else []
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
    stores = by_store(rows)
    for store, rs in stores.items():
        rep.add(
            f"| {store} | {cell([r.reports for r in rs])} | "
            f"{cell([r.progress_writes for r in rs])} | "
            f"{cell([r.writes_per_s for r in rs], '{:.2f}')} | "
            f"{cell([r.commits_silent for r in rs])} / {cell([r.commits_progress for r in rs])} | "
            f"{cell([r.batches_silent for r in rs])} / {cell([r.batches_progress for r in rs])} | "
            f"{cell([r.last_percent for r in rs], '{:.0f}')} |"
        )
    rep.add("")
    for store, rs in stores.items():
        writes, seconds = med(r.progress_writes for r in rs), rs[0].seconds
        rep.check(
            f"O: {store}, store writes of a job reporting progress every {first.every_ms} ms",
            f"{writes:.0f} in {seconds:g} s ({writes / seconds:.2f}/s), "
            f"from {med(r.reports for r in rs):,.0f} reports",
            writes <= seconds + 1 and all(r.last_percent == 100 for r in rs),
            "at most one a second begun, the latest with the outcome",
        )
    _bytes_table(rep, [r for r in every if r.checkpoint_kib], codes)
    rep.add("")


def _bytes_table(rep: Report, rows: list[ORow], codes: list[str]) -> None:
    """What the progress writes of a job holding a checkpoint cost in bytes, per tree."""
    if not rows:
        return
    when = " on the tree before (`before`) and this one (`after`), the same machine"
    rep.add(
        "",
        f"What those writes cost in bytes when the job holds a checkpoint of "
        f"{rows[0].checkpoint_kib} KiB (saved first, by both jobs): the bytes the server "
        "process sent to storage over each job (`write_bytes` of `/proc/<pid>/io`: pages "
        "dirtied in files, so a synced write of a few bytes counts its 4 KiB page), the "
        "reporting job's less the silent one's, per second of the job"
        + ("," + when if "before" in codes else "")
        + ".",
        "",
        "| code | store | progress writes | bytes: silent / reporting | progress bytes/s |",
        "|---|---|---:|---:|---:|",
    )
    for code in codes:
        stores = by_store([r for r in rows if r.code == code])
        for store, rs in stores.items():
            rep.add(
                f"| {code} | {store} | {cell([r.progress_writes for r in rs])} | "
                f"{cell([r.bytes_silent for r in rs])} / {cell([r.bytes_progress for r in rs])} | "
                f"{cell([r.progress_bytes_per_s for r in rs])} |"
            )
