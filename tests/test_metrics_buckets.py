"""``Buckets``, the hot path's histogram, exposes what prometheus-client's ``Histogram``
would for the same observations: the same buckets (upper bounds included), count and sum."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from sqlq.runtime.metrics import LATENCY_BUCKETS, Buckets

SEEN = [0.0, 0.0005, 0.0007, 0.001, 1.0, 4.99, 5.0, 299.0, 400.0, -1.0]


def _samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    return {
        (s.name, s.labels.get("le", "")): s.value
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_buckets_expose_what_a_prometheus_histogram_would() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    mine = Buckets("sqlq_x_seconds", "x", LATENCY_BUCKETS, ours)
    reference = Histogram("sqlq_x_seconds", "x", buckets=LATENCY_BUCKETS, registry=theirs)
    for value in SEEN:
        mine.observe(value)
        reference.observe(value)
    assert _samples(ours) == _samples(theirs)
    assert mine.cumulative()[-1] == len(SEEN)
