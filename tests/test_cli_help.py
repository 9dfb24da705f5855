"""``sqlq --help``: the user's commands apart from the benchmark's, which plug in through
entry points and say which extra they need when it is missing (#34, item 8)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from sqlq.cli import main, missing_from
from tests.helpers import without_module

BENCH = ("bench", "crashcheck", "loadgen")


def _sections(text: str) -> dict[str, list[str]]:
    """The help's sections: heading -> the command names listed under it."""
    out: dict[str, list[str]] = {}
    heading = ""
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            heading = line[:-1]
            out[heading] = []
        elif heading and line.startswith("  ") and line.strip():
            out[heading].append(line.split()[0])
    return out


def test_the_benchmarks_commands_have_a_heading_of_their_own() -> None:
    r = CliRunner().invoke(main, ["--help"])
    assert r.exit_code == 0, r.output
    found = _sections(r.output)
    assert {"serve", "submit", "jobs", "schedules", "worker", "backup"} <= set(found["Commands"])
    assert set(found["Commands"]).isdisjoint(BENCH)
    assert tuple(found["Benchmark commands (the sqlq[bench] extra)"]) == BENCH
    assert missing_from("bench") == []  # (this environment has the extra)


@pytest.fixture
def no_matplotlib(tmp_path: Path) -> dict[str, str]:
    """An environment in which ``import matplotlib`` fails, as on a base install."""
    return without_module(tmp_path, "matplotlib")


def _sqlq(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sqlq", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def test_without_the_extra_help_still_lists_them_and_each_names_the_extra(
    no_matplotlib: dict[str, str], tmp_path: Path
) -> None:
    done = _sqlq(no_matplotlib, tmp_path, "--help")
    assert done.returncode == 0, done.stderr
    found = _sections(done.stdout)
    assert tuple(found["Benchmark commands (the sqlq[bench] extra)"]) == BENCH
    assert "loadgen     (not installed: pip install 'sqlq[bench]')" in done.stdout
    for name in ("loadgen", "bench"):
        done = _sqlq(no_matplotlib, tmp_path, name, "--help")
        assert done.returncode == 1, done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line == (f"Error: sqlq {name} is a benchmark command: it needs the bench "
                        "extra, which this install lacks (matplotlib): pip install "
                        "'sqlq[bench]'")  # fmt: skip
    done = _sqlq(no_matplotlib, tmp_path, "submit", "--help")  # the rest is unaffected
    assert done.returncode == 0, done.stderr
