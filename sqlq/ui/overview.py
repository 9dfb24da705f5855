"""What the overview shows, read from a running ``Service``, and the sampler behind its chart.

Everything here is a read of figures the service keeps anyway (``stats()``,
the queues, the metrics' histograms): no store call (in shared mode the queues
are the census the claimer takes every second, not a count of their own),
nothing that walks the live jobs, so a dashboard refreshing every second costs
the queue next to nothing, however many tabs are open.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from sqlq.common.clock import Clock
from sqlq.common.store import CompactionReport
from sqlq.runtime.events import Event
from sqlq.runtime.metrics import LATENCY_BUCKETS
from sqlq.runtime.service import Service
from sqlq.ui.charts import line_chart
from sqlq.ui.history import SERIES, History, Percentiles, Sample

SAMPLE_EVERY_S = 1.0
KEEP_SAMPLES = 300  # five minutes at one a second
CHART_SPAN_S = 300.0  # at most; a younger process draws what it has (at least a minute)
MIN_SPAN_S = 60.0
BOUNDS = (*LATENCY_BUCKETS, float("inf"))


def sample(runtime: Service, at: float) -> Sample:
    totals = runtime.events.totals
    dead = totals[Event.DEAD]
    metrics = runtime.metrics
    return Sample(
        at=at,
        counts=(
            totals[Event.SUBMITTED],
            totals[Event.COMPLETED],
            totals[Event.RETRIED] + dead,
            dead,
        ),
        wait=metrics.queue_wait.cumulative(),
        run=metrics.run.cumulative(),
        commit=metrics.commit.cumulative(),
    )


class Sampler:
    """One sample a second into ``history``, from the app's start to its stop."""

    def __init__(self, runtime: Service, clock: Clock) -> None:
        self.runtime = runtime
        self.clock = clock
        self.history = History(BOUNDS, keep=KEEP_SAMPLES)
        self._task: asyncio.Task[None] | None = None

    def take(self) -> None:
        self.history.add(sample(self.runtime, self.clock.monotonic()))

    def start(self) -> None:
        self.take()
        self._task = asyncio.create_task(self._run(), name="sqlq-ui-sampler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await self.clock.sleep(SAMPLE_EVERY_S)
            self.take()


def _ms(p: Percentiles) -> dict[str, Any]:
    def f(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.3g}"

    return {"count": p.count, "p50": f(p.p50), "p90": f(p.p90), "p99": f(p.p99)}


def overview(runtime: Service, history: History) -> dict[str, Any]:
    """The overview page's figures, ready for the template."""
    stats = runtime.stats()
    queues = runtime.view.queues_now()
    rates = history.latest_rates()
    store = runtime.store.stats()  # the typed fields: every engine fills them alike
    compaction = store.last_compaction
    return {
        "stats": stats,
        "jobs": stats["jobs"],
        "queues": queues,
        "rates": rates,
        "series": SERIES,
        "chart": line_chart(
            history.rates(),
            span_s=min(CHART_SPAN_S, max(MIN_SPAN_S, history.age())),
            unit="jobs/s",
            label="Jobs per second lately; now: "
            + ", ".join(f"{name} {rates[name]:.1f}" for name in SERIES),
        ),
        "wait": _ms(history.percentiles("wait")),
        "run": _ms(history.percentiles("run")),
        "commit": _ms(history.percentiles("commit")),
        "workers": stats["workers"],
        "store": stats["store"],
        "disk_bytes": store.disk_bytes,
        "compaction": None if compaction is None else _report(*compaction),
        "recovery": stats["recovery"],
        "shared": stats.get("shared"),
    }


def _report(at: float, report: CompactionReport) -> dict[str, Any]:
    return {
        "at": at,
        "jobs_pruned": report.jobs_pruned,
        "bytes_before": report.bytes_before,
        "bytes_after": report.bytes_after,
        "seconds": report.seconds,
    }
