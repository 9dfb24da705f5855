"""Small, dependency-free statistics for benchmark output."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (q in [0, 100])."""
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    s = sorted(x * 1000 for x in seconds)
    return {
        "p50_ms": round(percentile(s, 50), 4),
        "p90_ms": round(percentile(s, 90), 4),
        "p99_ms": round(percentile(s, 99), 4),
        "max_ms": round(s[-1], 4) if s else float("nan"),
    }


def median_minmax(values: Sequence[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def spread(values: Sequence[float]) -> float:
    """(max - min) / median: flags a noisy measurement."""
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else 0.0
