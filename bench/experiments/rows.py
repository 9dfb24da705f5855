"""The rows of ``results/*.jsonl``, typed: what every experiment's report section reads.

The runner writes each run's dict with the fields below; ``load`` reads them
back as these structs (unknown fields are ignored, so older result files still
load). A section that needs a field reads an attribute, never a string key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

import msgspec


class Latency(msgspec.Struct):
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float


class Row(msgspec.Struct, kw_only=True):
    """What the runner adds to every run's result."""

    experiment: str
    store: str
    label: str
    repeat: int = 0
    params: dict[str, Any] = {}
    run_s: float = 0.0
    meta: dict[str, Any] = {}


class CodedRow(Row, kw_only=True):
    """A row of an experiment kept before and after a change (``<name>-before.jsonl``)."""

    code: str = "after"  # which tree: set from the file it was read from


class LoadRow(Row, kw_only=True):
    """One load through a fresh server: submit, run, drain (``sqlq.bench.client.loadgen``)."""

    jobs: int
    acknowledged: int = 0
    done: int = 0
    dead: int = 0
    completion_pct: float = 0.0
    submit_s: float = 0.0
    # The group-commit batches written during the submit phase (submits and the workers'
    # commits alike), and their seconds write to durable summed: the time the engine's one
    # writer was writing (``loadgen._commits``). None in rows made before they were
    # recorded, and without the drain.
    submit_commit_s: float | None = None
    submit_batches: int | None = None
    total_s: float = 0.0
    submit_rate_jobs_s: float = 0.0
    submit_rate_req_s: float = 0.0
    throughput_jobs_s: float = 0.0
    retried: int = 0
    requeued: int = 0
    fenced: int = 0
    submit_latency: Latency | None = None
    queue_to_start_p50_ms: float | None = None
    queue_to_start_p99_ms: float | None = None
    server_cpu_s: float = 0.0
    sync: str = "full"
    workers: int = 0
    store_stats: dict[str, Any] = {}
    config: dict[str, Any] = {}
    ready_s: float = 0.0

    @property
    def durable_syncs(self) -> float:
        """fdatasyncs (walq) or synced commits (sqlite) during the run."""
        st = self.store_stats
        return float(st.get("syncs", st.get("fsyncs", st.get("commits", 0))))

    @property
    def cpu_us_per_job(self) -> float:
        return 1e6 * self.server_cpu_s / self.jobs if self.jobs else float("nan")


R = TypeVar("R", bound=Row)


def load(out: Path, name: str, row: type[R]) -> list[R]:
    path = out / f"{name}.jsonl"
    if not path.exists():
        return []
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    return [msgspec.convert(json.loads(ln), row) for ln in lines]
