"""Experiment S (#37): its arithmetic (the sliding windows, Jain's index), its section, and
a quick run on the durable engines against real servers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sqlq.bench.experiments import EXPERIMENTS, s_fair
from sqlq.cli import main
from tests.helpers import section_of


def test_windows_count_the_most_and_the_fewest_starts() -> None:
    starts = [i * 0.1 for i in range(101)]  # 10/s for 10 s, one at 0 and one at 10
    most, fewest = s_fair._windows(starts, 1.0, 10.0)
    assert most == 11  # a closed window of 1 s holds 11 starts 0.1 s apart
    assert fewest == 10
    bursty = [0.0] * 20 + [5.0]
    assert s_fair._windows(bursty, 1.0, 5.0) == (20, 0)


def test_jains_index_is_one_for_an_even_share_and_one_over_n_for_one_key() -> None:
    assert s_fair.jain([5.0, 5.0, 5.0]) == 1.0
    assert s_fair.jain([9.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert s_fair.jain([0.0, 0.0]) == 1.0


def _row(store: str, repeat: int) -> dict[str, object]:
    return {"experiment": "S", "store": store, "label": f"S/{store}", "repeat": repeat,
            "rate": 50.0, "rate_s": 20, "most_1s": 51, "fewest_1s": 49, "most_10s": 501,
            "fewest_10s": 499, "flood": 100000, "fair_wait_s": 0.01, "fair_before": 2,
            "fifo_wait_s": 7.5, "fifo_before": 100000, "jain": [0.99, 1.0],
            "cost_jobs": 100, "cost_cpu_us": {"0": 40.0, "10": 44.0},
            "cost_rate": {"0": 9000.0, "10": 8800.0}}  # fmt: skip


def test_the_section_shows_every_figure(tmp_path: Path) -> None:
    rows = [_row("walq", 0), _row("sqlite", 0)]
    rep = section_of(tmp_path, s_fair, rows)
    text = "\n".join(rep.lines)
    assert "| walq | 51 / 49 | 501 / 499 | 0.010 / 7.50 | 2 / 100000 | 0.9900 |" in text
    assert "44.0 (1.10x), 8800" in text
    assert EXPERIMENTS["S"] is s_fair
    assert "PostgreSQL: the issue's bar" not in text  # (no PostgreSQL row)


def test_the_section_shows_postgres_bar_and_database_cost(tmp_path: Path) -> None:
    pg = {**_row("postgres", 0), "bar_most_1s": 11, "bar_total": 200,
          "cost_db_us": {"0": 250.0, "10": 1000.0}, "cost_dead": {"0": 0, "10": 109}}  # fmt: skip
    rep = section_of(tmp_path, s_fair, [_row("walq", 0), pg])
    text = "\n".join(rep.lines)
    assert "| postgres | 11 | 200 | 250, 0 | 1000, 109 |" in text
    assert "bar: most in 1 s (bound 11)" in text
    assert "The peer" not in text


def test_the_section_sets_the_peers_rate_beside_sqlqs(tmp_path: Path) -> None:
    celery = {"experiment": "S", "store": "celery", "label": "S/celery", "repeat": 0,
              "rate": 50.0, "rate_s": 20.0, "most_1s": 98, "fewest_1s": 0, "most_10s": 130,
              "fewest_10s": 27, "total": 161, "processes": 3, "version": "5.7.0"}  # fmt: skip
    walq = {**_row("walq", 0), "total": 990}
    rep = section_of(tmp_path, s_fair, [walq, celery])
    text = "\n".join(rep.lines)
    assert 'Celery 5.7.0\'s `rate_limit="50/s"`' in text
    assert "| walq | 51 | 49 | 501 | 499 | 990 |" in text
    assert "| celery | 98 | 0 | 130 | 27 | 161 |" in text


@pytest.mark.slow
def test_quick_s_runs_on_the_durable_engines(tmp_path: Path) -> None:
    args = ["bench", "--quick", "--only", "S", "--out", str(tmp_path), "--no-progress",
            "--stores", "walq", "--stores", "sqlite", "--stores", "postgres"]  # fmt: skip
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in (tmp_path / "S.jsonl").read_text().splitlines()]
    assert {row["store"] for row in rows} == {"walq", "sqlite", "postgres", "celery"}
    [celery] = [row for row in rows if row["store"] == "celery"]
    assert celery["processes"] == 3
    assert celery["total"] > 0  # (what it reaches is the report's, not a pass/fail)
    [pg] = [row for row in rows if row["store"] == "postgres"]
    assert pg["bar_most_1s"] <= 11  # the bar's bound on two nodes: floor(10 * 1) + 1
    for row in [row for row in rows if row is not celery]:
        assert row["most_1s"] <= 51  # the rate's bound: floor(50 * 1) + 1
        assert row["fair_before"] <= 16 < row["fifo_before"]
        assert min(row["jain"]) > 0.9
