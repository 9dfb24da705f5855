"""A SQLite database made by the code of schema version 5 (tests/data/sqlite_v5.db, see
tests/data/README.md) opens with today's, at version 6: every job as written, none of them
forced (a job force-cancelled by that code, which kept the fact in memory only, reads with
the lease it stored, the grace's end, and no more); a forced cancel then round-trips and
holds its lease through a reopen; the migration is all or nothing."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from sqlq.common.errors import StoreError
from sqlq.common.models import Job, State
from sqlq.engines.rows import FAIR_COLUMNS
from sqlq.engines.sqlite.store import SQLiteStore
from tests.migrate_helpers import columns, copy_sqlite, raw, version

DATA = Path(__file__).parent / "data"
FACTS = json.loads((DATA / "sqlite_v5.json").read_text())
WRITTEN = {d["id"]: Job.from_dict(d) for d in FACTS["jobs"]}  # cancel_forced: its default
NOW = 1_700_000_000.0  # make_sqlite_v5.py's


def _v5(tmp_path: Path) -> Path:
    return copy_sqlite("sqlite_v5.db", tmp_path)


def _forced_then() -> Job:
    """The job that code force-cancelled: asked, its lease cut to the grace's end."""
    [job] = [j for j in WRITTEN.values() if j.cancel_requested_at is not None]
    return job


def test_the_file_is_what_version_5_wrote() -> None:
    db = DATA / "sqlite_v5.db"
    assert FACTS["schema_version"] == "5" == version(db)
    assert "holder" in columns(db)
    assert "cancel_forced" not in columns(db)
    forced = _forced_then()
    assert (forced.state, forced.holder) == (State.RUNNING, "worker:w1")
    assert forced.cancel_requested_at is not None
    assert forced.lease_until == forced.cancel_requested_at + 10.0  # the grace's end


async def test_a_version_5_database_opens_with_no_job_forced(tmp_path: Path) -> None:
    db = _v5(tmp_path)
    store = SQLiteStore(tmp_path)
    recovery = await store.open()
    try:
        assert {j.id: j for j in recovery.jobs} == WRITTEN  # every one is live
        for job_id, written in WRITTEN.items():
            got = await store.get(job_id)
            assert got == written
            assert got is not None
            assert got.cancel_forced is False
    finally:
        await store.close()
    assert version(db) == "8"
    assert columns(db)[-3:] == ["cancel_forced", *FAIR_COLUMNS]
    assert raw(db, "SELECT DISTINCT cancel_forced FROM jobs") == [(0,)]


async def test_a_forced_cancel_round_trips_and_holds_its_lease_on_a_migrated_file(
    tmp_path: Path,
) -> None:
    _v5(tmp_path)
    [held] = [j for j in WRITTEN.values() if j.holder == "worker:w2"]
    store = SQLiteStore(tmp_path)
    await store.open()
    try:
        t = held.force_cancel(NOW + 5, NOW + 15)
        forced = held.apply(t)
        await store.commit([t])
        assert (forced.cancel_forced, forced.lease_until) == (True, NOW + 15)
        renewal = forced.renew(NOW + 6, NOW + 66)  # a heartbeat: the lease stays
        await store.commit([renewal])
        assert forced.apply(renewal).lease_until == NOW + 15
    finally:
        await store.close()
    again = SQLiteStore(tmp_path)
    await again.open()  # at version 6 already: nothing to migrate
    try:
        got = await again.get(held.id)
        assert got is not None
        assert (got.cancel_forced, got.lease_until) == (True, NOW + 15)
        out = got.withdraw("cancelled", NOW + 16)  # it leaves running: no longer forced
        await again.commit([out])
        ended = await again.get(held.id)
        assert ended is not None
        assert (ended.state, ended.cancel_forced, ended.holder) == (State.CANCELLED, False, None)
    finally:
        await again.close()


async def test_a_migration_that_fails_midway_leaves_version_5(tmp_path: Path) -> None:
    """The column and the version are one transaction: a failed ADD COLUMN keeps version 5,
    and the next open finishes it."""
    db = _v5(tmp_path)
    with sqlite3.connect(db) as c:  # the meta row's write fails: the column goes with it
        c.execute(
            "CREATE TRIGGER no_meta BEFORE UPDATE ON meta BEGIN SELECT RAISE(ABORT, 'x'); END"
        )
    c.close()
    with pytest.raises(StoreError):
        await SQLiteStore(tmp_path).open()
    assert "cancel_forced" not in columns(db)
    assert version(db) == "5"
    with sqlite3.connect(db) as c:
        c.execute("DROP TRIGGER no_meta")
    c.close()
    store = SQLiteStore(tmp_path)
    await store.open()
    await store.close()
    assert version(db) == "8"
    assert columns(db)[-3:] == ["cancel_forced", *FAIR_COLUMNS]
