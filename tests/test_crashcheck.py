"""The crash verifier: short real runs per engine and workload, the verdict on how an
acknowledged job may end, and proof that it catches a loss."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sqlq.bench.crashcheck import run_trials, verify
from sqlq.bench.crashload import Ledger, Trial
from sqlq.bench.offline import READERS, JobFacts, VerifyError, read_data, read_walq
from sqlq.bench.verdict import ClientRecord, judge
from sqlq.engines.registry import DURABLE
from tests.helpers import assert_verdict


def test_every_durable_engine_is_read_offline_by_the_crash_suites() -> None:
    """The crash, I/O-error and power-loss suites run over the registry's DURABLE engines
    and read their files offline: a new engine without a reader fails here, not skips."""
    assert set(READERS) == set(DURABLE)
    with pytest.raises(VerifyError, match="no offline reader for the 'newdb' engine"):
        read_data("newdb", Path("."))


@pytest.mark.slow
@pytest.mark.parametrize("store", DURABLE)
def test_a_few_plain_kill9_trials_lose_nothing(tmp_path: Path, store: str) -> None:
    rows = run_trials(
        store=store, sync="full", trials=3, jobs=2000, seed=5, out=tmp_path, progress=False,
        workload="plain",
    )  # fmt: skip
    assert [r["problems"] for r in rows] == [[], [], []]
    assert sum(r["acknowledged"] for r in rows) > 0
    stale = tmp_path / f"crash-{store}-full.jsonl"
    assert len(stale.read_text().splitlines()) == 3
    # a second run replaces the first run's rows instead of adding to them
    run_trials(
        store=store, sync="full", trials=1, jobs=200, seed=6, out=tmp_path, progress=False,
        workload="plain",
    )  # fmt: skip
    assert len(stale.read_text().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("store", DURABLE)
def test_mixed_kill9_trials_restart_at_once_and_end_as_the_clients_saw(
    tmp_path: Path, store: str
) -> None:
    """Failing, long (last-attempt), hanging and delayed jobs, cancels, retries and pauses:
    the first restart comes up (issue 19, item 1: a job killed on its last attempt made it
    exit), and every acknowledged job ends as the client's story allows."""
    rows = run_trials(
        store=store, sync="full", trials=3, jobs=3000, seed=2, out=tmp_path, progress=False
    )
    assert [r["problems"] for r in rows] == [[], [], []]
    assert all(r["first_restart_ok"] for r in rows)
    ended = {state for r in rows for state in r["ended"]}
    assert {"completed", "dead", "cancelled"} <= ended  # the workload really is mixed
    assert (tmp_path / f"crash-{store}-full-mixed.jsonl").exists()


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


def _sqlite_jobs(tmp_path: Path, rows: list[tuple[str, str, int, int, int, int]]) -> None:
    d = tmp_path / "sqlite"
    d.mkdir()
    with sqlite3.connect(d / "sqlq.db") as db:
        db.execute(
            "CREATE TABLE jobs (id TEXT, state TEXT, epoch INT, attempts INT, "
            "max_attempts INT, attempts_total INT)"
        )
        db.executemany("INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?)", rows)


def test_the_sqlite_verifier_reports_an_acknowledged_job_that_is_gone(tmp_path: Path) -> None:
    _sqlite_jobs(tmp_path, [("a", "completed", 0, 1, 5, 0)])
    row = verify(_trial("sqlite"), tmp_path, ["a", "b"], 0.1, {})
    assert row["ok"] is False
    assert row["lost"] == 1
    assert "missing" in row["problems"][0]


def test_a_failed_first_restart_fails_the_trial_even_when_nothing_is_lost(
    tmp_path: Path,
) -> None:
    _sqlite_jobs(tmp_path, [("a", "completed", 0, 1, 5, 0)])
    problem = "the first restart failed: sqlq serve exited with 1: KeyError: 'x'"
    row = verify(_trial("sqlite"), tmp_path, ["a"], 0.1, {}, [problem])
    assert (row["ok"], row["lost"], row["first_restart_ok"]) == (False, 0, False)


def test_the_ledger_reads_back_what_the_clients_did(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.txt")
    ledger.ack("a", 2, True)
    ledger.ack("b", None, False)
    ledger.note("b", "cancel?")
    ledger.note("b", "cancel")
    (tmp_path / "ledger.txt").write_bytes(b"old\n" + ledger.take())  # and an old-format line
    again = Ledger.read(tmp_path / "ledger.txt")
    assert again.acked == ["old", "a", "b"]
    assert again.records["a"] == ClientRecord(2, True, [])
    assert again.records["b"] == ClientRecord(None, False, ["cancel?", "cancel"])


def _job(state: str, attempts: int = 1, max_attempts: int = 3, epoch: int = 0) -> JobFacts:
    return JobFacts(state, epoch, attempts, max_attempts=max_attempts)


@pytest.mark.parametrize(
    ("job", "rec", "problem"),
    [
        (None, ClientRecord(), "missing"),
        (_job("scheduled"), ClientRecord(), "not finished"),
        (_job("completed"), ClientRecord(), None),
        # nothing could fail it and it had the server's 5 attempts: it completed
        (_job("dead", 5, 5, 5), ClientRecord(), "nothing failed it"),
        (_job("dead", 3, 3, 3), ClientRecord(3, True), None),  # its attempts used up
        (_job("dead", 2, 3, 2), ClientRecord(3, True), "dead after 2 of 3"),
        (_job("completed"), ClientRecord(2, False, ["cancel?", "cancel"]), "saw it cancelled"),
        (_job("cancelled", 0), ClientRecord(2, False, ["cancel?", "cancel"]), None),
        (_job("cancelled", 0), ClientRecord(2, False, ["cancel?"]), None),  # sent; it landed
        (_job("completed"), ClientRecord(2, False, ["cancel?"]), None),  # sent; it did not
        (_job("cancelled", 0), ClientRecord(2, True), "no client cancelled it"),
        # cancelled, then retried (answered): it ran again
        (
            _job("completed", epoch=1),
            ClientRecord(2, False, ["cancel?", "cancel", "retry?", "retry"]),
            None,
        ),
        (
            _job("cancelled", 0, epoch=1),
            ClientRecord(2, False, ["cancel?", "cancel", "retry?", "retry"]),
            "retried after its last cancel",
        ),
        (_job("completed", 1, 3, epoch=4), ClientRecord(3, True), "epoch 4"),
    ],
)
def test_the_verdict_on_how_an_acknowledged_job_may_end(
    job: JobFacts | None, rec: ClientRecord, problem: str | None
) -> None:
    assert_verdict(judge(job, rec), problem)


def test_in_shared_mode_a_claim_takes_an_epoch_too() -> None:
    job = _job("completed", 3, 3, epoch=6)  # claimed, failed, claimed, failed, claimed, done
    assert judge(job, ClientRecord(3, True), epochs_per_attempt=2) is None
    assert judge(job, ClientRecord(3, True)) is not None
