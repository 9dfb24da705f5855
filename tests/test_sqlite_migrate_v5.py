"""A SQLite database made by the code of schema version 4 (tests/data/sqlite_v4.db, see
tests/data/README.md) opens with today's, at version 5: every job as written (the running
fields of version 4 included) with no holder and no lease, its schedule and its paused
queue; a remote claim's holder and lease then round-trip, and so does the signing key;
the migration is all or nothing and rewrites no row."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import msgspec
import pytest

from sqlq.common.errors import StoreError
from sqlq.common.models import Job, State
from sqlq.common.protocol import remote_holder
from sqlq.common.schedule import Schedule
from sqlq.common.store import JobQuery
from sqlq.common.tokens import KEY_BYTES
from sqlq.engines.rows import FAIR_COLUMNS, LEASE_COLUMNS, RUNNING_COLUMNS
from sqlq.engines.sqlite.store import SQLiteStore
from tests.helpers import NOW
from tests.migrate_helpers import columns, copy_sqlite, raw, version

DATA = Path(__file__).parent / "data"
FACTS = json.loads((DATA / "sqlite_v4.json").read_text())
WRITTEN = {d["id"]: Job.from_dict(d) for d in FACTS["jobs"]}  # holder, lease: defaults
LIVE = {State.SCHEDULED, State.RUNNING}
PAGE = 1024  # the committed file's page size (tests/data/make_sqlite.py)


def _v4(tmp_path: Path) -> Path:
    return copy_sqlite("sqlite_v4.db", tmp_path)


def _tables(db: Path) -> set[str]:
    return {r[0] for r in raw(db, "SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_the_file_is_what_version_4_wrote() -> None:
    """The premise: version 4, the running columns but no lease ones, no secrets table, a
    job in every state and the running fields in use."""
    db = DATA / "sqlite_v4.db"
    assert FACTS["schema_version"] == "4" == version(db)
    assert set(RUNNING_COLUMNS) <= set(columns(db))
    assert not set(LEASE_COLUMNS) & set(columns(db))
    assert "secrets" not in _tables(db)
    assert {j.state for j in WRITTEN.values()} == set(State) - {State.WAITING}
    assert any(j.progress and j.checkpoint and j.cancel_requested_at for j in WRITTEN.values())
    assert any(j.snoozes for j in WRITTEN.values())
    assert any(j.errors for j in WRITTEN.values())


async def test_a_version_4_database_opens_with_every_job_schedule_and_pause(
    tmp_path: Path,
) -> None:
    db = _v4(tmp_path)
    store = SQLiteStore(tmp_path)
    recovery = await store.open()
    try:
        assert {j.id: j for j in recovery.jobs} == {
            i: j for i, j in WRITTEN.items() if j.state in LIVE
        }
        [running] = [i for i, j in WRITTEN.items() if j.state is State.RUNNING]
        assert recovery.running == [running]
        assert recovery.paused_queues == FACTS["paused_queues"] == ["mail"]
        for job_id, written in WRITTEN.items():
            got = await store.get(job_id)
            assert got == written
            assert got is not None
            assert (got.holder, got.lease_until) == (None, None)  # an in-process claim's
        assert await store.list_jobs(JobQuery(limit=100)) == sorted(
            WRITTEN.values(), key=lambda j: j.id
        )
        schedules = [msgspec.convert(s, Schedule) for s in FACTS["schedules"]]
        assert await store.list_schedules() == schedules
    finally:
        await store.close()
    assert version(db) == "8"
    assert columns(db)[-len(LEASE_COLUMNS) - 2 :] == [*LEASE_COLUMNS, *FAIR_COLUMNS]
    assert "secrets" in _tables(db)


async def test_a_remote_claim_and_the_signing_key_round_trip_on_a_migrated_file(
    tmp_path: Path,
) -> None:
    db = _v4(tmp_path)
    waiting = next(j for j in WRITTEN.values() if j.state is State.SCHEDULED and j.snoozes)
    holder = remote_holder("w1")
    store = SQLiteStore(tmp_path)
    await store.open()
    try:
        t1 = waiting.start(NOW + 100, holder=holder, lease_until=NOW + 130)
        held = waiting.apply(t1)
        t2 = held.renew(NOW + 110, NOW + 140)
        renewed = held.apply(t2)
        await store.commit([t1])
        await store.commit([t2])
        assert await store.get(waiting.id) == renewed
        assert (renewed.holder, renewed.lease_until) == (holder, NOW + 140)
        key = await store.signing_key()
        assert len(key) == KEY_BYTES
    finally:
        await store.close()
    schema = raw(db, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
    again = SQLiteStore(tmp_path)
    recovery = await again.open()  # a second open: at version 5 already, nothing to migrate
    try:
        assert await again.get(waiting.id) == renewed
        assert waiting.id in recovery.running
        assert await again.signing_key() == key
        done = renewed.complete({"ok": 1}, NOW + 120)
        await again.commit([done])
        ended = await again.get(waiting.id)
        assert ended == renewed.apply(done)
        assert ended is not None
        assert (ended.holder, ended.lease_until) == (None, None)
    finally:
        await again.close()
    assert raw(db, "SELECT type, name, sql FROM sqlite_master ORDER BY name") == schema
    assert raw(db, "SELECT name, length(value) FROM secrets") == [("signing_key", KEY_BYTES)]


async def test_a_migration_that_fails_midway_leaves_version_4(tmp_path: Path) -> None:
    """The two columns and the version are one transaction: a file that has the second
    already (so its ADD COLUMN fails) keeps no holder column, and says 4."""
    db = _v4(tmp_path)
    with sqlite3.connect(db) as c:
        c.execute("ALTER TABLE jobs ADD COLUMN lease_until REAL")
    c.close()
    before = columns(db)
    with pytest.raises(StoreError, match="duplicate column"):
        await SQLiteStore(tmp_path).open()
    assert columns(db) == before
    assert version(db) == "4"
    with sqlite3.connect(db) as c:
        c.execute("ALTER TABLE jobs DROP COLUMN lease_until")
    c.close()
    store = SQLiteStore(tmp_path)
    await store.open()  # the next open finishes it
    await store.close()
    assert version(db) == "8"
    assert columns(db)[-len(LEASE_COLUMNS) - 2 :] == [*LEASE_COLUMNS, *FAIR_COLUMNS]


def _pages(db: Path) -> list[bytes]:
    data = db.read_bytes()
    return [data[i : i + PAGE] for i in range(0, len(data), PAGE)]


async def test_the_migration_rewrites_no_row(tmp_path: Path) -> None:
    """ADD COLUMN of two NULL columns changes the table's entry in sqlite_schema, not its
    rows: on thousands of pages of jobs the migrating open changes a handful (the schema,
    the new secrets table, the transition table, meta)."""
    db = _v4(tmp_path)
    (row,) = raw(db, "SELECT * FROM jobs WHERE state = 'completed'")
    with sqlite3.connect(db) as c:
        c.executemany(
            f"INSERT INTO jobs VALUES ({', '.join('?' * len(row))})",
            [
                (f"{i:032x}", *row[1:2], json.dumps({"pad": "x" * 200}), *row[3:])
                for i in range(20_000)
            ],
        )
    c.close()
    before = _pages(db)
    assert len(before) > 4000
    store = SQLiteStore(tmp_path)
    await store.open()
    await store.close()  # the last connection's close checkpoints the WAL into the file
    after = _pages(db)
    assert version(db) == "8"
    # (+ a root page for each table and index a later version adds: 10 through version 8)
    assert len(before) <= len(after) <= len(before) + 10
    changed = [n for n, (a, b) in enumerate(zip(before, after, strict=False)) if a != b]
    assert len(changed) < 16, changed
