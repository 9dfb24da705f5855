"""``sqlq.bench.pytop``: calls per job from cProfile dumps, and the table of several."""

from __future__ import annotations

import cProfile
from pathlib import Path

from sqlq.bench import pytop


def _work(n: int) -> int:
    return sum(_step(i) for i in range(n))


def _step(i: int) -> int:
    return i * 2


def _dump(path: Path, jobs: int) -> Path:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(jobs):
        _work(3)
    profile.disable()
    profile.dump_stats(str(path))
    return path


def test_calls_are_counted_per_job_and_a_function_gone_reads_zero(tmp_path: Path) -> None:
    before = _dump(tmp_path / "before.prof", 10)
    calls, own, total = pytop.per_job(before, 10)
    step = next(key for key in calls if key.endswith(":_step"))
    assert calls[step] == 3  # three a job, exactly
    assert calls[next(key for key in calls if key.endswith(":_work"))] == 1
    assert total > 0
    assert own[step] >= 0
    # A dump in which ``_step`` was never called: its cell says 0.
    empty = cProfile.Profile()
    empty.enable()
    empty.disable()
    empty.dump_stats(str(tmp_path / "after.prof"))
    text = pytop.table([("before", before), ("after", tmp_path / "after.prof")], 10, 10)
    row = next(line for line in text.splitlines() if ":_step`" in line)
    cells = [cell.strip() for cell in row.split("|")[2:-1]]
    assert cells[0].startswith("3.00 (")
    assert cells[1] == "0"
    assert "**Python calls a job**" in text


def test_where_names_a_file_the_same_in_every_layout() -> None:
    assert pytop.where("/work/main/sqlq/runtime/live.py") == "runtime/live.py"
    assert pytop.where("/tmp/old/common/runtime/live.py") == "runtime/live.py"
    assert pytop.where("/root/.pyenv/versions/3.11.7/lib/python3.11/asyncio/tasks.py") == (
        "asyncio/tasks.py"
    )
    assert pytop.where("~") == "builtins"
