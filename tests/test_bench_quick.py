"""``sqlq bench --quick``: every experiment runs end to end and the report builds.

Sizes are tiny, so no figure is checked against a bar here (timing claims live
in results/); what is checked is that the instrument works: every experiment
wrote rows, the report has a section for each, and the quick kill -9 run lost
no acknowledged job.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sqlq.cli import main

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)  # two minutes alone (P starts sqlq worker processes); more when loaded
def test_quick_suite_runs_every_experiment(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["bench", "--quick", "--out", str(tmp_path), "--no-progress"])
    assert r.exit_code == 0, r.output
    for name in ("ceiling", *"ABCDEFGHIJKLMNOP"):
        rows = (tmp_path / f"{name}.jsonl").read_text().splitlines()
        assert rows, f"experiment {name} wrote nothing"
        row = json.loads(rows[0])
        assert row["meta"]["quick"] is True
        assert row["meta"]["python"]
    report = (tmp_path / "REPORT.md").read_text()
    for heading in ("## A.", "## B.", "## C.", "## D.", "## E.", "## F.", "## G.", "## H.",
                    "## I.", "## J.", "## K.", "## L.", "## M.", "## N.", "## O.", "## P.",
                    "## The client's ceiling", "## When is SQLite enough"):  # fmt: skip
        assert heading in report
    for row in map(json.loads, (tmp_path / "E.jsonl").read_text().splitlines()):
        assert row["lost"] == 0
        assert row["unfinished"] == 0
        assert row["acknowledged"] > 0
    assert (tmp_path / "plots" / "A_scaling.png").exists()

    # --report-only rebuilds from the jsonl alone
    (tmp_path / "REPORT.md").unlink()
    r = CliRunner().invoke(main, ["bench", "--report-only", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "REPORT.md").read_text() == report
