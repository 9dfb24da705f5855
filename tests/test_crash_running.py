"""The crash verifier reads what a running job carries, and holds the trials to its rules
(issue 22): the offline readers' new facts, walq's fold checking the cancel rule on every
step, the verdicts on a cancel acknowledged while running, a checkpoint and a snooze, and
the ledgers that record them."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import cast

import msgspec
import pytest

from sqlq.bench.crashload import SAVED_NAME, Ledger, mixed_spec
from sqlq.bench.offline import JobFacts, read_data, read_sqlite, read_walq
from sqlq.bench.offline_pg import read_pg
from sqlq.bench.verdict import CHECKPOINT_TAG, SNOOZE_TAG, ClientRecord, judge
from sqlq.common.clock import FakeClock
from sqlq.common.models import Job, Transition
from sqlq.common.running import Progress
from sqlq.common.store import SharedStore
from sqlq.engines.registry import SHARED
from sqlq.walq.store import WalStore
from tests.helpers import StoreFactory, assert_verdict
from tests.walq_helpers import NOW, NoSyncFiles, log_path


async def _walq(d: Path, steps: list[str]) -> Job:
    """A job put, then moved through ``steps`` (names of ``Job``'s constructors)."""
    store = WalStore(d, clock=FakeClock(NOW), fs=NoSyncFiles())
    await store.open()
    job = Job.new(kind="sleep", args={}, now=NOW, job_id="a" * 32, max_attempts=5)
    await store.commit([job])
    for step in steps:
        t: Transition
        if step == "touch":
            p = Progress(percent=50.0, message="half", at=NOW)
            t = job.touch(NOW, progress=p, checkpoint={"epoch": job.epoch, "read": None})
        elif step == "retry":
            t = job.retry("boom", NOW, NOW)
        elif step == "withdraw":
            t = job.withdraw("cancelled", NOW)
        elif step == "snooze":
            t = job.snooze(NOW + 1, NOW)
        elif step == "complete":
            t = job.complete({"ok": True}, NOW)
        else:
            t = getattr(job, step)(NOW)
        await store.commit([t])
        job = job.apply(t)
    await store.close()
    return job


async def test_the_walq_reader_folds_what_a_running_job_carries(tmp_path: Path) -> None:
    steps = ["start", "touch", "retry", "start", "snooze", "start", "request_cancel", "withdraw"]
    job = await _walq(tmp_path, steps)
    [facts] = read_walq(log_path(tmp_path)).values()
    assert (facts.state, facts.epoch, facts.attempts) == ("cancelled", 3, 2)
    assert facts.cancel_requested_at == job.cancel_requested_at == NOW
    assert facts.progress == {"percent": 50.0, "message": "half", "at": NOW}
    assert facts.checkpoint == {"epoch": 0, "read": None}
    assert facts.snoozes == 1
    assert [e["error"] for e in facts.errors] == ["boom", "cancelled"]
    assert facts.breaks == []
    assert judge(facts, ClientRecord(5, True, ["cancel?", "cancel202"], requested_at=2)) is None


async def test_the_walq_reader_sees_a_job_requeued_after_its_cancel_was_asked_for(
    tmp_path: Path,
) -> None:
    """The store does not refuse it (the rule is the runtime's), so the verifier must."""
    await _walq(tmp_path, ["start", "request_cancel", "retry", "start", "complete"])
    [facts] = read_walq(log_path(tmp_path)).values()
    assert facts.breaks == ["scheduled after a cancel was asked for (epoch 0)"]
    verdict = judge(facts, ClientRecord(5, False, ["cancel?", "cancel202"], requested_at=1))
    assert verdict is not None
    assert "cancel rule broken" in verdict


def test_the_sqlite_reader_reads_the_new_columns_as_json_text(tmp_path: Path) -> None:
    path = tmp_path / "sqlq.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE jobs (id TEXT, state TEXT, epoch INT, attempts INT, max_attempts INT, "
            "attempts_total INT, result TEXT, cancel_requested_at REAL, progress TEXT, "
            "checkpoint TEXT, snoozes INT, errors TEXT)"
        )
        db.executemany(
            "INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                ("a", "dead", 2, 2, 2, 0, "null", 5.0, '{"percent":1.0,"message":null,"at":1.0}',
                 '{"epoch":1}', 3, '[{"attempt":1,"error":"x","at":1.0}]'),
                ("b", "completed", 0, 1, 5, 0, '{"read":null}', None, None, None, 0, None),
            ],
        )  # fmt: skip
    facts = read_sqlite(path)
    a, b = facts["a"], facts["b"]
    assert (a.cancel_requested_at, a.snoozes, a.checkpoint) == (5.0, 3, {"epoch": 1})
    assert a.progress == {"percent": 1.0, "message": None, "at": 1.0}
    assert a.errors == [{"attempt": 1, "error": "x", "at": 1.0}]
    assert (b.result, b.progress, b.checkpoint, b.errors, b.snoozes) == ({"read": None}, None,
                                                                          None, [], 0)  # fmt: skip


def _facts(state: str, attempts: int = 1, epoch: int = 0, **kw: object) -> JobFacts:
    facts = JobFacts(state, epoch, attempts, max_attempts=5)
    for name, value in kw.items():
        setattr(facts, name, value)
    return facts


ASKED = ["cancel?", "cancel202"]


@pytest.mark.parametrize(
    ("job", "rec", "problem"),
    [
        # a cancel acknowledged while it ran: cancelled (stored) or completed, by that attempt
        (_facts("cancelled", cancel_requested_at=1.0), ClientRecord(3, events=ASKED,
                                                                    requested_at=1), None),
        (_facts("completed"), ClientRecord(3, events=ASKED, requested_at=1), None),
        (_facts("cancelled"), ClientRecord(3, events=ASKED, requested_at=1), "no cancel_req"),
        (_facts("dead", 3, 3), ClientRecord(3, events=ASKED, requested_at=1), "acknowledged"),
        (_facts("cancelled", 2, 1, cancel_requested_at=1.0),
         ClientRecord(3, events=ASKED, requested_at=1), "it ran again"),
        (_facts("completed", 2, 1), ClientRecord(3, events=ASKED, requested_at=1), "ran again"),
        # its claim given back before the handler started: cancelled, the attempt uncounted
        # (a remote worker's kill -9 trial, sqlite-worker, read this as "it ran again")
        (_facts("cancelled", 0, 0, cancel_requested_at=1.0),
         ClientRecord(3, events=ASKED, requested_at=1), None),
        (_facts("completed", 1, 2), ClientRecord(3, events=ASKED, requested_at=2),
         "an attempt is lost"),
        (_facts("cancelled", 0, 0, cancel_requested_at=1.0),
         ClientRecord(3, events=ASKED, requested_at=2), "an attempt is lost"),
        # ... unless the operator retried it after
        (_facts("completed", 1, 2), ClientRecord(3, events=[*ASKED, "retry?"], requested_at=1),
         None),
        # a checkpointing job: the last attempt read the newest durable save before it
        (_facts("completed", 3, 2, result={"epoch": 2, "read": 1}),
         ClientRecord(5, True, tag=CHECKPOINT_TAG, saved=[0, 1, 2]), None),
        (_facts("completed", 3, 2, result={"epoch": 2, "read": 0}),
         ClientRecord(5, True, tag=CHECKPOINT_TAG, saved=[0, 1, 2]), "not 1's"),
        (_facts("completed", 2, 1, result={"epoch": 1, "read": None}),
         ClientRecord(5, True, tag=CHECKPOINT_TAG, saved=[0]), "epoch None, not 0's"),
        (_facts("completed", 2, 1, result={"epoch": 1, "read": 0}, checkpoint={"epoch": 1}),
         ClientRecord(5, True, tag=CHECKPOINT_TAG, saved=[0]), "not cleared"),
        (_facts("dead", 5, 5, checkpoint={"epoch": 4}),
         ClientRecord(5, True, tag=CHECKPOINT_TAG, saved=[0, 4]), None),
        (_facts("dead", 5, 5, checkpoint={"epoch": 3}),
         ClientRecord(5, True, tag=CHECKPOINT_TAG, saved=[0, 4]), "not 4's"),
        # a snoozing job: its snoozes, no attempt for them (a kill may cost one)
        (_facts("completed", 1, 3, snoozes=3), ClientRecord(tag=SNOOZE_TAG, snoozes=3), None),
        (_facts("completed", 2, 4, snoozes=3), ClientRecord(tag=SNOOZE_TAG, snoozes=3), None),
        (_facts("completed", 4, 3, snoozes=3), ClientRecord(tag=SNOOZE_TAG, snoozes=3),
         "a snooze was counted"),
        (_facts("completed", 1, 2, snoozes=2), ClientRecord(tag=SNOOZE_TAG, snoozes=3),
         "after 2 snoozes, not 3"),
        (_facts("dead", 5, 5, snoozes=1), ClientRecord(tag=SNOOZE_TAG, snoozes=3), "ended dead"),
        # every snooze is an epoch, and no attempt
        (_facts("completed", 1, 5, snoozes=3), ClientRecord(tag=SNOOZE_TAG, snoozes=3),
         "epoch 5"),
    ],
)  # fmt: skip
def test_the_verdict_on_what_a_running_job_carries(
    job: JobFacts, rec: ClientRecord, problem: str | None
) -> None:
    assert_verdict(judge(job, rec), problem)


def test_the_ledgers_read_back_tags_running_cancels_and_durable_checkpoints(
    tmp_path: Path,
) -> None:
    ledger = Ledger(tmp_path / "ledger.txt")
    ledger.ack("a", 4, True, CHECKPOINT_TAG)
    ledger.ack("b", None, False, SNOOZE_TAG, 3)
    ledger.ack("c", 3, False, "cancel")
    ledger.note("c", "cancel?")
    ledger.requested("c", 1)
    (tmp_path / "ledger.txt").write_bytes(ledger.take())
    (tmp_path / SAVED_NAME).write_text("a 0\na 1\nzz 3\na 2")  # a stranger, a torn last line?
    again = Ledger.read(tmp_path / "ledger.txt")
    assert again.records["a"] == ClientRecord(4, True, tag=CHECKPOINT_TAG, saved=[0, 1, 2])
    assert again.records["b"] == ClientRecord(None, False, tag=SNOOZE_TAG, snoozes=3)
    assert again.records["c"] == ClientRecord(
        3, False, ["cancel?", "cancel202"], tag="cancel", requested_at=1
    )
    (tmp_path / SAVED_NAME).write_text("a 0\na 5\n")  # the restarted server's handlers
    again.read_saved()
    assert again.records["a"].saved == [0, 5]


def test_the_mixed_workload_uses_every_new_capability() -> None:
    import random

    rng = random.Random(1)
    tags = {mixed_spec(rng)[2] for _ in range(2000)}
    assert tags == {"", "cancel", CHECKPOINT_TAG, SNOOZE_TAG}


def test_the_crash_report_shows_what_the_mixed_trials_did_with_running_jobs(
    tmp_path: Path,
) -> None:
    from sqlq.bench.crashreport import _running_section

    row = {"store": "walq", "running_cancels": 3, "running_cancels_cancelled": 2,
           "checkpoint_jobs": 5, "checkpoints_read": 4, "checkpoints_saved": 9, "snoozes": 7,
           "with_progress": 6, "with_errors": 8}  # fmt: skip
    (tmp_path / "crash-walq-full-mixed.jsonl").write_text(json.dumps(row) + "\n" * 2)
    (tmp_path / "crash-walq-full.jsonl").write_text(json.dumps({"store": "walq"}) + "\n")
    lines = _running_section(tmp_path)
    assert "| walq | 1 | 3 | 2 | 5 | 4 | 9 | 7 | 6 | 8 |" in lines
    assert _running_section(tmp_path / "nothing") == []


async def test_every_engine_s_files_read_offline_hold_what_a_running_job_carries(
    reopen_factory: StoreFactory, reopen_engine: str, tmp_path: Path
) -> None:
    """The readers the crash suites use, against what each engine really wrote (SQLite and
    PostgreSQL: their new columns, read in plain SQL)."""
    store = reopen_factory()
    await store.open()
    job = Job.new(kind="sleep", args={}, now=NOW, job_id="b" * 32, max_attempts=5)
    await store.commit([job])
    for step in ("start", "touch", "retry", "start", "snooze", "start", "request_cancel"):
        if step == "touch":
            p = Progress(percent=12.5, message="an eighth", at=NOW)
            t = job.touch(NOW, progress=p, checkpoint={"blob": "y" * 1000})
        elif step == "retry":
            t = job.retry("boom", NOW, NOW)
        elif step == "snooze":
            t = job.snooze(NOW, NOW)
        elif step == "start" and job.snoozes == 1:  # the last start: a remote worker's claim
            if reopen_engine in SHARED:  # there only a claim names a remote holder
                shared = cast(SharedStore, store)
                [job] = await shared.claim(1, NOW + 1, NOW + 31, {}, holder="worker:w0")
                continue
            t = job.start(NOW + 1, holder="worker:w0", lease_until=NOW + 31)
        else:
            t = getattr(job, step)(NOW + 1)
        await store.commit([t])
        job = job.apply(t)
    await store.close()
    if reopen_engine in SHARED:
        [facts] = (await read_pg(store.dsn)).values()  # type: ignore[attr-defined]
    else:
        [facts] = read_data(reopen_engine, tmp_path).values()
    want = json.loads(msgspec.json.encode(job))
    assert (facts.state, facts.epoch, facts.attempts) == ("running", job.epoch, 2)
    names = ("cancel_requested_at", "progress", "checkpoint", "snoozes", "errors", "holder",
             "lease_until")  # fmt: skip
    for name in names:
        assert getattr(facts, name) == want[name], name
    assert (facts.holder, facts.lease_until) == ("worker:w0", NOW + 31)
