"""Experiment O, progress costs: its report on synthetic rows (no server), and a
``--quick`` run of it end to end on every durable engine (slow: real servers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sqlq.bench.experiments import EXPERIMENTS, ORDER, o_progress
from sqlq.cli import main
from sqlq.engines.registry import DURABLE
from tests.helpers import section_of


def _row(
    store: str, repeat: int, progress: int, percent: float | None = 100.0
) -> dict[str, object]:
    return {"experiment": "O", "store": store, "label": f"O/{store}", "repeat": repeat,
            "meta": {"git_commit": "abc1234"}, "seconds": 10.0, "every_ms": 10, "reports": 990,
            "commits_silent": 3, "commits_progress": 3 + progress, "batches_silent": 3,
            "batches_progress": 3 + progress, "last_percent": percent}  # fmt: skip


def test_o_is_registered_after_n() -> None:
    assert EXPERIMENTS["O"] is o_progress
    assert ORDER.index("O") == ORDER.index("N") + 1


def test_section_counts_the_writes_progress_added_and_checks_the_bar(tmp_path: Path) -> None:
    rows = [_row("walq", 0, 10), _row("walq", 1, 11), _row("walq", 2, 9),
            _row("sqlite", 0, 25), _row("sqlite", 1, 11, percent=40.0)]  # fmt: skip
    rep = section_of(tmp_path, o_progress, rows)
    assert "## O. Progress costs" in "\n".join(rep.lines)
    walq = next(ln for ln in rep.lines if ln.startswith("| walq"))
    assert "| 10 [9-11] | 1.00 [0.90-1.10] |" in walq
    assert rep.checks[0].startswith("O: walq, store writes of a job reporting progress every")
    assert rep.checks[0].endswith(": met)")
    assert "10 in 10 s (1.00/s), from 990 reports" in rep.checks[0]
    # sqlite: 18 writes median is over the bar, and one run's latest did not go with its end
    assert rep.checks[1].endswith("NOT met)")


@pytest.mark.slow  # real servers, a few seconds each
@pytest.mark.timeout(300)
def test_quick_o_runs_on_every_durable_engine_within_the_bar(tmp_path: Path) -> None:
    args = ["bench", "--quick", "--only", "O", "--out", str(tmp_path), "--no-progress"]
    for store in DURABLE:
        args += ["--stores", store]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (tmp_path / "O.jsonl").read_text().splitlines()]
    for kib in (0, o_progress.CHECKPOINT_KIB):  # without a checkpoint, then holding one
        assert sorted(row["store"] for row in rows if row["checkpoint_kib"] == kib) == sorted(
            DURABLE
        )
    for row in rows:
        assert row["reports"] > 100  # every 10 ms for 2 s
        assert row["last_percent"] == 100.0
        assert row["bytes_progress"] >= 0  # (0 where the files are in memory: tmpfs)
        writes = row["commits_progress"] - row["commits_silent"]
        assert 1 <= writes <= row["seconds"] + 1, row
    assert "## O. Progress costs" in (tmp_path / "REPORT.md").read_text()
