"""Experiment D, the cost of durability: its table shows how much of a submit phase the
engine's writer spent writing (synthetic rows, no server), and a ``--quick`` run records
that from a real server's own metrics (slow: real servers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sqlq.bench.experiments import d_durability
from sqlq.bench.report import Report
from sqlq.cli import main
from sqlq.engines.registry import DURABLE
from tests.helpers import section_of


def _row(
    store: str, repeat: int, submit_s: float, wait_s: float | None, gc: bool = True
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "experiment": "D", "store": store, "label": f"D/{store}", "repeat": repeat,
        "params": {"workload": "20ms-single", "group_commit": gc},
        "config": {"sync": "full"}, "jobs": 2000, "submit_s": submit_s, "total_s": 2.6,
        "server_cpu_s": 0.5, "meta": {"git_commit": "abc1234"},
    }  # fmt: skip
    if wait_s is not None:
        row["submit_commit_s"], row["submit_batches"] = wait_s, 63
    return row


def _line(rep: Report, store: str, gc: str = "on") -> str:
    prefix = f"| 20ms-single | {store} | full | {gc} |"
    return next(ln for ln in rep.lines if ln.startswith(prefix))


def test_the_table_shows_the_writers_time_in_the_submit_phase_and_its_share(
    tmp_path: Path,
) -> None:
    rows = [_row("memory", 0, 0.150, 0.0), _row("memory", 1, 0.150, 0.0),
            _row("sqlite", 0, 0.200, 0.060), _row("sqlite", 1, 0.220, 0.070),
            _row("sqlite", 0, 3.0, 2.9, gc=False),
            _row("walq", 0, 0.180, None)]  # fmt: skip  # (walq's from before it was recorded)
    rep = section_of(tmp_path, d_durability, rows)
    assert "| writing s | share |" in "\n".join(rep.lines)
    # sqlite: 0.210 s, 1.40x memory's; writing 0.065 s of it; the repeats' shares 0.30, 0.32
    assert "| 0.210 [0.200-0.220] | 1.40 | 0.065 [0.060-0.070] | 0.31 |" in _line(rep, "sqlite")
    assert "| 3.000 | 20.00 | 2.900 | 0.97 |" in _line(rep, "sqlite", "off")
    assert "| 0.180 | 1.20 | - | - |" in _line(rep, "walq")  # no wait recorded: none shown
    assert "| 0.150 [0.150-0.150] | 1.00 | - | - |" in _line(rep, "memory")  # no commits
    assert any(c.startswith("D: sqlite") and c.endswith("NOT met)") for c in rep.checks)


@pytest.mark.slow  # real servers, a few seconds each
@pytest.mark.timeout(300)
def test_quick_d_records_each_durable_engines_writing_time(tmp_path: Path) -> None:
    args = ["bench", "--quick", "--only", "D", "--out", str(tmp_path), "--no-progress",
            "--stores", "memory"]  # fmt: skip
    for store in DURABLE:
        args += ["--stores", store]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (tmp_path / "D.jsonl").read_text().splitlines()]
    assert {row["store"] for row in rows} == {"memory", *DURABLE}
    for row in rows:
        if row["store"] == "memory":  # nothing to write: no batch, no wait
            assert (row["submit_commit_s"], row["submit_batches"]) == (0.0, 0), row
            continue
        # every job of the phase went through a batch; one writer: at most the phase
        assert row["submit_batches"] >= 1, row
        if row["params"]["group_commit"]:
            assert row["submit_batches"] < row["acknowledged"], row  # (32 clients share them)
        assert 0 < row["submit_commit_s"] <= row["submit_s"], row
    assert "| writing s | share |" in (tmp_path / "REPORT.md").read_text()
