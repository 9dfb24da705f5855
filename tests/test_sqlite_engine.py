"""SQLite-only behaviour: pragmas, plain-sqlite3 readability, the lock, one statement
per group-commit batch on aiosqlite's connection, and which constraint an insert broke."""

from __future__ import annotations

import asyncio
import importlib
import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiosqlite
import msgspec
import pytest

from sqlq.common.errors import DuplicateJobError, DuplicateKeyError, StaleEpochError
from sqlq.common.models import TRANSITIONS, Job, State
from sqlq.common.store import SyncLevel
from sqlq.engines.sqlite import batch
from sqlq.engines.sqlite.batch import duplicate, on_thread
from sqlq.engines.sqlite.migrate import SCHEMA_VERSION
from sqlq.engines.sqlite.store import SQLiteStore
from tests.helpers import NOW, dead_root_cone


def connection(store: SQLiteStore) -> aiosqlite.Connection:
    db = store._db
    assert isinstance(db, aiosqlite.Connection), "the engine's connection is aiosqlite's"
    return db


async def pragma(store: SQLiteStore, name: str) -> Any:
    cursor = await connection(store).execute(f"PRAGMA {name}")
    row = await cursor.fetchone()
    assert row is not None
    return row[0]


@pytest.mark.parametrize(("sync", "level"), [("full", 2), ("os", 1)])
async def test_pragmas_as_set(tmp_path: Path, sync: SyncLevel, level: int) -> None:
    store = SQLiteStore(tmp_path, sync=sync)
    await store.open()
    try:
        assert await pragma(store, "journal_mode") == "wal"
        assert await pragma(store, "synchronous") == level
    finally:
        await store.close()


async def test_a_group_commit_batch_is_one_hop_and_a_statement_per_kind_of_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many callers' moves in one batch are one UPDATE ... FROM VALUES (set-wise, through
    no trigger), in a transaction of its own (BEGIN, it, COMMIT: a refused row rolls the
    rest back), or alone when the batch has one move, and the whole batch is one hop to
    the connection's thread: the hops are paid per batch, not per statement or job."""
    store = SQLiteStore(tmp_path)
    await store.open()
    statements: list[str] = []
    hops: list[str] = []
    try:
        jobs = [Job.new(kind="noop", args={}, now=NOW) for _ in range(50)]
        await store.commit(jobs)
        db = connection(store)
        await on_thread(db, lambda conn: conn.set_trace_callback(statements.append))
        hop = db._execute

        def spy(fn: Any, *args: Any) -> Any:
            hops.append(getattr(fn, "__name__", repr(fn)))
            return hop(fn, *args)  # type: ignore[no-untyped-call]

        monkeypatch.setattr(db, "_execute", spy)
        before = store.stats().batches
        starts = [j.start(NOW + 1) for j in jobs]
        await asyncio.gather(*(store.commit([t]) for t in starts))
        batches = store.stats().batches - before
        monkeypatch.undo()
        await on_thread(db, lambda conn: conn.set_trace_callback(None))
    finally:
        monkeypatch.undo()
        await store.close()
    assert hops == ["apply_plan"] * batches, hops
    updates = [s for s in statements if s.startswith("UPDATE jobs")]
    assert len(updates) == batches, statements
    assert not any("batch_changes" in s for s in statements), statements
    assert len(statements) <= 3 * batches, statements  # BEGIN, UPDATE, COMMIT at most
    assert batches < len(starts)  # the 50 callers shared batches
    assert store.slow_batches == 0


def _integrity_error(text: str, code: int) -> sqlite3.IntegrityError:
    exc = sqlite3.IntegrityError(text)
    exc.sqlite_errorcode = code  # sqlite3 sets it on a real error
    return exc


def test_which_constraint_an_insert_broke_comes_from_the_error_code_not_its_text() -> None:
    job = Job.new(kind="noop", args={}, now=NOW, idempotency_key="k")
    by_key = _integrity_error("constraint failed", sqlite3.SQLITE_CONSTRAINT_UNIQUE)
    assert isinstance(duplicate(job, by_key), DuplicateKeyError)
    by_id = _integrity_error("idempotency_key", sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY)
    assert isinstance(duplicate(job, by_id), DuplicateJobError)
    keyless = Job.new(kind="noop", args={}, now=NOW)
    assert isinstance(duplicate(keyless, by_key), DuplicateJobError)


@pytest.fixture
async def opened(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    """The engine open on ``tmp_path``, closed after the test."""
    store = SQLiteStore(tmp_path)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def test_a_duplicate_key_and_a_duplicate_id_are_told_apart(opened: SQLiteStore) -> None:
    """Through the slow path, on real SQLite errors: the caller whose key is taken gets
    DuplicateKeyError, the one whose id is taken DuplicateJobError, the others commit."""
    first = Job.new(kind="noop", args={}, now=NOW, idempotency_key="k")
    await opened.commit([first])
    same_key = Job.new(kind="noop", args={}, now=NOW, idempotency_key="k")
    other = Job.new(kind="noop", args={}, now=NOW, idempotency_key="other")
    same_id = msgspec.structs.replace(other, id=first.id)
    fine = Job.new(kind="noop", args={}, now=NOW)
    results = await asyncio.gather(
        opened.commit([same_key]), opened.commit([same_id]), opened.commit([fine]),
        return_exceptions=True,
    )  # fmt: skip
    assert isinstance(results[0], DuplicateKeyError)
    assert isinstance(results[1], DuplicateJobError)
    assert results[2] is None
    assert await opened.get(fine.id) == fine


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
    # 5 moves of the lifecycle, an operator retry from dead or cancelled, running -> running
    # (progress, a checkpoint, a cancel asked for), running -> cancelled, and a workflow
    # member's three out of waiting, and cancelled -> waiting (its cone revived).
    assert len(pairs) == 13


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
    assert version == (SCHEMA_VERSION,) == ("8",)  # the latest, whatever the file was made at
    assert {"jobs_key", "jobs_retryable"} <= indexes


def _resolves(dotted: str) -> bool:
    """``dotted`` names a module, or an attribute of one (``sqlq.common.models.TRANSITIONS``)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(target, name):
                return False
            target = getattr(target, name)
        return True
    return False


def test_every_module_path_the_sql_files_name_exists() -> None:
    """The .sql files' comments name the code that uses them; a move must not leave them
    naming modules that are gone (queries.sql named sqlq.sqlite.batch and sqlq.sql)."""
    folder = Path(batch.__file__).parent
    named = {
        (sql.name, m.group(0).rstrip("."))
        for sql in sorted(folder.glob("*.sql"))
        for m in re.finditer(r"\bsqlq(\.\w+)+", sql.read_text())
    }
    assert named  # the files do name their modules
    assert [n for n in named if not _resolves(n[1])] == []


async def test_reads_pauses_and_compactions_never_run_inside_a_batch(tmp_path: Path) -> None:
    """The one connection serves every caller, and a batch is several hops to its thread
    (BEGIN, its rows, COMMIT): a compaction's BEGIN must not meet an open batch (it
    failed the store), a pause must not ride in a batch a guard rolls back (it was
    lost), and a read must not see a batch's rows before its COMMIT."""
    store = SQLiteStore(tmp_path, sync="os")
    await store.open()
    first = Job.new(kind="noop", args={}, now=NOW)
    await store.commit([first])
    start = first.start(NOW)
    await store.commit([start])
    # A move at an epoch the job has left is refused from now on.
    stale = msgspec.structs.replace(start, expect_epoch=start.expect_epoch - 1)
    jobs = [Job.new(kind="noop", args={}, now=NOW) for _ in range(3000)]
    batch = asyncio.ensure_future(store.commit(jobs))
    refused = asyncio.ensure_future(store.commit([stale]))  # rolls its batch back
    for _ in range(3):
        await asyncio.sleep(0)  # both are on the connection's thread now
    await store.get(jobs[-1].id)  # a read while both batches are on the thread: it waits
    await store.set_queue_paused("held", True)
    await store.compact()
    results = await asyncio.gather(batch, refused, return_exceptions=True)
    assert results[0] is None
    assert isinstance(results[1], Exception)
    await store.commit([Job.new(kind="noop", args={}, now=NOW)])  # the store still writes
    await store.close()
    again = SQLiteStore(tmp_path, sync="os")
    recovery = await again.open()
    try:
        assert recovery.paused_queues == ["held"]
    finally:
        await again.close()


def test_none_and_bools_bind_through_the_registry_as_sqlite3_binds_them() -> None:
    """The engine registers None and bool with sqlite3's adapters (a miss there formats an
    AttributeError per value: ~100k instructions of a no-op job); they must bind exactly
    as sqlite3 binds them unregistered: NULL, and 1 and 0."""
    import sqlite3

    import sqlq.engines.sqlite.store  # noqa: F401 (it registers them)

    assert (type(None), sqlite3.PrepareProtocol) in sqlite3.adapters
    assert (bool, sqlite3.PrepareProtocol) in sqlite3.adapters
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (a, b, c)")
    db.execute("INSERT INTO t VALUES (?, ?, ?)", (None, True, False))
    assert db.execute("SELECT a, b, c, typeof(a), typeof(b) FROM t").fetchall() == [
        (None, 1, 0, "null", "integer")
    ]
    db.close()


def test_the_plan_is_set_wise_unless_a_job_changes_twice() -> None:
    from sqlq.engines.sqlite.batch import encode_rows, plan

    def rows(changes: list[Any]) -> list[tuple[str, tuple[Any, ...]]]:
        return [r for r in encode_rows(changes) if isinstance(r, tuple)]

    jobs = [Job.new(kind="noop", args={}, now=NOW) for _ in range(3)]
    starts = [j.start(NOW + 1) for j in jobs]
    fresh = Job.new(kind="noop", args={}, now=NOW)
    [ins, upd] = plan([*rows([fresh]), *rows(starts)])
    assert (ins.sql.split()[:3], ins.expect) == (["INSERT", "INTO", "jobs"], None)
    assert (upd.sql.split()[:2], upd.expect) == (["UPDATE", "jobs"], 3)
    done = Job.new(kind="noop", args={}, now=NOW)
    ordered = plan(rows([done, done.start(NOW + 1)]))  # made and moved in one batch
    assert [st.sql.split()[2] for st in ordered] == ["batch_changes"]
    assert plan(rows([starts[0], starts[0]]))[0].sql.split()[2] == "batch_changes"


async def test_a_refused_move_among_many_rolls_the_batch_back_and_fails_its_caller_only(
    opened: SQLiteStore,
) -> None:
    jobs = [Job.new(kind="noop", args={}, now=NOW) for _ in range(5)]
    await opened.commit(jobs)
    starts = [j.start(NOW + 1) for j in jobs]
    stale = jobs[2].complete(None, NOW + 1)  # scheduled -> completed: the guard refuses
    results = await asyncio.gather(
        *(opened.commit([t]) for i, t in enumerate(starts) if i != 2),
        opened.commit([stale]),
        return_exceptions=True,
    )
    assert [r is None for r in results] == [True, True, True, True, False]
    for i, j in enumerate(jobs):
        got = await opened.get(j.id)
        assert got is not None
        assert got.state.value == ("scheduled" if i == 2 else "running")


async def test_a_cascades_moves_go_together_and_a_refused_one_is_named(opened: SQLiteStore) -> None:
    """A cascade's moves between two of its reads are one guarded statement a thousand
    (``batch.move_all``); one a guard refuses undoes that statement, and each goes alone,
    which names it, so its caller's savepoint rolls all of them back."""
    jobs = [Job.new(kind="k", args={}, now=NOW) for _ in range(3)]
    await opened.commit(jobs)
    moves = [j.cancel(NOW + 1) for j in jobs]
    stale = msgspec.structs.replace(moves[1], expect_epoch=moves[1].expect_epoch + 1)

    def write(conn: sqlite3.Connection, ts: list[Any]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            batch.move_all(conn, ts)
        except BaseException:
            conn.rollback()
            raise
        conn.commit()

    with pytest.raises(StaleEpochError, match=jobs[1].id):
        await on_thread(connection(opened), write, [moves[0], stale, moves[2]])
    for job in jobs:
        assert await opened.get(job.id) == job  # nothing of it written
    await on_thread(connection(opened), write, moves)
    for job, t in zip(jobs, moves, strict=True):
        assert await opened.get(job.id) == job.apply(t)


async def test_a_dead_roots_children_move_set_wise_not_one_by_one(
    opened: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cascade's moves of 1,200 children go through ``move_all``'s set-wise statements:
    the one-by-one ``move`` runs only for the root's own start and death."""
    singles: list[str] = []
    one = batch.move

    def counted(conn: sqlite3.Connection, t: Any) -> None:
        singles.append(t.job_id)
        one(conn, t)

    monkeypatch.setattr(batch, "move", counted)
    root, kids = await dead_root_cone(opened, 1200)
    assert singles == [root.id, root.id]
    last = await opened.get(kids[-1].id)
    assert last is not None
    assert last.state is State.CANCELLED
