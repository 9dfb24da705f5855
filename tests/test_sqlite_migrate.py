"""A SQLite database made by the code of schema version 3 (tests/data/sqlite_v3.db, see
tests/data/README.md) opens with today's: every job as written with the running fields at
their defaults, its schedule and its paused queue; the new fields then round-trip; a
second open changes nothing; the migration rewrites no row and is all or nothing."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import msgspec
import pytest

from sqlq.common.backoff import RetryPolicy, after_failure, after_snooze
from sqlq.common.errors import StoreError
from sqlq.common.models import TRANSITIONS, Job, State
from sqlq.common.running import check_progress
from sqlq.common.schedule import Schedule
from sqlq.common.store import JobQuery
from sqlq.engines.rows import FAIR_COLUMNS, LEASE_COLUMNS, RUNNING_COLUMNS
from sqlq.engines.sqlite.store import SQLiteStore
from tests.helpers import NOW
from tests.migrate_helpers import columns, copy_sqlite, raw, version

DATA = Path(__file__).parent / "data"
FACTS = json.loads((DATA / "sqlite_v3.json").read_text())
WRITTEN = {d["id"]: Job.from_dict(d) for d in FACTS["jobs"]}  # the new fields: defaults
LIVE = {State.SCHEDULED, State.RUNNING}
NEW_COLUMNS = (*RUNNING_COLUMNS, *LEASE_COLUMNS, *FAIR_COLUMNS)  # 4, 5 and 6, then 8


def _v3(tmp_path: Path) -> Path:
    """A copy of the version-3 file in a data directory of its own."""
    return copy_sqlite("sqlite_v3.db", tmp_path)


def test_the_file_is_what_version_3_wrote() -> None:
    """The premise: the committed file is at version 3, without the running columns, and
    holds a job in every state."""
    db = DATA / "sqlite_v3.db"
    assert FACTS["schema_version"] == "3" == version(db)
    assert not set(RUNNING_COLUMNS) & set(columns(db))
    assert {j.state for j in WRITTEN.values()} == set(State) - {State.WAITING}
    assert len(raw(db, "SELECT id FROM jobs")) == len(WRITTEN)


async def test_a_version_3_database_opens_with_every_job_schedule_and_pause(
    tmp_path: Path,
) -> None:
    db = _v3(tmp_path)
    store = SQLiteStore(tmp_path)
    recovery = await store.open()
    try:
        assert {j.id: j for j in recovery.jobs} == {
            i: j for i, j in WRITTEN.items() if j.state in LIVE
        }
        assert sorted(recovery.running) == [
            i for i, j in WRITTEN.items() if j.state is State.RUNNING
        ]
        assert recovery.paused_queues == FACTS["paused_queues"] == ["mail"]
        for job_id, written in WRITTEN.items():
            got = await store.get(job_id)
            assert got == written
            assert got.cancel_requested_at is None
            assert got.progress is None
            assert (got.checkpoint, got.snoozes, got.errors) == (None, 0, ())
            assert (got.holder, got.lease_until) == (None, None)
        assert await store.list_jobs(JobQuery(limit=100)) == sorted(
            WRITTEN.values(), key=lambda j: j.id
        )
        schedules = [msgspec.convert(s, Schedule) for s in FACTS["schedules"]]
        assert await store.list_schedules() == schedules
        (tick,) = [j for j in WRITTEN.values() if (j.idempotency_key or "").startswith("sched:")]
        assert await store.list_jobs(JobQuery(schedule="nightly")) == [tick]
        assert await store.find_key("k1") == WRITTEN["018bcfe5680000000000000000000001"]
    finally:
        await store.close()
    assert version(db) == "8"  # through version 4 to the latest
    assert columns(db)[-len(NEW_COLUMNS) :] == list(NEW_COLUMNS)


async def test_the_new_fields_round_trip_on_a_migrated_file_and_a_reopen_changes_nothing(
    tmp_path: Path,
) -> None:
    db = _v3(tmp_path)
    running = next(j for j in WRITTEN.values() if j.state is State.RUNNING)
    retried = next(j for j in WRITTEN.values() if j.state is State.SCHEDULED and j.last_error)
    store = SQLiteStore(tmp_path)
    await store.open()
    try:
        t1 = running.touch(NOW + 10, progress=check_progress(50, "half", NOW + 10),
                           checkpoint={"done": [1, 2]})  # fmt: skip
        touched = running.apply(t1)
        t2 = touched.request_cancel(NOW + 11)
        asked = touched.apply(t2)
        t3 = after_failure(asked, "CancelledError", NOW + 12, RetryPolicy(), random.Random(1))
        withdrawn = asked.apply(t3)
        t4 = retried.start(NOW + 13)
        started = retried.apply(t4)
        t5 = after_snooze(started, 30.0, NOW + 14, max_snoozes=100)
        snoozed = started.apply(t5)
        for t in (t1, t2, t3, t4, t5):
            await store.commit([t])
        assert withdrawn.state is State.CANCELLED
        assert withdrawn.errors
        assert withdrawn.checkpoint == {"done": [1, 2]}
        assert withdrawn.progress is not None
        assert snoozed.snoozes == 1
        assert snoozed.state is State.SCHEDULED
        expected = {**WRITTEN, withdrawn.id: withdrawn, snoozed.id: snoozed}
        assert {i: await store.get(i) for i in expected} == expected
    finally:
        await store.close()
    schema = raw(db, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
    again = SQLiteStore(tmp_path)
    await again.open()  # a second open: already at version 5, nothing to migrate
    try:
        assert {i: await again.get(i) for i in expected} == expected
    finally:
        await again.close()
    assert raw(db, "SELECT type, name, sql FROM sqlite_master ORDER BY name") == schema
    assert version(db) == "8"
    assert set(raw(db, "SELECT from_state, to_state FROM legal_transitions")) == {
        (a.value, b.value) for a, nxt in TRANSITIONS.items() for b in nxt
    }


async def test_a_migration_that_fails_midway_leaves_version_3(tmp_path: Path) -> None:
    """The five columns and the version are one transaction: a file that already has the
    last of them (so the fifth ADD COLUMN fails) keeps none of the others, and says 3."""
    db = _v3(tmp_path)
    with sqlite3.connect(db) as c:
        c.execute("ALTER TABLE jobs ADD COLUMN errors TEXT")
    c.close()
    before = columns(db)
    with pytest.raises(StoreError, match="duplicate column"):
        await SQLiteStore(tmp_path).open()
    assert columns(db) == before
    assert version(db) == "3"
    with sqlite3.connect(db) as c:
        c.execute("ALTER TABLE jobs DROP COLUMN errors")
    c.close()
    store = SQLiteStore(tmp_path)
    await store.open()  # the next open finishes it
    await store.close()
    assert version(db) == "8"  # through version 4 to the latest
    assert columns(db)[-len(NEW_COLUMNS) :] == list(NEW_COLUMNS)


PAGE = 1024  # the committed file's page size (tests/data/make_sqlite.py)


def _pages(db: Path) -> list[bytes]:
    data = db.read_bytes()
    return [data[i : i + PAGE] for i in range(0, len(data), PAGE)]


async def test_the_migration_rewrites_no_row(tmp_path: Path) -> None:
    """ADD COLUMN changes the table's entry in sqlite_schema, not its rows: on a file of
    thousands of pages of jobs, the open that migrates it changes a handful of pages (the
    schema, the transition table, meta), so it is as quick on a million jobs as on one."""
    db = _v3(tmp_path)
    (row,) = raw(db, "SELECT * FROM jobs WHERE state = 'completed'")
    with sqlite3.connect(db) as c:
        c.executemany(
            f"INSERT INTO jobs VALUES ({', '.join('?' * len(row))})",
            [
                (f"{i:032x}", *row[1:2], json.dumps({"pad": "x" * 200}), *row[3:])
                for i in range(20_000)
            ],
        )
    c.close()  # the last connection: its close checkpoints the WAL into the file
    before = _pages(db)
    assert len(before) > 4000
    store = SQLiteStore(tmp_path)
    await store.open()
    await store.close()  # the last connection's close checkpoints the WAL into the file
    after = _pages(db)
    assert version(db) == "8"
    # (a page the open's tables grew by, and a root page for each table and index a later
    # version adds: 6 in version 8)
    assert len(before) <= len(after) <= len(before) + 10
    changed = [n for n, (a, b) in enumerate(zip(before, after, strict=False)) if a != b]
    assert len(changed) < 16, changed
