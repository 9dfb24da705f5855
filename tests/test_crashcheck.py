"""The crash verifier: a short real run per engine, and proof that it catches a loss."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from bench.crashcheck import Trial, run_trials, verify
from bench.offline import VerifyError, read_walq

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("store", ["walq", "sqlite"])
def test_a_few_kill9_trials_lose_nothing(tmp_path: Path, store: str) -> None:
    rows = run_trials(
        store=store, sync="full", trials=3, jobs=2000, seed=5, out=tmp_path, progress=False
    )
    assert [r["problems"] for r in rows] == [[], [], []]
    assert sum(r["acknowledged"] for r in rows) > 0
    stale = tmp_path / f"crash-{store}-full.jsonl"
    assert len(stale.read_text().splitlines()) == 3
    # a second run replaces the first run's rows instead of adding to them
    run_trials(store=store, sync="full", trials=1, jobs=200, seed=6, out=tmp_path, progress=False)
    assert len(stale.read_text().splitlines()) == 1


def _trial(store: str) -> Trial:
    return Trial(
        store=store, sync="full", jobs=10, clients=1, kill_after_s=1, compact_floor_mb=None
    )


def test_the_walq_verifier_sees_a_record_missing_from_the_middle(tmp_path: Path) -> None:
    import asyncio

    from tests.walq_helpers import write_history

    d = tmp_path / "walq"
    asyncio.run(write_history(d, n=6))
    lines = (d / "walq.log").read_bytes().split(b"\n")
    assert len(read_walq(d / "walq.log")) == 6
    (d / "walq.log").write_bytes(b"\n".join(lines[:3] + lines[4:]))
    with pytest.raises(VerifyError, match="sequence"):
        read_walq(d / "walq.log")


def test_the_sqlite_verifier_reports_an_acknowledged_job_that_is_gone(tmp_path: Path) -> None:
    d = tmp_path / "sqlite"
    d.mkdir()
    with sqlite3.connect(d / "sqlq.db") as db:
        db.execute("CREATE TABLE jobs (id TEXT, state TEXT, epoch INT, attempts INT)")
        db.execute("INSERT INTO jobs VALUES ('a', 'completed', 0, 1)")
    row = verify(_trial("sqlite"), tmp_path, ["a", "b"], 0.1, {})
    assert row["ok"] is False
    assert row["lost"] == 1
    assert "missing" in row["problems"][0]
