"""``/metrics``: the service's figures in Prometheus text format, through prometheus-client.

The events (``sqlq_jobs_total``) are counted by ``Events``, the one sink that
feeds ``/stats`` too (its docstring says which events show here, under which
names, and how the number of series is bounded); they are turned into a metric
family only when Prometheus scrapes (``Collector.collect``). The durations are
``Buckets``: a list of counts and a sum, one ``bisect`` an observation, turned into
a histogram family at the scrape too (two of them are observed once a job: a
prometheus-client ``Histogram``'s locks and per-bucket objects cost several thousand
instructions a job, measured). Every ``Service`` has its own registry, so two services
in one process (the tests) never share a metric.

    sqlq_jobs_total{event, kind, queue}   submitted, completed, retried, dead, fenced,
                                          requeued (hung, at recovery, expired lease)
    sqlq_jobs_live{state, queue}          scheduled, running and waiting jobs now
    sqlq_queue_wait_seconds               ready to started, per attempt
    sqlq_run_seconds                      started to outcome, per attempt
    sqlq_store_commit_seconds             one group-commit batch, write to durable
    sqlq_store_batch_size                 commit calls per batch
    sqlq_workers{status}                  busy, live, hung (declared), replaced
    sqlq_remote_total{what}               remote workers' claims, jobs claimed, heartbeats,
                                          leases renewed, outcomes by what they said
                                          (complete, fail, snooze, checkpoint, release),
                                          fenced, invalid, forbidden, leases expired
    sqlq_remote_workers{status}           remote workers seen (remembered), active (1 min)
    sqlq_remote_claims_waiting            claims long-polling now
    sqlq_fair_keys{queue}                 keys a fair queue holds (``sqlq.common.fair``)
    sqlq_fair_key_jobs{queue,key,state}   due and running jobs of the 100 keys with the
                                          most (the rest of a queue's as key="")
    sqlq_fair_key_wait_seconds{queue,key} how long each of those keys' next job has waited
    sqlq_recovery_seconds, sqlq_recovery_records
    sqlq_schedule_ticks_enqueued_total{schedule}   ticks that made their job
    sqlq_schedule_ticks_skipped_total{schedule}    ticks passed over (catch-up, overlap,
                                                   paused): a silent drop made visible
    sqlq_schedule_lateness_seconds        from a tick to its job's durable enqueue
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from sqlq.runtime.events import Events

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                   10, 30, 60, 300)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 8192)
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600)


class Buckets(Collector):
    """A histogram kept as plain counts: ``observe`` is one ``bisect`` and two additions
    (the hot path observes two a job), and Prometheus's cumulative buckets, ``_count`` and
    ``_sum`` are made only when it scrapes. Buckets are ``le`` (upper bound included)."""

    def __init__(
        self, name: str, doc: str, bounds: Sequence[float], registry: CollectorRegistry
    ) -> None:
        self.name, self.doc = name, doc
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: past every bound (+Inf)
        self.sum = 0.0
        registry.register(self)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> tuple[float, ...]:
        """The cumulative count at each bound, then +Inf (the dashboard's figures)."""
        total, out = 0, []
        for n in self.counts:
            total += n
            out.append(float(total))
        return tuple(out)

    def describe(self) -> list[Metric]:
        return []  # made at scrape time

    def collect(self) -> Iterator[Metric]:
        les = [*(floatToGoString(b) for b in self.bounds), "+Inf"]  # type: ignore[no-untyped-call]
        yield HistogramMetricFamily(
            self.name, self.doc, buckets=list(zip(les, self.cumulative(), strict=True)),
            sum_value=self.sum,
        )  # fmt: skip


class Metrics:
    def __init__(self, events: Events | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.events = events or Events()
        reg = self.registry
        self.queue_wait = Buckets(
            "sqlq_queue_wait_seconds",
            "From ready (due) to started, per attempt.",
            LATENCY_BUCKETS,
            reg,
        )
        self.run = Buckets(
            "sqlq_run_seconds", "From started to its outcome, per attempt.", LATENCY_BUCKETS, reg
        )
        self.commit = Buckets(
            "sqlq_store_commit_seconds",
            "One group-commit batch, from its write to durable.",
            LATENCY_BUCKETS,
            reg,
        )
        self.batch = Buckets(
            "sqlq_store_batch_size",
            "Commit calls written together in one batch.",
            BATCH_BUCKETS,
            reg,
        )
        self.lateness = Buckets("sqlq_schedule_lateness_seconds",
                                "From a schedule's tick to its job's durable enqueue.",
                                LATENESS_BUCKETS, reg)  # fmt: skip
        self.events.on_lateness = self.lateness.observe

    def batch_written(self, calls: int, seconds: float) -> None:
        """A store's batch observer (see ``GroupCommitter``)."""
        self.batch.observe(calls)
        self.commit.observe(seconds)

    def gauges(self, source: Callable[[], Iterator[Metric]]) -> None:
        """Register figures read at scrape time: live jobs, workers, recovery."""
        self.registry.register(_Scrape(self, source))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _Scrape(Collector):
    def __init__(self, metrics: Metrics, source: Callable[[], Iterator[Metric]]) -> None:
        self._metrics = metrics
        self._source = source

    def describe(self) -> list[Any]:
        return []  # collected at scrape time; nothing to describe up front

    def collect(self) -> Iterator[Metric]:
        events = CounterMetricFamily(
            "sqlq_jobs", "Job events since this process started.", labels=["event", "kind", "queue"]
        )
        for event, kind, queue, n in self._metrics.events.series():
            events.add_metric([event, kind, queue], n)
        yield events
        ticks = self._metrics.events.ticks
        for i, what in enumerate(("enqueued", "skipped")):
            family = CounterMetricFamily(
                f"sqlq_schedule_ticks_{what}", f"Schedule ticks {what} since this process "
                "started.", labels=["schedule"],
            )  # fmt: skip
            for name in sorted(ticks):
                family.add_metric([name], ticks[name][i])
            yield family
        yield from self._source()


def gauge(name: str, doc: str, labels: list[str], values: dict[tuple[str, ...], float]) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(list(key), value)
    return family
