"""Experiment P, workers anywhere: its section and bar lines on canned rows (no server),
and a ``--quick`` run of it end to end with real servers and workers (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sqlq.bench.experiments import EXPERIMENTS, ORDER, p_remote
from sqlq.bench.report import Report
from sqlq.bench.spinkind import read_log, spin, stamp
from sqlq.cli import main
from tests.helpers import section_of


def _row(part: str, mode: str, repeat: int, **fields: object) -> dict[str, object]:
    return {"experiment": "P", "store": fields.pop("store", "sqlite"), "repeat": repeat,
            "label": f"P/{part}/{mode}", "meta": {"git_commit": "abc1234", "cores": 2},
            "part": part, "mode": mode, "load_before": 1.0, "load_after": 3.0,
            **fields}  # fmt: skip


def _noop(store: str, mode: str, repeat: int, done_s: float, cpu_s: float,
          workers: int = 64, drain_s: float | None = None) -> dict[str, object]:  # fmt: skip
    return _row("noop", mode, repeat, store=store, jobs=1000, completed=1000, done_s=done_s,
                drain_s=done_s if drain_s is None else drain_s, server_cpu_s=cpu_s,
                worker_cpu_s=0.1 if mode == "remote" else 0.0,
                workers=workers, remote_workers=2 if mode == "remote" else 0)  # fmt: skip


def _cpu(mode: str, processes: int, repeat: int, drain_s: float) -> dict[str, object]:
    store = "huey" if mode == "huey" else "sqlite"
    return _row("cpu", mode, repeat, store=store, processes=processes, jobs=100, completed=100,
                rounds=300_000, drain_s=drain_s, handler_pids=processes, job_ms=30.0,
                version="3.5.4" if mode == "huey" else "")  # fmt: skip


def _section(tmp_path: Path, rows: list[dict[str, object]]) -> Report:
    rep = section_of(tmp_path, p_remote, rows)
    return rep


def test_p_is_registered_after_o() -> None:
    assert EXPERIMENTS["P"] is p_remote
    assert ORDER.index("P") == ORDER.index("O") + 1


def test_bars_come_from_the_ratios_within_each_repeat(tmp_path: Path) -> None:
    rows = [
        # walq: remote at 0.70x and 0.40x of in-process (median 0.55: met)
        _noop("walq", "local", 0, 0.07, 0.10), _noop("walq", "remote", 0, 0.10, 0.08),
        _noop("walq", "local", 1, 0.20, 0.10), _noop("walq", "remote", 1, 0.50, 0.12),
        # sqlite: remote at 0.25x (not met); with two full claims' slots at 0.50x (not met,
        # bar 0.90x) and server CPU 0.90x of in-process (met, bar 1.00x); a full claim's
        # slots is a row beside it, with no bar
        _noop("sqlite", "local", 0, 0.10, 0.10), _noop("sqlite", "remote", 0, 0.40, 0.10),
        _noop("sqlite", "remote", 0, 0.20, 0.09, workers=400),
        _noop("sqlite", "remote", 0, 0.25, 0.09, workers=200),
        # cpu: p2 over p1 1.95x and 1.75x (median 1.85: met); p2 over huey w2 0.95x (not met)
        _cpu("remote", 1, 0, 3.9), _cpu("remote", 2, 0, 2.0), _cpu("huey", 2, 0, 1.9),
        _cpu("remote", 1, 1, 3.5), _cpu("remote", 2, 1, 2.0), _cpu("huey", 2, 1, 1.9),
        _cpu("local", 2, 0, 4.0), _cpu("huey", 1, 0, 3.6),
        _row("latency", "local", 0, jobs=100, start_p50_ms=2.0, start_p99_ms=4.0,
             handler_p50_ms=2.1, handler_p99_ms=4.2),
        _row("latency", "remote", 0, jobs=100, start_p50_ms=3.0, start_p99_ms=6.0,
             handler_p50_ms=3.5, handler_p99_ms=7.0),
    ]  # fmt: skip
    rep = _section(tmp_path, rows)
    assert rep.checks == [
        "P: walq, no-op jobs/s through a remote worker over in-process: 0.55x (bar >= 0.50x: met)",
        "P: sqlite, no-op jobs/s through a remote worker over in-process: 0.25x "
        "(bar >= 0.50x: NOT met)",
        "P: sqlite, no-op jobs/s through remote workers with two full claims' slots "
        "over in-process: 0.50x (bar >= 0.90x: NOT met)",
        "P: sqlite, server CPU a no-op job with remote workers (two full claims' "
        "slots) over in-process: 0.90x (bar <= 1.00x: met)",
        "P: CPU-bound handler, `sqlq worker --processes 2` over `--processes 1`: 1.85x "
        "(bar >= 1.8x: met)",
        "P: CPU-bound handler, `sqlq worker --processes 2` over huey `-k process -w 2`: "
        "0.95x (50.0 vs 52.6 jobs/s) (bar: at least as fast: NOT met)",
    ]
    text = "\n".join(rep.lines)
    assert "## P. Workers anywhere" in text
    assert "load average around the runs: 2.0 [1.0-3.0] on 2 cores" in text
    # the remote row carries the per-repeat ratios: median [min-max]
    walq = [ln for ln in rep.lines if ln.startswith("| walq | sqlq worker, 2 x 32 slots")]
    assert walq
    enough = next(ln for ln in rep.lines if ln.startswith("| sqlite | sqlq worker, 2 x 200 slots"))
    assert enough.endswith("| 0.50 | 0.90 |")
    wide = next(ln for ln in rep.lines if ln.startswith("| sqlite | sqlq worker, 2 x 100 slots"))
    assert wide.endswith("| 0.40 | 0.90 |")
    assert "| 0.55 [0.40-0.70] |" in walq[0]
    # server CPU per job, remote over in-process: 0.8x and 1.2x
    assert walq[0].endswith("| 1.00 [0.80-1.20] |")
    p2 = next(ln for ln in rep.lines if ln.startswith("| `sqlq worker --processes 2`"))
    assert "| 1.85 [1.75-1.95] |" in p2
    assert "huey 3.5.4: `SqliteHuey` with fsync" in text
    lat = next(ln for ln in rep.lines if ln.startswith("| sqlite | sqlq worker | 3.00"))
    assert lat.endswith("| 3.50 | 7.00 |")


def test_a_noop_rate_runs_to_the_last_durable_completion(tmp_path: Path) -> None:
    # in-process: every outcome decided in 0.1 s, the last durable at 0.4 s; remote: 0.5 s
    rows = [_noop("walq", "local", 0, 0.4, 0.1, drain_s=0.1),
            _noop("walq", "remote", 0, 0.5, 0.1, drain_s=0.45)]  # fmt: skip
    rep = _section(tmp_path, rows)
    assert rep.checks == [
        "P: walq, no-op jobs/s through a remote worker over in-process: 0.80x (bar >= 0.50x: met)"
    ]
    local = next(ln for ln in rep.lines if ln.startswith("| walq | server (in-process)"))
    assert local.startswith("| walq | server (in-process) | 2,500 | 10,000 |")


def test_a_noop_row_from_before_done_s_was_measured_has_no_rate(tmp_path: Path) -> None:
    rows = [_noop("walq", "local", 0, 0.0, 0.1, drain_s=0.1),
            _noop("walq", "remote", 0, 0.0, 0.1, drain_s=0.4)]  # fmt: skip
    rep = _section(tmp_path, rows)
    assert rep.checks == []  # no bar read from a window it was not measured on
    local = next(ln for ln in rep.lines if ln.startswith("| walq | server (in-process)"))
    assert local.startswith("| walq | server (in-process) | - | 10,000 |")


def test_a_run_without_its_pair_has_no_ratio_and_no_bar(tmp_path: Path) -> None:
    rows = [_noop("walq", "remote", 0, 0.5, 0.1), _cpu("remote", 2, 0, 2.0)]
    rep = _section(tmp_path, rows)
    assert rep.checks == []
    remote = next(ln for ln in rep.lines if ln.startswith("| walq | sqlq worker"))
    assert remote.endswith("| - | - |")


def test_the_handler_log_is_one_line_a_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "spin.log"
    assert read_log(log) == []
    monkeypatch.setenv("SQLQ_BENCH_P_LOG", str(log))
    stamp(1.5)
    stamp(2.5)
    [(pid, start, end), second] = read_log(log)
    assert start == 1.5
    assert end > start
    assert second[1] == 2.5
    assert pid > 0
    assert spin(10) == spin(10) != spin(11)


@pytest.mark.slow  # real servers, sqlq worker processes, huey's consumer
@pytest.mark.timeout(600)
def test_quick_p_runs_every_part_side_by_side(tmp_path: Path) -> None:
    args = ["bench", "--quick", "--only", "P", "--stores", "walq", "--stores", "sqlite",
            "--out", str(tmp_path), "--no-progress"]  # fmt: skip
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (tmp_path / "P.jsonl").read_text().splitlines()]
    seen = {(row["part"], row["store"], row["mode"], row.get("processes", 0)) for row in rows}
    for store in ("walq", "sqlite"):
        assert {("noop", store, "local", 0), ("noop", store, "remote", 0)} <= seen
        assert {("latency", store, "local", 0), ("latency", store, "remote", 0)} <= seen
    assert {("cpu", "sqlite", "remote", 1), ("cpu", "sqlite", "remote", 2)} <= seen
    for row in rows:
        if row["part"] in ("noop", "cpu"):
            assert row["completed"] == row["jobs"], row
            assert row["drain_s"] > 0
        if row["part"] == "noop":  # durable after the last decision, or with it
            assert row["done_s"] >= row["drain_s"] > 0, row
        if row["part"] == "cpu" and row["mode"] != "local":  # never more than it was given
            assert 1 <= row["handler_pids"] <= row["processes"], row
    report = (tmp_path / "REPORT.md").read_text()
    assert "## P. Workers anywhere" in report
    assert "P: walq, no-op jobs/s through a remote worker over in-process" in report
