"""What a ``Service`` reports about itself: the ``/stats`` body and ``/metrics``' gauges.

Reads only figures the service keeps anyway (the events' totals, the claims'
counts, the pool's and the store's stats): nothing walks the live jobs, and
nothing here does I/O, so a scrape or a dashboard refresh costs the queue next
to nothing. The keys of ``/stats`` are an interface (the dashboard and clients
read them); the event totals behind them are named once, in ``Event``.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, Metric

from sqlq.common.clock import Clock
from sqlq.common.models import TERMINAL
from sqlq.common.store import JobStore, Recovery
from sqlq.runtime.claims import ClaimsView
from sqlq.runtime.config import RuntimeConfig, RuntimeState
from sqlq.runtime.events import Event, Events
from sqlq.runtime.executor import Executor
from sqlq.runtime.metrics import gauge
from sqlq.runtime.remote import COUNTED, Remote
from sqlq.runtime.workers import WorkerPool


class ReportSource(Protocol):
    """What a report reads of a service (``Service`` is one): its parts, read-only, so
    this module needs nothing of the service but these."""

    @property
    def state(self) -> RuntimeState: ...
    @property
    def store(self) -> JobStore: ...
    @property
    def config(self) -> RuntimeConfig: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def events(self) -> Events: ...
    @property
    def view(self) -> ClaimsView: ...
    @property
    def executor(self) -> Executor: ...
    @property
    def pool(self) -> WorkerPool: ...
    @property
    def remote(self) -> Remote: ...
    @property
    def recovery(self) -> Recovery | None: ...

    def abandoned(self) -> int: ...

    def queues_used(self) -> int: ...


# /stats key -> the event total it reports
TOTALS = {
    "submitted": Event.SUBMITTED,
    "retried": Event.RETRIED,
    "requeued_hung": Event.REQUEUED_HUNG,
    "requeued_at_recovery": Event.REQUEUED_AT_RECOVERY,
    "dead_at_recovery": Event.DEAD_AT_RECOVERY,  # interrupted on their last attempt
    "fenced": Event.FENCED,
    "lease_lost": Event.LEASE_LOST,  # attempts this node cut off: its lease ran out unrenewed
    "claim_failed": Event.CLAIM_FAILED,
    "unencodable_results": Event.UNENCODABLE,
    "spawns_refused": Event.SPAWN_REFUSED,
    "refused_queue_full": Event.REFUSED_FULL,
    "cancel_requested": Event.CANCEL_REQUESTED,
    "cancelled_running": Event.CANCELLED_RUNNING,
    "snoozed": Event.SNOOZED,
}


def stats(rt: ReportSource) -> dict[str, Any]:
    totals = rt.events.totals
    jobs: dict[str, int] = rt.view.live_counts()  # (shared mode: on every node)
    jobs.update({s.value: totals[Event(s.value)] for s in TERMINAL})
    threads = rt.executor.threads
    return {
        "state": rt.state.value,
        "durable": rt.store.durable,
        "jobs": jobs,
        "terminal_counts_are": "since this process started",
        **{key: totals[event] for key, event in TOTALS.items()},
        "max_queued": rt.config.max_queued,
        "max_queues": rt.config.max_queues,
        "queues_used": rt.queues_used(),
        "workers": {
            **rt.pool.stats(),
            "handler_threads": threads.size,
            "abandoned_threads_running": threads.abandoned,
            "abandoned_threads_total": threads.abandoned_total,
            "max_abandoned": rt.config.max_abandoned,
        },
        **rt.view.stats(),
        "remote": rt.remote.stats(),
        "store": rt.store.stats().to_dict(),
        "recovery": rt.recovery.summary() if rt.recovery else None,
        "process_cpu_s": round(time.process_time(), 3),
    }


def gauges(rt: ReportSource) -> Iterator[Metric]:
    """What /metrics reads at scrape time: live jobs, workers (remote ones too: their calls
    by what they were, a fixed set of labels), recovery."""
    yield gauge(
        "sqlq_jobs_live", "Scheduled and running jobs (in shared mode, on every node).",
        ["state", "queue"], {k: float(n) for k, n in rt.view.census().items()},
    )  # fmt: skip
    pool = rt.pool
    yield gauge(
        "sqlq_workers", "Workers: busy, live, hung (declared), replaced, abandoned.",
        ["status"],
        {("busy",): pool.busy(), ("live",): len(pool.live), ("hung",): pool.declared_hung,
         ("replaced",): pool.replaced, ("abandoned",): rt.abandoned()},
    )  # fmt: skip
    remote, now = rt.remote, rt.clock.time()
    yield gauge(
        "sqlq_remote_workers", "Remote workers remembered (seen, at most 1,000) and heard of in "
        "the last minute (active).", ["status"],
        {("seen",): float(len(remote.seen)), ("active",): float(remote.seen.active(now))},
    )  # fmt: skip
    yield gauge("sqlq_remote_claims_waiting", "Remote workers' claims long-polling now.", [],
                {(): float(remote.waiting())})  # fmt: skip
    calls = CounterMetricFamily(
        "sqlq_remote", "Remote workers' claims, jobs claimed, heartbeats, leases renewed, "
        "outcomes by what they said, and those fenced, invalid, forbidden; leases expired.",
        labels=["what"],
    )  # fmt: skip
    for what in COUNTED:
        calls.add_metric([what], remote.counts[what])
    yield calls
    yield from fair_gauges(rt.view.key_stats())
    rec = rt.recovery
    yield gauge("sqlq_recovery_seconds", "How long this start's recovery took.", [],
                {(): rec.seconds if rec else 0.0})  # fmt: skip
    yield gauge("sqlq_recovery_records", "Records (walq lines, SQLite rows) recovery read.",
                [], {(): float(rec.records) if rec else 0.0})  # fmt: skip


TOP_KEYS = 100  # (queue, key) series at most: the keys with the most jobs; the rest as ""
NO_KEY = "*"  # the label of jobs with no key: no key has a "*" (``fair.FAIR_KEY_PATTERN``)


def fair_gauges(stats: Mapping[str, list[tuple[str | None, int, int, float]]]) -> Iterator[Metric]:
    """The fair queues' keys (``sqlq.common.fair``), with their label's cardinality bounded
    whatever keys clients send: the ``TOP_KEYS`` keys with the most jobs (due and running)
    by name, and each queue's others summed under ``key=""`` (no key is empty: a key has a
    character at least), their wait the longest of theirs."""
    ranked = heapq.nlargest(
        TOP_KEYS,
        ((queue, key, due, running, wait) for queue, rows in stats.items()
         for key, due, running, wait in rows),
        key=lambda r: (r[2] + r[3], r[4]),
    )  # fmt: skip
    top = {(r[0], r[1]) for r in ranked}
    jobs: dict[tuple[str, ...], float] = {}
    waits: dict[tuple[str, ...], float] = {}
    held: dict[tuple[str, ...], float] = {}
    for queue, rows in stats.items():
        held[(queue,)] = float(len(rows))
        for key, due, running, wait in rows:
            label = (NO_KEY if key is None else key) if (queue, key) in top else ""
            for state, n in (("due", due), ("running", running)):
                jobs[(queue, label, state)] = jobs.get((queue, label, state), 0.0) + n
            waits[(queue, label)] = max(waits.get((queue, label), 0.0), wait)
    yield gauge("sqlq_fair_keys", "Keys a fair queue holds (jobs due or running).", ["queue"],
                held)  # fmt: skip
    yield gauge(
        "sqlq_fair_key_jobs", f"A fair queue's jobs by key: the {TOP_KEYS} keys with the most "
        'by name (jobs with no key as "*"), the rest summed as "".', ["queue", "key", "state"],
        jobs,
    )  # fmt: skip
    yield gauge(
        "sqlq_fair_key_wait_seconds", "How long each key's next job has been due (the rest: "
        'the longest of theirs, as "").', ["queue", "key"], waits,
    )  # fmt: skip
