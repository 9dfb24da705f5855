"""What the dashboard knows of the recent past: one sample a second, kept for minutes.

The service keeps only cumulative figures (event totals since start, histogram
buckets since start). Rates and "the last minute's percentiles" are differences
between two samples, so the sampler costs one read of a few counters a second
whether or not anyone looks, and the dashboard can show the last minutes the
moment it is opened. Pure: samples carry their own time; no clock, no I/O.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

# The series the overview's rate chart draws, in the order of ``Sample.counts``.
SERIES = ("submitted", "completed", "failed", "dead")


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # seconds (monotonic)
    counts: tuple[int, ...]  # cumulative, in SERIES order
    wait: tuple[float, ...]  # cumulative bucket counts of the queue-wait histogram
    run: tuple[float, ...]  # the same for run time
    commit: tuple[float, ...] = ()  # the same for a group-commit batch's write to durable


@dataclass(frozen=True, slots=True)
class Percentiles:
    count: int  # attempts in the window
    p50: float | None  # seconds; None when the window saw nothing
    p90: float | None
    p99: float | None


def quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float | None:
    """The ``q`` quantile of a histogram, as Prometheus's ``histogram_quantile`` estimates it.

    ``bounds`` are the buckets' upper edges (the last may be +Inf) and ``counts``
    the observations per bucket (not cumulative). Within a bucket, observations
    are taken as spread evenly; past the last finite edge the answer is that edge.
    """
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0.0
    lower = 0.0
    for upper, n in zip(bounds, counts, strict=True):
        if n > 0 and seen + n >= rank:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - seen) / n
        seen += n
        if not math.isinf(upper):
            lower = upper
    return lower


class History:
    """The last ``keep`` samples; the oldest falls off as a new one comes."""

    def __init__(self, bounds: Sequence[float], keep: int = 300) -> None:
        self.bounds = tuple(bounds)  # the histograms' upper edges, +Inf last
        self._samples: deque[Sample] = deque(maxlen=keep)

    def __len__(self) -> int:
        return len(self._samples)

    def age(self) -> float:
        """Seconds from the oldest sample kept to the latest."""
        return self._samples[-1].at - self._samples[0].at if self._samples else 0.0

    def add(self, sample: Sample) -> None:
        if self._samples and sample.at <= self._samples[-1].at:
            return  # a clock that did not move: nothing to difference against
        self._samples.append(sample)

    def rates(self) -> dict[str, list[tuple[float, float]]]:
        """Per second, for each series: (seconds before the latest sample, rate)."""
        out: dict[str, list[tuple[float, float]]] = {name: [] for name in SERIES}
        samples = self._samples
        if len(samples) < 2:
            return out
        latest = samples[-1].at
        prev = samples[0]
        for cur in list(samples)[1:]:
            dt = cur.at - prev.at
            for i, name in enumerate(SERIES):
                out[name].append((latest - cur.at, max(0, cur.counts[i] - prev.counts[i]) / dt))
            prev = cur
        return out

    def latest_rates(self, window_s: float = 10.0) -> dict[str, float]:
        """Each series' mean rate over about the last ``window_s`` seconds."""
        first, last = self._window(window_s)
        if first is None or last is None:
            return {name: 0.0 for name in SERIES}
        dt = last.at - first.at
        return {
            name: max(0, last.counts[i] - first.counts[i]) / dt for i, name in enumerate(SERIES)
        }

    def percentiles(self, which: str, window_s: float = 60.0) -> Percentiles:
        """``"wait"`` (queue wait), ``"run"`` or ``"commit"`` over about the last ``window_s``."""
        first, last = self._window(window_s)
        if first is None or last is None:
            return Percentiles(0, None, None, None)
        now, then = getattr(last, which), getattr(first, which)
        per_bucket: list[float] = []
        below_now = below_then = 0.0
        for cum_now, cum_then in zip(now, then, strict=True):
            per_bucket.append(max(0.0, (cum_now - below_now) - (cum_then - below_then)))
            below_now, below_then = cum_now, cum_then
        return Percentiles(
            count=round(sum(per_bucket)),
            p50=quantile(0.5, self.bounds, per_bucket),
            p90=quantile(0.9, self.bounds, per_bucket),
            p99=quantile(0.99, self.bounds, per_bucket),
        )

    def _window(self, window_s: float) -> tuple[Sample | None, Sample | None]:
        """The oldest sample at most ``window_s`` before the latest, and the latest."""
        if len(self._samples) < 2:
            return None, None
        last = self._samples[-1]
        first = next(s for s in self._samples if last.at - s.at <= window_s)
        if first is last:
            first = self._samples[-2]
        return first, last
