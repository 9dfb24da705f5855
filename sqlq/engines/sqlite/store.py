"""``SQLiteStore``: the JobStore on one SQLite table in WAL journal mode.

One ``sqlite3`` connection, used only on the engine's one I/O thread (see
``sqlq.common.engine.base``). The writer task makes a batch of commits one
transaction: ``BEGIN IMMEDIATE``, one multi-row statement for the inserts, one
for the guarded updates, ``COMMIT``, all in one hop to that thread. One
statement per batch rather than ``executemany``'s one per row, because the
thread must retake the GIL after every SQLite step, and with the event loop
busy each retake waits.

Every update is fenced in SQL (``WHERE id = ? AND epoch = ?`` plus the legal
transition table). If the rows changed do not add up, or an insert collides,
the batch is rolled back and redone one caller at a time under savepoints, so
the caller at fault gets its error and the others still commit. That slow path
only runs when a stale worker or a bad request is in the batch.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from sqlq.common.engine.base import DurableStore
from sqlq.common.engine.datadir import open_private
from sqlq.common.engine.groupcommit import Pending
from sqlq.common.engine.sql import load_script
from sqlq.common.errors import (
    StoreClosedError,
    StoreError,
    StoreFailedError,
)
from sqlq.common.models import TRANSITIONS, Job, State
from sqlq.common.store import (
    Change,
    CompactionReport,
    JobQuery,
    Recovery,
    StoreStats,
    SyncLevel,
)
from sqlq.engines.listing import sqlite_params, sqlite_shape, sqlite_statements
from sqlq.engines.rows import row_job
from sqlq.engines.sqlite.batch import (
    STATEMENT_CACHE,
    Q,
    encode_rows,
    plan,
    prune,
    write_batch,
    write_one_by_one,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

DB_NAME = "sqlq.db"
LOCK_NAME = "sqlq.lock"
SCHEMA_VERSION = "2"
SCHEMA = load_script("sqlq.engines.sqlite", "schema.sql")
MIGRATE_V2 = load_script("sqlq.engines.sqlite", "migrate_v2.sql")
INDEXES = load_script("sqlq.engines.sqlite", "indexes.sql")
LIST_STATEMENTS = sqlite_statements(Q)

# Pragmas, by name (diskcache's DEFAULT_SETTINGS idea). WAL journal mode for
# both sync levels; only `synchronous` differs: FULL syncs the WAL at every
# commit (survives power loss), NORMAL leaves it to checkpoints (survives kill -9).
PRAGMAS: dict[str, str | int] = {
    "journal_mode": "wal",
    "busy_timeout": 5000,
    "temp_store": "memory",
    "wal_autocheckpoint": 1000,
    "cache_size": -65536,  # KiB
}
SYNC_PRAGMAS: dict[SyncLevel, dict[str, str | int]] = {
    "full": {"synchronous": "FULL"},
    "os": {"synchronous": "NORMAL"},
}


class SQLiteStore(DurableStore):
    name = "sqlite"
    lock_name = LOCK_NAME

    def __init__(self, data_dir: str | os.PathLike[str], **options: Any) -> None:
        super().__init__(data_dir, **options)
        self.path = os.path.join(self.dir, DB_NAME)
        self._db: sqlite3.Connection | None = None
        self.commits = 0
        self.rows = 0
        self.slow_batches = 0
        self.compactions = 0

    @property
    def pragmas(self) -> dict[str, str | int]:
        return {**PRAGMAS, **SYNC_PRAGMAS[self.sync]}

    async def _recover(self) -> Recovery:
        t0 = time.perf_counter()
        try:
            jobs = await self._on_io(self._open_db)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot open: {exc.strerror or exc}") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open: {exc}") from exc
        paused = await self._on_db(lambda db: [r[0] for r in db.execute(Q["paused_queues"])])
        return Recovery(
            jobs=jobs,
            running=[j.id for j in jobs if j.state is State.RUNNING],
            records=len(jobs),
            seconds=time.perf_counter() - t0,
            paused_queues=paused,
        )

    def _open_db(self) -> list[Job]:
        """On the I/O thread: create 0600, connect, set pragmas and schema, read live jobs."""
        # Create the database 0600 ourselves (SQLite would use the umask, 0644);
        # SQLite gives its -wal and -shm files the database file's mode. Existing ones
        # (a crash leaves them) are tightened too, before SQLite opens them: closing a
        # descriptor of a file SQLite has open would drop its POSIX locks.
        os.close(open_private(self.path, os.O_RDWR | os.O_CREAT))
        for suffix in ("-wal", "-shm"):
            if os.path.lexists(self.path + suffix):
                os.close(open_private(self.path + suffix, os.O_RDONLY))
        # Batch statements differ by row count; keep them all prepared.
        db = sqlite3.connect(
            self.path,
            isolation_level=None,
            cached_statements=STATEMENT_CACHE,
            check_same_thread=False,  # it is only ever used on this engine's I/O thread
        )
        self._db = db
        for key, value in self.pragmas.items():
            db.execute(f"PRAGMA {key} = {value}")
        db.executescript(SCHEMA)
        if "queue" not in {r[0] for r in db.execute(Q["table_columns"])}:
            db.executescript(MIGRATE_V2)  # a version-1 database: add the new columns
        db.executescript(INDEXES)
        db.execute("BEGIN IMMEDIATE")
        db.execute(Q["clear_transitions"])
        db.executemany(
            Q["insert_transition"],
            [(a.value, b.value) for a, nxt in TRANSITIONS.items() for b in nxt],
        )
        db.execute(Q["set_meta"], ("schema_version", SCHEMA_VERSION))
        db.execute("COMMIT")
        # In slices, not fetchall: a million row tuples alive at once left their freed
        # memory as holes the process kept (RSS per job after a restart ~1.2 KB).
        jobs: list[Job] = []
        cursor = db.execute(Q["live_jobs"])
        while rows := cursor.fetchmany(10_000):
            jobs.extend(row_job(r) for r in rows)
        return jobs

    async def _release(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            await self._on_io(db.close)

    async def _on_db(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(db)`` on the I/O thread: one hop for a whole batch."""
        db = self._db
        if db is None:
            raise StoreClosedError("sqlite store is not open")
        return await self._on_io(fn, db)

    # -- commits -----------------------------------------------------------------------

    def _encode(self, changes: Sequence[Change]) -> list[tuple[Any, ...]]:
        return encode_rows(changes)

    async def _flush(self, batch: list[Pending]) -> list[BaseException | None]:
        inserts: list[tuple[Any, ...]] = []
        updates: list[tuple[Any, ...]] = []
        for pending in batch:
            for change, row in zip(pending.changes, pending.encoded, strict=True):
                (inserts if isinstance(change, Job) else updates).append(row)
        statements = plan(inserts, updates)  # here: Python work off the I/O thread
        try:
            ok = await self._on_db(lambda db: self._durably(write_batch(db, statements)))
            if ok:
                outcomes: list[BaseException | None] = [None] * len(batch)
            else:
                self.slow_batches += 1
                changes = [list(p.changes) for p in batch]
                outcomes = await self._on_db(
                    lambda db: self._durably(write_one_by_one(db, changes))
                )
        except sqlite3.Error as exc:
            # The failure is shown in /stats and on the dashboard: the base name there.
            logger.error("sqlite: writing %s failed: %s", self.path, exc)
            raise StoreFailedError(f"{DB_NAME}: {exc}") from exc
        self.commits += 1
        self.rows += len(inserts) + len(updates)
        return outcomes

    def _durably(self, result: T) -> T:
        """On the I/O thread, after a COMMIT: at ``full`` that COMMIT synced the WAL."""
        if self.sync == "full":
            self._synced()
        return result

    async def get(self, job_id: str) -> Job | None:
        self._live()
        jobs = await self._select(Q["get_job"], (job_id,))
        return jobs[0] if jobs else None

    async def set_queue_paused(self, queue: str, paused: bool) -> None:
        self._writable()

        def write(db: sqlite3.Connection) -> None:
            db.execute(Q["set_queue_paused"], (queue, int(paused)))  # autocommit: one statement

        try:
            await self._on_db(write)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from exc

    async def list_jobs(self, query: JobQuery) -> list[Job]:
        self._live()
        sql = LIST_STATEMENTS[sqlite_shape(query)]
        return await self._select(sql, sqlite_params(query))

    async def find_key(self, key: str) -> Job | None:
        self._live()
        rows = await self._select(Q["find_key"], (key,))
        return rows[0] if rows else None

    async def _select(self, sql: str, params: tuple[Any, ...] | dict[str, Any]) -> list[Job]:
        """The jobs ``sql`` selects, decoded on the I/O thread as recovery decodes them:
        off the event loop, and on that thread's shallow stack, not a request's."""
        try:
            return await self._on_db(lambda db: [row_job(r) for r in db.execute(sql, params)])
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from exc

    async def compact(self) -> CompactionReport:
        """Delete terminal jobs past retention and truncate the WAL file."""
        self._writable()
        t0, began = time.perf_counter(), self.clock.time()
        before = self._disk_bytes()
        cutoff = self.clock.time() - self.retention
        try:
            pruned, kept = await self._on_db(lambda db: prune(db, cutoff))
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: compaction failed: {exc}") from exc
        self.compactions += 1
        report = CompactionReport(
            bytes_before=before,
            bytes_after=self._disk_bytes(),
            jobs_kept=kept,
            jobs_pruned=pruned,
            seconds=time.perf_counter() - t0,
        )
        self._last_compaction = (began, report)
        return report

    def _disk_bytes(self) -> int:
        total = 0
        for suffix in ("", "-wal"):
            try:
                total += os.path.getsize(self.path + suffix)
            except FileNotFoundError:
                pass
        return total

    _last_compaction: tuple[float, CompactionReport] | None = None

    def stats(self) -> StoreStats:
        stats = super().stats()
        stats.disk_bytes = stats.detail["disk_bytes"]  # one look at the files per call
        stats.last_compaction = self._last_compaction
        return stats

    def _detail(self) -> dict[str, Any]:
        return {
            "commits": self.commits,
            "rows_written": self.rows,
            "slow_batches": self.slow_batches,
            "disk_bytes": self._disk_bytes(),
            "compactions": self.compactions,
        }


__all__ = ["SQLiteStore"]
