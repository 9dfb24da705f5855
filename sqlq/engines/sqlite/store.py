"""``SQLiteStore``: the JobStore on one SQLite table in WAL journal mode.

One ``aiosqlite`` connection, used through its public API only: aiosqlite runs the
``sqlite3`` connection on a thread of its own and hands it each call in order, so
every statement runs on that one thread and the event loop never blocks on one.
The writer task makes a batch of commits one statement: an INSERT of every change
into the TEMP view ``batch_changes``, whose triggers apply each (batch.py). One
statement is one hop to the connection's thread and one implicit transaction, so a
batch costs one hop whatever its size, where BEGIN, a statement per table and COMMIT
cost four (measured: twice the CPU per small batch).

Every update is fenced in SQL (``id`` and ``epoch`` plus the legal transition
table). If a guard refuses a move, or an insert collides, the statement undoes
itself and the batch is redone one caller at a time under savepoints, so the caller
at fault gets its error and the others still commit. That slow path only runs when
a stale worker or a bad request is in the batch.

Schedules are a table of their own, changed by guarded statements in the same
transaction as the jobs of the same call (schedules.py): a batch that holds a
schedule change is written as ``steps``, every other batch as the one statement.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections.abc import Sequence
from typing import Any

import aiosqlite

from sqlq.common.engine.base import DurableStore
from sqlq.common.engine.cascade import tell
from sqlq.common.engine.datadir import open_private
from sqlq.common.engine.groupcommit import Pending
from sqlq.common.engine.trim import release_freed
from sqlq.common.errors import (
    StoreClosedError,
    StoreError,
    StoreFailedError,
)
from sqlq.common.fair import Policy, encode_policy, stored_policies
from sqlq.common.models import Job, State
from sqlq.common.schedule import Schedule
from sqlq.common.store import (
    Cascaded,
    CompactionReport,
    JobQuery,
    Recovery,
    StoreStats,
    SyncLevel,
)
from sqlq.common.tokens import KEY_BYTES
from sqlq.engines.listing import sqlite_params, sqlite_shape, sqlite_statements
from sqlq.engines.sqlite.batch import (
    STATEMENT_CACHE,
    Members,
    Steps,
    decode_row,
    encode_rows,
    fetch_jobs,
    on_thread,
    one_by_one,
    plan,
    prune,
    steps,
    write_batch,
)
from sqlq.engines.sqlite.flows import IDS_PER_STATEMENT, Flows
from sqlq.engines.sqlite.migrate import SCHEMA_VERSION, prepare
from sqlq.engines.sqlite.queries import Q
from sqlq.engines.sqlite.schedules import schedule_listing, select_schedules

logger = logging.getLogger(__name__)

# sqlite3 binds an exact int, float, str or bytearray at once; any other value, None and
# a bool among them, goes through its adapter protocol, whose miss on the protocol's type
# formats an AttributeError message and throws it away (``type_getattro``: 96k of a
# SQLite no-op job's 1.08M instructions, callgrind, for its rows' ~30 NULLs). Found in
# the registry instead, the same values bind the same way: None as NULL (``{}.get``, a C
# function that gives None for any key), a bool as the integer sqlite3 binds it as.
_NULL: dict[None, None] = {}
sqlite3.register_adapter(type(None), _NULL.get)
sqlite3.register_adapter(bool, int)

DB_NAME = "sqlq.db"
SIGNING_KEY = "signing_key"  # its row's name in the secrets table
LOCK_NAME = "sqlq.lock"
LIST_STATEMENTS = sqlite_statements(Q)

# Pragmas, by name (diskcache's DEFAULT_SETTINGS idea). WAL journal mode for
# both sync levels; only `synchronous` differs: FULL syncs the WAL at every
# commit (survives power loss), NORMAL leaves it to checkpoints (survives kill -9).
PRAGMAS: dict[str, str | int] = {
    "journal_mode": "wal",
    "busy_timeout": 5000,
    "temp_store": "memory",
    "wal_autocheckpoint": 1000,
    # KiB. The commits touch few pages (the right edges of the b-trees, the rows of jobs
    # just made); a reading page cache of 64 MiB, as before, filled up behind a million
    # queued jobs and held ~67 bytes of RSS each (experiment K), for pages read once.
    "cache_size": -16384,
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
        self._db: aiosqlite.Connection | None = None
        # One connection, whose thread runs one statement at a time: but a batch is
        # several statements (BEGIN, rows, COMMIT), each its own hop, so without this
        # lock a read, a pause or a compaction would run inside another's transaction
        # (see uncommitted rows, be rolled back with it, or fail its BEGIN).
        self._turn = asyncio.Lock()
        self.commits = 0
        self.rows = 0
        self.slow_batches = 0
        self.compactions = 0
        self._key: bytes | None = None
        # Whether the database holds a workflow's member: until it does, a read looks for
        # no flow (every job's would miss), and no commit's path changes (flows.py).
        self._members = False

    @property
    def pragmas(self) -> dict[str, str | int]:
        return {**PRAGMAS, **SYNC_PRAGMAS[self.sync]}

    async def _recover(self) -> Recovery:
        t0 = time.perf_counter()
        try:
            await self._on_io(self._private_files)
            jobs = await self._open_db()
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot open: {exc.strerror or exc}") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open: {exc}") from exc
        conn = self._conn()
        paused = [r[0] for r in await conn.execute_fetchall(Q["paused_queues"])]
        policies = stored_policies([(r[0], r[1]) for r in await conn.execute_fetchall(
            Q["queue_policies"])])  # fmt: skip
        return Recovery(
            jobs=jobs,
            running=[j.id for j in jobs if j.state is State.RUNNING],
            records=len(jobs),
            seconds=time.perf_counter() - t0,
            paused_queues=paused,
            queue_policies=policies,
        )

    def _private_files(self) -> None:
        """On the engine's I/O thread, before SQLite opens anything: create the database
        0600 ourselves (SQLite would use the umask, 0644); SQLite gives its -wal and -shm
        files the database file's mode. Existing ones (a crash leaves them) are tightened
        too, before SQLite opens them: closing a descriptor of a file SQLite has open
        would drop its POSIX locks."""
        os.close(open_private(self.path, os.O_RDWR | os.O_CREAT))
        for suffix in ("-wal", "-shm"):
            if os.path.lexists(self.path + suffix):
                os.close(open_private(self.path + suffix, os.O_RDONLY))

    async def _open_db(self) -> list[Job]:
        """Connect, set pragmas and schema (migrate.py), read live jobs."""
        # Batch statements differ by row count; keep them all prepared.
        db = await aiosqlite.connect(
            self.path, isolation_level=None, cached_statements=STATEMENT_CACHE
        )
        self._db = db
        for key, value in self.pragmas.items():
            await db.execute(f"PRAGMA {key} = {value}")
        await prepare(db)  # schema, migrations, the batch view, the transition table
        # In slices, not fetchall: a million row tuples alive at once left their freed
        # memory as holes the process kept (RSS per job after a restart ~1.2 KB). Each
        # row is decoded as it is fetched, on the connection's thread (``decode_row``).
        jobs: list[Job] = []
        cursor = await db.execute(Q["live_jobs"])
        cursor.row_factory = decode_row  # type: ignore[assignment]  # typed as a type
        while rows := list(await cursor.fetchmany(10_000)):
            jobs.extend(rows)  # type: ignore[arg-type]  # Jobs, made by decode_row
        self._members = bool(next(iter(await db.execute_fetchall(Q["any_flow"])))[0])
        if self._members:  # the members that wait, and every live member's flow
            jobs.extend(await on_thread(db, fetch_jobs, Q["waiting_jobs"], (), False))
            jobs = await on_thread(db, lambda conn: Flows(conn).live(jobs))
        # Every page that read went through SQLite's page cache (up to ``cache_size``, 16
        # MiB): read once, kept for nothing, ~16 bytes of RSS per job at a million. Let it
        # go; the pages commits and reads touch come back as they are used.
        await db.execute("PRAGMA shrink_memory")
        release_freed()  # and the rows' values, made and dropped between the jobs kept
        return jobs

    async def _release(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            await db.close()

    def _conn(self) -> aiosqlite.Connection:
        """The open connection; ``StoreClosedError`` otherwise."""
        if self._db is None:
            raise StoreClosedError("sqlite store is not open")
        return self._db

    # -- commits -----------------------------------------------------------------------

    _encode = staticmethod(encode_rows)  # (itself, not a method around it: every commit)

    async def _flush(self, batch: list[Pending]) -> list[BaseException | None]:
        rows = [row for pending in batch for row in pending.encoded]
        # Here: Python work off the I/O thread. A schedule change is rare (a tick, a put), a
        # workflow's member rarer than a plain job: each makes the batch change by change.
        members = stepped = False
        for pending in batch:  # (one pass, not two ``any``: every batch)
            kind = type(pending.encoded)
            members = members or kind is Members
            stepped = stepped or kind is Steps
        cascaded: list[Cascaded] = []
        try:
            async with self._turn:
                db = self._conn()
                outcomes: list[BaseException | None] = [None] * len(batch)
                if members or not await write_batch(db, steps(rows) if stepped else plan(rows)):
                    self.slow_batches += not members
                    outcomes, cascaded = await on_thread(db, one_by_one, [p.changes for p in batch])
                    self._members = self._members or members
            await self._durably()
        except sqlite3.Error as exc:
            # The failure is shown in /stats and on the dashboard: the base name there.
            logger.error("sqlite: writing %s failed: %s", self.path, exc)
            raise StoreFailedError(f"{DB_NAME}: {exc}") from exc
        self.commits += 1
        self.rows += len(rows)
        if cascaded:
            self.rows += len(cascaded)
            tell(self._cascade, cascaded)
        return outcomes

    async def _durably(self) -> None:
        """After a COMMIT: at ``full`` that COMMIT synced the WAL. Any emulated sync delay
        (a benchmark knob) is paid on the engine's I/O thread, as walq pays it."""
        if self.sync != "full":
            return
        if self._sync_delay:
            await self._on_io(self._synced)
        else:
            self._synced()

    async def get(self, job_id: str) -> Job | None:
        self._live()
        jobs = await self._select(Q["get_job"], (job_id,))
        return jobs[0] if jobs else None

    async def get_many(self, ids: Sequence[str]) -> list[Job | None]:
        self._live()
        found: dict[str, Job] = {}
        for at in range(0, len(ids), IDS_PER_STATEMENT):
            chunk = ids[at : at + IDS_PER_STATEMENT]
            sql = Q["get_many"].replace("{ids}", ", ".join("?" * len(chunk)))
            found.update((j.id, j) for j in await self._select(sql, tuple(chunk)))
        return [found.get(i) for i in ids]

    async def set_queue_paused(self, queue: str, paused: bool) -> None:
        self._writable()

        try:  # autocommit: one statement, never inside a batch's transaction
            async with self._turn:
                await self._conn().execute(Q["set_queue_paused"], (queue, int(paused)))
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from exc

    async def set_queue_policy(self, queue: str, policy: Policy | None) -> None:
        self._writable()
        try:  # autocommit, as a pause
            async with self._turn:
                if policy is None:
                    await self._conn().execute(Q["drop_queue_policy"], (queue,))
                else:
                    await self._conn().execute(
                        Q["set_queue_policy"], (queue, encode_policy(policy))
                    )
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from exc

    async def signing_key(self) -> bytes:
        """A row of the secrets table, made at random by the first call on this database
        (INSERT OR IGNORE, then read back: what is there wins), then kept in memory. Its
        own autocommit statements, never inside a batch's transaction; never logged."""
        if self._key is not None:
            return self._key
        self._writable()  # a failed store makes nothing durable, a key neither
        try:
            async with self._turn:
                db = self._conn()
                await db.execute(Q["add_secret"], (SIGNING_KEY, os.urandom(KEY_BYTES)))
                rows = await db.execute_fetchall(Q["get_secret"], (SIGNING_KEY,))
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot read the signing key: {exc}") from exc
        key = bytes(next(iter(rows))[0])
        if len(key) != KEY_BYTES:
            raise StoreError(f"{self.path}: the stored signing key is not {KEY_BYTES} bytes")
        self._key = key
        return key

    async def list_jobs(self, query: JobQuery) -> list[Job]:
        self._live()
        if query.schedule is not None:
            return await self._select(*schedule_listing(query))
        sql = LIST_STATEMENTS[sqlite_shape(query)]
        return await self._select(sql, sqlite_params(query))

    async def list_schedules(self) -> list[Schedule]:
        return await self._schedules(Q["list_schedules"])

    async def get_schedule(self, name: str) -> Schedule | None:
        found = await self._schedules(Q["get_schedule"], (name,))
        return found[0] if found else None

    async def _schedules(self, sql: str, params: tuple[Any, ...] = ()) -> list[Schedule]:
        self._live()
        try:
            async with self._turn:  # never a batch's schedules before its COMMIT
                return await select_schedules(self._conn(), sql, params)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from exc

    async def find_key(self, key: str) -> Job | None:
        self._live()
        rows = await self._select(Q["find_key"], (key,))
        return rows[0] if rows else None

    async def _select(self, sql: str, params: tuple[Any, ...] | dict[str, Any]) -> list[Job]:
        """The jobs ``sql`` selects, each with its flow, decoded on the connection's thread
        as recovery decodes them: off the event loop, and on that thread's shallow stack,
        not a request's; one hop."""
        try:
            async with self._turn:  # never a batch's rows before its COMMIT
                return await on_thread(self._conn(), fetch_jobs, sql, params, self._members)
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from exc

    async def workflow(self, workflow_id: str) -> list[Job]:
        self._live()
        if not self._members:
            return []
        try:
            async with self._turn:
                return await on_thread(self._conn(), lambda c: Flows(c).workflow(workflow_id))
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: {exc}") from exc

    async def compact(self) -> CompactionReport:
        """Delete terminal jobs past retention and truncate the WAL file."""
        self._writable()
        t0, began = time.perf_counter(), self.clock.time()
        before = self._disk_bytes()
        cutoff = self.clock.time() - self.retention
        try:
            async with self._turn:
                pruned, kept = await prune(self._conn(), cutoff)
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


__all__ = ["SCHEMA_VERSION", "SQLiteStore"]
