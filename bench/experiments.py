"""The experiments of ``sqlq bench``, each a generator of the runs of one repeat.

A run is anything with ``experiment``, ``store``, ``label``, ``params`` and
``execute() -> dict``. Load runs share ``LoadRun``; the crash (E), recovery (G)
and client-ceiling runs have their own procedures. Engines alternate inside
every repeat.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import uvloop

from bench.client.http import HTTPError, HttpPool
from bench.client.loadgen import job_body, run, run_load, wait_drained
from bench.client.server import ServerProcess, free_port

DURABLE = ("walq", "sqlite")


class BenchRun(Protocol):
    @property
    def experiment(self) -> str: ...
    @property
    def store(self) -> str: ...
    @property
    def label(self) -> str: ...
    @property
    def params(self) -> dict[str, Any]: ...

    def execute(self) -> dict[str, Any]: ...


@dataclass(frozen=True, kw_only=True)
class LoadRun:
    experiment: str
    store: str
    label: str
    sync: str = "full"
    workers: int = 16
    jobs: int = 2000
    work_ms: int = 20
    fail_prob: float = 0.0
    hang_prob: float = 0.0
    kind: str = "sleep"
    rounds: int = 500_000
    concurrency: int = 32
    batch: int = 1
    rate: float = 0.0
    flags: tuple[str, ...] = ()
    drain_timeout: float = 120.0
    params: dict[str, Any] = field(default_factory=dict)

    def execute(self) -> dict[str, Any]:
        with ServerProcess.engine(
            store=self.store, sync=self.sync, workers=self.workers, flags=self.flags
        ) as srv:
            result = run(
                srv.url,
                jobs=self.jobs,
                kind=self.kind,
                work_ms=self.work_ms,
                fail_prob=self.fail_prob,
                hang_prob=self.hang_prob,
                rounds=self.rounds,
                concurrency=self.concurrency,
                batch=self.batch,
                rate=self.rate,
                label=self.label,
                drain_timeout=self.drain_timeout,
            )
            result["ready_s"] = round(srv.ready_s, 4)
        result["config"] = {
            "workers": self.workers,
            "sync": self.sync,
            "jobs": self.jobs,
            "work_ms": self.work_ms,
            "kind": self.kind,
            "rounds": self.rounds,
            "concurrency": self.concurrency,
            "batch": self.batch,
            "rate": self.rate,
            "flags": list(self.flags),
        }
        return result


# -- A. worker scaling ----------------------------------------------------------------------------


def exp_a(
    quick: bool, stores: tuple[str, ...], workers: tuple[int, ...] = ()
) -> Iterator[BenchRun]:
    """2,000 x 20 ms jobs at 1..256 workers; efficiency = throughput / ideal."""
    counts = workers or ((16,) if quick else (1, 4, 16, 64, 256))
    jobs = 200 if quick else 2000
    for w in counts:
        # Below 16 workers submission is never the limit, so batch adds nothing there.
        modes = [("single", 32, 1)] + ([("batch", 4, 100)] if w >= 16 else [])
        for mode, conc, batch in modes:
            for store in stores:
                yield LoadRun(
                    experiment="A",
                    store=store,
                    label=f"A/{store}/w{w}/{mode}",
                    workers=w,
                    jobs=jobs,
                    concurrency=conc,
                    batch=batch,
                    params={"submit": mode, "ideal_jobs_s": w * 1000 / 20},
                )


# -- B and C: one feature off, then on -----------------------------------------------------------


def _off_then_on(
    experiment: str, word: str, param: str, off_flag: str, stores: tuple[str, ...],
    *, flags: tuple[str, ...] = (), off_drain: float = 120.0, **load: Any,
) -> Iterator[BenchRun]:  # fmt: skip
    """Each store with the feature off (``off_flag``), then each with it on."""
    for on in (False, True):
        for store in stores:
            yield LoadRun(
                experiment=experiment,
                store=store,
                label=f"{experiment}/{store}/{word}-{'on' if on else 'off'}",
                flags=flags + (() if on else (off_flag,)),
                drain_timeout=120.0 if on else off_drain,
                params={param: on},
                **load,
            )


def exp_b(quick: bool, stores: tuple[str, ...]) -> Iterator[BenchRun]:
    """20% injected failures: retries off (dead-letter at once) vs on (5 attempts)."""
    return _off_then_on(
        "B", "retries", "retries", "--no-retries", stores,
        jobs=200 if quick else 2000, fail_prob=0.2,
    )  # fmt: skip


def exp_c(quick: bool, stores: tuple[str, ...]) -> Iterator[BenchRun]:
    """1% of jobs hang; without the health check the hung workers are lost for good."""
    return _off_then_on(
        "C", "health", "healthcheck", "--no-healthcheck", stores,
        flags=("--seed", "7"), off_drain=2.0 if quick else 20.0,
        jobs=200 if quick else 2000, hang_prob=0.02 if quick else 0.01,
    )  # fmt: skip


# -- D. durability cost ---------------------------------------------------------------------------


def exp_d(quick: bool, stores: tuple[str, ...]) -> Iterator[BenchRun]:
    """Engine x sync x group commit, for 20 ms jobs (single and batch) and no-op jobs."""
    jobs = 200 if quick else 2000
    workloads = [
        ("20ms-single", 20, 32, 1),
        ("20ms-batch", 20, 4, 100),
        ("noop-single", 0, 32, 1),
    ]
    if quick:
        workloads = workloads[:1]
    syncs = ("full",) if quick else ("os", "full")
    for name, work_ms, conc, batch in workloads:
        variants: list[tuple[str, str, bool]] = []
        if "memory" in stores:
            variants.append(("memory", "full", True))
        for sync in syncs:
            for gc in (True, False):
                variants += [(s, sync, gc) for s in stores if s in DURABLE]
        for store, sync, gc in variants:
            yield LoadRun(
                experiment="D",
                store=store,
                label=f"D/{name}/{store}/{sync}/gc-{'on' if gc else 'off'}",
                sync=sync,
                jobs=jobs,
                work_ms=work_ms,
                concurrency=conc,
                batch=batch,
                flags=() if gc else ("--no-group-commit",),
                params={"workload": name, "group_commit": gc},
            )


# -- E. kill -9 recovery --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CrashRun:
    experiment: str
    store: str
    label: str
    jobs: int = 3000
    work_ms: int = 30
    workers: int = 16
    kill_at: float = 0.25
    params: dict[str, Any] = field(default_factory=dict)

    def execute(self) -> dict[str, Any]:
        return uvloop.run(self._go())

    async def _go(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="sqlq-crash-") as d:
            first = ServerProcess.engine(store=self.store, data_dir=d, workers=self.workers).start()
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


def exp_e(quick: bool, stores: tuple[str, ...]) -> Iterator[BenchRun]:
    """3,000 x 30 ms at --sync full, SIGKILL at ~25% done, restart, drain, verify."""
    for store in stores:
        if store in DURABLE:
            yield CrashRun(
                experiment="E",
                store=store,
                label=f"E/{store}",
                jobs=300 if quick else 3000,
                params={"sync": "full"},
            )


# -- F. CPU jobs ----------------------------------------------------------------------------------


def exp_f(quick: bool, stores: tuple[str, ...]) -> Iterator[BenchRun]:
    """200 x 500,000-round SHA-256 chains at 1..16 workers on a 2-core machine.

    Storage does not matter for CPU-bound jobs, so this runs on one engine (the
    default, sqlite). At 16 workers it also runs with heartbeats suppressed while
    a job waits for a free process, which is what a naive design does.
    """
    jobs, rounds = (10, 50_000) if quick else (200, 500_000)
    store = "sqlite" if "sqlite" in stores else stores[0]
    counts = (1, 4) if quick else (1, 2, 4, 16)
    variants = [(w, True) for w in counts] + [(counts[-1], False)]
    for w, beat in variants:
        yield LoadRun(
            experiment="F",
            store=store,
            label=f"F/{store}/w{w}" + ("" if beat else "/naive"),
            workers=w,
            jobs=jobs,
            kind="cpu",
            rounds=rounds,
            concurrency=4,
            batch=50,
            drain_timeout=600,
            flags=() if beat else ("--no-cpu-beat-while-queued",),
            params={"beat_while_queued": beat},
        )


# -- G. recovery time vs log size, and compaction -------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RecoveryRun:
    experiment: str
    store: str
    label: str
    transitions: int
    params: dict[str, Any] = field(default_factory=dict)

    def execute(self) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="sqlq-recovery-") as d:
            t0 = time.perf_counter()
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.fill",
                    "--store",
                    self.store,
                    "--data",
                    d,
                    "--transitions",
                    str(self.transitions),
                ],
                check=True,
            )
            build_s = time.perf_counter() - t0
            size = sum(
                os.path.getsize(os.path.join(root, f))
                for root, _, files in os.walk(d)
                for f in files
            )
            srv = ServerProcess.engine(store=self.store, data_dir=d, workers=16)
            t1 = time.perf_counter()
            srv.start()
            ready_s = time.perf_counter() - t1
            try:
                import json
                import urllib.request

                with urllib.request.urlopen(srv.url + "/stats") as r:
                    stats = json.loads(r.read())
            finally:
                srv.cleanup()
        return {
            "label": self.label,
            "store": self.store,
            "transitions": self.transitions,
            "data_bytes": size,
            "build_s": round(build_s, 3),
            "ready_s": round(ready_s, 4),
            "recovery": stats["recovery"],
        }


@dataclass(frozen=True, kw_only=True)
class CompactionRun:
    """A long walq run with a small compaction floor, sampling the log size."""

    experiment: str
    store: str
    label: str
    jobs: int
    params: dict[str, Any] = field(default_factory=dict)

    def execute(self) -> dict[str, Any]:
        flags = ("--compact-floor-mb", "1", "--retention", "1", "--workers", "64")
        with ServerProcess.engine(store="walq", flags=flags) as srv:
            return uvloop.run(self._go(srv.url))

    async def _go(self, url: str) -> dict[str, Any]:
        samples: list[tuple[float, int]] = []
        t0 = time.perf_counter()
        done = asyncio.Event()

        async def sampler() -> None:
            async with HttpPool(url, 1) as control:
                while not done.is_set():
                    _, stats = await control.json("GET", "/stats")
                    st = stats["store"]
                    samples.append((round(time.perf_counter() - t0, 3), st["log_bytes"]))
                    await asyncio.sleep(0.05)

        task = asyncio.create_task(sampler())
        result = await run_load(
            url,
            jobs=self.jobs,
            concurrency=32,
            body=job_body(0, 0, 0, "sleep", 0),
            label=self.label,
            fetch_jobs=False,
        )
        done.set()
        await task
        st = result.pop("store_stats")
        return {
            **result,
            "log_samples": samples,
            "max_log_bytes": max(b for _, b in samples),
            "final_log_bytes": st["log_bytes"],
            "compactions": st["compactions"],
            "max_compaction_stall_ms": st["max_compaction_stall_ms"],
        }


def exp_g(quick: bool, stores: tuple[str, ...]) -> Iterator[BenchRun]:
    """Time to ready vs log size (10k..1M transitions); walq's log over a long run."""
    sizes = (3_000, 30_000) if quick else (10_000, 100_000, 1_000_000)
    for n in sizes:
        for store in stores:
            if store in DURABLE:
                yield RecoveryRun(
                    experiment="G",
                    store=store,
                    label=f"G/{store}/{n}",
                    transitions=n,
                    params={"part": "recovery"},
                )
    if "walq" in stores:
        yield CompactionRun(
            experiment="G",
            store="walq",
            label="G/walq/compaction",
            jobs=3_000 if quick else 40_000,
            params={"part": "compaction"},
        )


# -- H. latency under steady load -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class LatencyRun:
    """Measure the closed-loop peak, then open-loop arrivals at fractions of it."""

    experiment: str
    store: str
    label: str
    fractions: tuple[float, ...]
    seconds: float
    peak_jobs: int = 3000
    params: dict[str, Any] = field(default_factory=dict)

    def execute(self) -> dict[str, Any]:
        body = job_body(0, 0, 0, "sleep", 0)
        flags = ("--workers", "64")
        with ServerProcess.engine(store=self.store, flags=flags) as srv:
            peak = uvloop.run(
                run_load(srv.url, jobs=self.peak_jobs, concurrency=32, body=body, fetch_jobs=False)
            )
        peak_rate = peak["throughput_jobs_s"]
        points = []
        for frac in self.fractions:
            rate = peak_rate * frac
            with ServerProcess.engine(store=self.store, flags=flags) as srv:
                r = uvloop.run(
                    run_load(
                        srv.url,
                        jobs=max(200, int(rate * self.seconds)),
                        rate=rate,
                        concurrency=32,
                        body=body,
                    )
                )
            r.pop("store_stats")
            points.append({"fraction": frac, "rate": round(rate, 1), **r})
        return {
            "label": self.label,
            "store": self.store,
            "peak_jobs_s": peak_rate,
            "points": points,
        }


def exp_h(quick: bool, stores: tuple[str, ...]) -> Iterator[BenchRun]:
    """Open-loop no-op arrivals at 25/50/75/90% of each engine's measured peak."""
    for store in stores:
        yield LatencyRun(
            experiment="H",
            store=store,
            label=f"H/{store}",
            fractions=(0.5,) if quick else (0.25, 0.5, 0.75, 0.9),
            seconds=0.5 if quick else 3.0,
            peak_jobs=500 if quick else 3000,
        )


# -- I. emulated disk latency ---------------------------------------------------------------------


def exp_i(quick: bool, stores: tuple[str, ...]) -> Iterator[BenchRun]:
    """The D run (20 ms jobs, single submit) with 0, 1, 5 ms of EMULATED sync delay."""
    jobs = 200 if quick else 2000
    for delay in (1,) if quick else (0, 1, 5):
        for gc in (True, False):
            for store in stores:
                if store in DURABLE:
                    yield LoadRun(
                        experiment="I",
                        store=store,
                        label=f"I/{store}/emulated-{delay}ms/gc-{'on' if gc else 'off'}",
                        jobs=jobs,
                        drain_timeout=300,
                        flags=("--emulate-sync-delay-ms", str(delay))
                        + (() if gc else ("--no-group-commit",)),
                        params={"emulated_sync_delay_ms": delay, "group_commit": gc},
                    )


# -- the client's ceiling -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CeilingRun:
    experiment: str = "ceiling"
    store: str = "trivial"
    label: str = "ceiling/trivial-endpoint"
    requests: int = 20_000
    params: dict[str, Any] = field(default_factory=dict)

    def execute(self) -> dict[str, Any]:
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "bench.trivial", str(port)])
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.perf_counter() + 30
            while time.perf_counter() < deadline:
                try:
                    import urllib.request

                    urllib.request.urlopen(urllib.request.Request(url + "/jobs", b"{}"), timeout=1)
                    break
                except OSError:
                    time.sleep(0.02)
            r = uvloop.run(
                run_load(
                    url,
                    jobs=self.requests,
                    concurrency=32,
                    body=job_body(20, 0, 0, "sleep", 0),
                    drain=False,
                )
            )
        finally:
            proc.terminate()
            proc.wait()
        return {
            "label": self.label,
            "store": "trivial",
            "requests": self.requests,
            "ceiling_req_s": r["submit_rate_req_s"],
            "submit_latency": r["submit_latency"],
        }


def exp_ceiling(quick: bool, stores: tuple[str, ...]) -> Iterator[BenchRun]:
    """The load generator against a trivial endpoint on the same stack."""
    yield CeilingRun(requests=2_000 if quick else 20_000)


EXPERIMENTS = {
    "ceiling": exp_ceiling,
    "A": exp_a,
    "B": exp_b,
    "C": exp_c,
    "D": exp_d,
    "E": exp_e,
    "F": exp_f,
    "G": exp_g,
    "H": exp_h,
    "I": exp_i,
}
ORDER = tuple(EXPERIMENTS)  # the suite runs them in this order; the report shows them so
