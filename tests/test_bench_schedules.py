"""Experiment N's arithmetic and report, on synthetic rows: no server, no clock.

The run itself needs minutes of wall time (a window of whole minutes), so it is
left to ``sqlq bench --only N``; what can be wrong without one is checked here:
which ticks count, lost and doubled, the percentiles, and that the section's
cells and prose come from the rows.
"""

from __future__ import annotations

from pathlib import Path

from sqlq.bench.experiments import EXPERIMENTS, n_schedules
from sqlq.bench.experiments.n_runs import tally, tick_of, window
from tests.helpers import section_of


def test_window_starts_on_the_first_boundary_at_or_after() -> None:
    assert window(60, 2, 1_700_000_001.5) == [1_700_000_040, 1_700_000_100]
    assert window(60, 1, 1_700_000_040.0) == [1_700_000_040]
    assert window(1, 3, 10.2) == [11, 12, 13]


def test_tally_counts_lost_doubled_and_only_the_window() -> None:
    ticks = [120, 180]
    seen = [
        ("a", 120, 120.010), ("a", 180, 180.030), ("a", 180, 180.500),  # a double
        ("b", 120, 120.020),  # b's 180 is lost
        ("a", 60, 61.0), ("c", 120, 500.0),  # another tick, a name not due: not counted
    ]  # fmt: skip
    t = tally(["a", "b"], ticks, seen)
    assert (t["ticks"], t["jobs"], t["lost"], t["doubled"]) == (4, 3, 1, 1)
    # lateness of every job counted, doubles included: 10, 20, 30, 500 ms (nearest rank)
    assert t["late_p50_ms"] == 20.0
    assert t["late_p99_ms"] == t["late_max_ms"] == 500.0


def test_tally_without_jobs_has_no_lateness() -> None:
    t = tally(["a"], [60], [])
    assert (t["lost"], t["late_p50_ms"], t["late_max_ms"]) == (1, None, None)


def test_tick_of_reads_the_fields_then_the_key() -> None:
    assert tick_of({"schedule": "n1", "tick": 120}) == ("n1", 120)
    assert tick_of({"idempotency_key": "sched:n.2-x:1700000040"}) == ("n.2-x", 1_700_000_040)
    assert tick_of({"idempotency_key": "mine"}) is None
    assert tick_of({"idempotency_key": None}) is None


def _row(system: str, repeat: int, p99: float, cpu_s: float, **extra: object) -> dict[str, object]:
    return {"experiment": "N", "store": system, "label": f"N/{system}", "repeat": repeat,
            "meta": {"git_commit": "abc1234"}, "system": system, "schedules": 1000,
            "period_s": 60, "window_s": 120.0, "ticks": 2000, "jobs": 2000, "lost": 0,
            "doubled": 0, "late_p50_ms": p99 / 2, "late_p99_ms": p99, "late_max_ms": p99 + 1,
            "cpu_s": cpu_s, **extra}  # fmt: skip


def test_section_builds_from_the_rows(tmp_path: Path) -> None:
    assert EXPERIMENTS["N"] is n_schedules
    rows = [
        _row("sqlq-walq", 0, 4.0, 0.2, idle_s=60.0, idle_cpu_s=0.01),
        _row("sqlq-walq", 1, 6.0, 0.4, idle_s=60.0, idle_cpu_s=0.03),
        _row(
            "procrastinate",
            0,
            900.0,
            1.0,
            pg_cpu_s=0.5,
            version="3.10.0",
            lost=3,
            doubled=1,
            pg_version="15.18",
        ),
    ]
    rep = section_of(tmp_path, n_schedules, rows)
    text = "\n".join(rep.lines)
    assert "## N. Schedules" in text
    assert "1,000 schedules" in text
    assert "2 ticks (120 s)" in text
    assert "(PostgreSQL 15.18, a throwaway cluster, fsync on)" in text
    assert "with no job 5 s after it" in text
    # walq: p99 median 5.0 [4.0-6.0]; CPU 0.3 s over 120 s = 0.150 s/min [0.100-0.200];
    # 0.3 s / 2,000 ticks = 0.150 ms/tick; idle 0.02 s/min
    walq = next(ln for ln in rep.lines if ln.startswith("| sqlq-walq"))
    assert "| abc1234 |" in walq
    assert "5.0 [4.0-6.0]" in walq
    assert "0.150 [0.100-0.200]" in walq
    assert "0.020 [0.010-0.030]" in walq
    peer = next(ln for ln in rep.lines if ln.startswith("| procrastinate"))
    assert "| 3.10.0 |" in peer
    assert "| 3 | 1 |" in peer
    assert "| 0.250 |" in peer
    assert "- sqlq-walq: lateness p99 5.0 ms; 0.150 s of CPU a minute (0.25 % of a core), " \
        "0.130 s above the same server with them paused; against procrastinate's worker: " \
        "p99 0.0056x, CPU 0.3x." in rep.lines  # fmt: skip
    # the bar is sqlq's own: the peer's lost and doubled ticks are shown, not judged
    assert rep.checks == ["N: sqlq-walq, ticks lost and doubled: 0 lost, 0 doubled of 4,000 "
                          "due (none: met)"]  # fmt: skip
