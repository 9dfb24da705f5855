"""SQLite-only behaviour: pragmas, plain-sqlite3 readability, the lock."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sqlq.common.models import TRANSITIONS, Job, State
from sqlq.engines.sqlite.store import SQLiteStore
from tests.helpers import NOW


@pytest.mark.parametrize(("sync", "level"), [("full", 2), ("os", 1)])
async def test_pragmas_as_set(tmp_path: Path, sync: str, level: int) -> None:
    store = SQLiteStore(tmp_path, sync=sync)  # type: ignore[arg-type]
    await store.open()
    try:
        mode = await store._on_db(lambda db: db.execute("PRAGMA journal_mode").fetchone())
        assert mode[0] == "wal"
        sync_level = await store._on_db(lambda db: db.execute("PRAGMA synchronous").fetchone())
        assert sync_level[0] == level
    finally:
        await store.close()


async def test_database_reads_with_plain_sqlite3(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path)
    await store.open()
    job = Job.new(kind="sleep", args={"work_ms": 5}, now=NOW)
    await store.commit([job])
    t = job.start(NOW + 1)
    await store.commit([t])
    await store.commit([job.apply(t).complete({"ok": 1}, NOW + 2)])
    await store.close()
    with sqlite3.connect(tmp_path / "sqlq.db") as db:
        row = db.execute(
            "SELECT state, attempts, epoch, json_extract(result, '$.ok') FROM jobs WHERE id = ?",
            (job.id,),
        ).fetchone()
    assert row == (State.COMPLETED.value, 1, 0, 1)


async def test_transition_table_is_in_the_database(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path)
    await store.open()
    await store.close()
    with sqlite3.connect(tmp_path / "sqlq.db") as db:
        pairs = set(db.execute("SELECT from_state, to_state FROM legal_transitions"))
    # Exactly the Python table: every legal move, and nothing else.
    assert pairs == {(a.value, b.value) for a, nxt in TRANSITIONS.items() for b in nxt}
    assert len(pairs) == 7  # 5 moves of the lifecycle, and an operator retry from dead or cancelled


V1_TABLE = """CREATE TABLE jobs (
    id TEXT PRIMARY KEY, kind TEXT NOT NULL, args TEXT NOT NULL, state TEXT NOT NULL,
    attempts INTEGER NOT NULL, max_attempts INTEGER NOT NULL, ready_at REAL NOT NULL,
    priority INTEGER NOT NULL, epoch INTEGER NOT NULL, created_at REAL NOT NULL,
    updated_at REAL NOT NULL, last_error TEXT, result TEXT, started_at REAL
) WITHOUT ROWID"""


async def test_a_version_1_database_is_migrated_in_place(tmp_path: Path) -> None:
    job = Job.new(kind="sleep", args={"work_ms": 5}, now=NOW)
    with sqlite3.connect(tmp_path / "sqlq.db") as db:
        db.execute(V1_TABLE)
        db.execute(
            "INSERT INTO jobs VALUES (?, 'sleep', '{\"work_ms\":5}', 'scheduled', 0, 5, ?, 0, 0,"
            " ?, ?, NULL, 'null', NULL)",
            (job.id, NOW, NOW, NOW),
        )
    (tmp_path / "sqlq.db").chmod(0o600)
    store = SQLiteStore(tmp_path)
    recovery = await store.open()
    try:
        assert recovery.jobs == [job]  # every new column took its default
        await store.commit([Job.new(kind="sleep", args={}, now=NOW, idempotency_key="k")])
        found = await store.find_key("k")
        assert found is not None
    finally:
        await store.close()
    with sqlite3.connect(tmp_path / "sqlq.db") as db:
        version = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert version == ("2",)
    assert {"jobs_key", "jobs_retryable"} <= indexes
