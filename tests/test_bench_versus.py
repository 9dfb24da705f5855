"""``sqlq.bench.versus``: its report in both modes, the callgrind dump it reads, and a real
server counted under callgrind."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from sqlq.bench import versus
from tests.helpers import unavailable


def _rows(figure: str) -> list[dict[str, object]]:
    meta = {"this": "abc", "other": "def", "repeats": 2, "python": "3.11", "platform": "p",
            "cpu": "c", "cores": 2, "disk": "d"}  # fmt: skip
    return [{"store": "walq", "tree": tree, "repeat": rep, "jobs": 100, figure: value,
             "meta": meta}
            for rep, (mine, theirs) in enumerate([(110.0, 100.0), (99.0, 90.0)])
            for tree, value in ((versus.THIS, mine), (versus.OTHER, theirs))]  # fmt: skip


def test_the_report_names_its_figure_and_takes_the_median_ratio() -> None:
    seconds = versus.report(_rows("cpu_us_per_job"))
    assert "| engine | this us/job | other us/job | this / other |" in seconds
    assert "| walq | 104.5 [99.0-110.0] | 95.0 [90.0-100.0] | 1.100 |" in seconds
    counted = versus.report(_rows("instructions_per_job"))
    assert counted.startswith("# Server instructions per no-op job")
    assert "`python -m sqlq.bench.versus --instructions`" in counted
    assert "| engine | this instructions/job | other instructions/job |" in counted


def test_a_callgrind_dump_gives_its_total(tmp_path: Path) -> None:
    dump = tmp_path / "callgrind.out.1"
    dump.write_text("version: 1\ncreator: callgrind\nevents: Ir\nsummary: 123456\n")
    assert versus.callgrind_total(dump) == 123456
    dump.write_text("events: Ir\n")
    with pytest.raises(ValueError, match="no totals"):
        versus.callgrind_total(dump)


@pytest.mark.slow  # a real sqlq serve under valgrind: ~50x slower than without
def test_a_server_under_callgrind_counts_its_instructions_per_job() -> None:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        unavailable("valgrind (Debian's valgrind: .ci/run installs it)")
    per_job = versus.one(sys.executable, "memory", 50, None, instructions=True, warm=50)
    assert 50_000 < per_job < 50_000_000  # a no-op job through HTTP: ~600k here


def test_a_count_over_jobs_that_did_not_all_finish_is_refused() -> None:
    ok = {"done": 9, "dead": 1, "acknowledged": 10, "submit_errors": 0}
    versus._all_done(ok, 10)
    for bad in ({**ok, "done": 8}, {**ok, "acknowledged": 9}, {**ok, "submit_errors": 1}):
        with pytest.raises(RuntimeError, match="10 jobs asked"):
            versus._all_done(bad, 10)


def test_the_floor_row_makes_each_engine_a_multiple_of_the_bare_post() -> None:
    rows = _rows("instructions_per_job")
    meta = rows[0]["meta"]
    rows += [{"store": versus.FLOOR, "tree": versus.FLOOR, "repeat": rep, "jobs": 100,
              "instructions_per_job": value, "meta": meta}
             for rep, value in enumerate([50.0, 45.0])]  # fmt: skip
    counted = versus.report(rows)
    assert "| floor: the bare POST (`sqlq.bench.trivial`) | 47.5 [45.0-50.0] | | | 1.00 | |" in (
        counted
    )
    # walq's repeats: 110/50 and 99/45 over the floor (2.2 both), 100/50 and 90/45 (2.0 both)
    assert "| walq | 104.5 [99.0-110.0] | 95.0 [90.0-100.0] | 1.100 | 2.20 | 2.00 |" in counted


def test_a_baseline_that_is_no_commit_is_refused_naming_it() -> None:
    with pytest.raises(SystemExit, match="--baseline nosuchcommit: no such commit"):
        versus.baseline_python("nosuchcommit")


@pytest.mark.slow  # the bare app under valgrind
def test_the_floor_counts_the_bare_posts_instructions() -> None:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        unavailable("valgrind (Debian's valgrind: .ci/run installs it)")
    per_request = versus.floor_one(50, instructions=True, warm=50)
    assert 10_000 < per_request < 5_000_000  # the bare POST: ~134k here
    # its CPU from /proc, in ticks of 10 ms: enough requests that some ticks pass
    assert versus.floor_one(5000, instructions=False) > 0
