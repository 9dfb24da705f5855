"""``SQLiteStore``: the JobStore on one SQLite table in WAL journal mode.

One aiosqlite connection (aiosqlite runs it on one thread). The writer task
makes a batch of commits one transaction: ``BEGIN IMMEDIATE``, one
``executemany`` for the inserts, one for the guarded updates, ``COMMIT``: four
thread hops per batch however large it is, never one per row.

Every update is fenced in SQL (``WHERE id = ? AND epoch = ?`` plus the legal
transition table). If the rows changed do not add up, or an insert collides,
the batch is rolled back and redone one caller at a time under savepoints, so
the caller at fault gets its error and the others still commit. That slow path
only runs when a stale worker or a bad request is in the batch.
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
import msgspec

from common.clock import SYSTEM_CLOCK, Clock
from common.errors import (
    DuplicateJobError,
    IllegalTransitionError,
    JobNotFoundError,
    SqlqError,
    StoreClosedError,
    StoreError,
    StoreFailedError,
)
from common.groupcommit import GroupCommitter, Pending
from common.lockfile import DirLock
from common.models import TRANSITIONS, Job, State, Transition
from common.store import Change, CompactionReport, Recovery, SyncLevel
from sqlq.sql import load_queries, load_script

logger = logging.getLogger(__name__)

DB_NAME = "sqlq.db"
LOCK_NAME = "sqlq.lock"
SCHEMA_VERSION = "1"
Q = load_queries("queries.sql")
SCHEMA = load_script("schema.sql")

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


def _job_row(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "kind": job.kind,
        "args": msgspec.json.encode(job.args).decode(),
        "state": job.state.value,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "ready_at": job.ready_at,
        "priority": job.priority,
        "epoch": job.epoch,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "last_error": job.last_error,
        "result": msgspec.json.encode(job.result).decode(),
    }


def _transition_row(t: Transition) -> dict[str, Any]:
    return {
        "id": t.job_id,
        "expect_epoch": t.expect_epoch,
        "state": t.state.value,
        "epoch": t.epoch,
        "attempts": t.attempts,
        "ready_at": t.ready_at,
        "updated_at": t.updated_at,
        "last_error": t.last_error,
        "result": msgspec.json.encode(t.result).decode(),
    }


def _row_job(row: sqlite3.Row | tuple[Any, ...]) -> Job:
    return Job(
        id=row[0],
        kind=row[1],
        args=msgspec.json.decode(row[2]),
        state=State(row[3]),
        attempts=row[4],
        max_attempts=row[5],
        ready_at=row[6],
        priority=row[7],
        epoch=row[8],
        created_at=row[9],
        updated_at=row[10],
        last_error=row[11],
        result=None if row[12] is None else msgspec.json.decode(row[12]),
    )


class SQLiteStore:
    name = "sqlite"
    durable = True

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        sync: SyncLevel = "full",
        retention: float = 3600.0,
        clock: Clock = SYSTEM_CLOCK,
        group_commit: bool = True,
        sync_delay_s: float = 0.0,
    ) -> None:
        self.sync: SyncLevel = sync
        self.dir = os.fspath(data_dir)
        self.path = os.path.join(self.dir, DB_NAME)
        self._retention = retention
        self._clock = clock
        self._group = group_commit
        self._sync_delay = sync_delay_s  # emulated disk latency, benchmark only
        self._lock = DirLock(self.dir, LOCK_NAME)
        self._conn: aiosqlite.Connection | None = None
        # Held from BEGIN to COMMIT so a read on the shared connection never sees
        # an uncommitted batch.
        self._tx = asyncio.Lock()
        self._committer: GroupCommitter | None = None
        self._opened = False
        self.commits = 0
        self.rows = 0
        self.slow_batches = 0
        self.compactions = 0

    @property
    def pragmas(self) -> dict[str, str | int]:
        return {**PRAGMAS, **SYNC_PRAGMAS[self.sync]}

    async def open(self) -> Recovery:
        if self._opened:
            raise StoreError("sqlite store was already opened")
        self._opened = True
        os.makedirs(self.dir, exist_ok=True)
        self._lock.acquire()
        t0 = time.perf_counter()
        try:
            conn = await aiosqlite.connect(self.path, isolation_level=None)
            self._conn = conn
            for key, value in self.pragmas.items():
                await conn.execute(f"PRAGMA {key} = {value}")
            await conn.executescript(SCHEMA)
            await conn.execute("BEGIN IMMEDIATE")
            await conn.execute(Q["clear_transitions"])
            await conn.executemany(
                Q["insert_transition"],
                [(a.value, b.value) for a, nxt in TRANSITIONS.items() for b in nxt],
            )
            await conn.execute(Q["set_meta"], ("schema_version", SCHEMA_VERSION))
            await conn.execute("COMMIT")
            rows = await conn.execute_fetchall(Q["live_jobs"])
            jobs = [_row_job(r) for r in rows]
        except sqlite3.Error as exc:
            await self._abort_open()
            raise StoreError(f"{self.path}: cannot open: {exc}") from exc
        except BaseException:
            await self._abort_open()
            raise
        self._committer = GroupCommitter(self._flush, name="sqlite", group=self._group)
        self._committer.start()
        return Recovery(
            jobs=jobs,
            running=[j.id for j in jobs if j.state is State.RUNNING],
            records=len(jobs),
            seconds=time.perf_counter() - t0,
        )

    async def _abort_open(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
        self._lock.release()

    # -- commits -----------------------------------------------------------------------

    async def commit(self, changes: Sequence[Change]) -> None:
        if not changes:
            return
        if self._committer is None:
            raise StoreClosedError("sqlite store is not open")
        await self._committer.submit(changes)

    async def _flush(self, batch: list[Pending]) -> list[BaseException | None]:
        conn = self._conn
        assert conn is not None
        inserts: list[dict[str, Any]] = []
        updates: list[dict[str, Any]] = []
        for pending in batch:
            for change in pending.changes:
                if isinstance(change, Job):
                    inserts.append(_job_row(change))
                else:
                    updates.append(_transition_row(change))
        async with self._tx:
            try:
                await conn.execute("BEGIN IMMEDIATE")
                ok = True
                try:
                    if inserts:
                        await conn.executemany(Q["insert_job"], inserts)
                    if updates:
                        cur = await conn.executemany(Q["apply_transition"], updates)
                        ok = cur.rowcount == len(updates)
                except sqlite3.IntegrityError:
                    ok = False
                if ok:
                    await conn.execute("COMMIT")
                    outcomes: list[BaseException | None] = [None] * len(batch)
                else:
                    await conn.execute("ROLLBACK")
                    outcomes = await self._flush_slow(conn, batch)
            except sqlite3.Error as exc:
                raise StoreFailedError(f"{self.path}: {exc}") from exc
            if self._sync_delay:
                await asyncio.sleep(self._sync_delay)
        self.commits += 1
        self.rows += len(inserts) + len(updates)
        return outcomes

    async def _flush_slow(
        self, conn: aiosqlite.Connection, batch: list[Pending]
    ) -> list[BaseException | None]:
        """One transaction, one savepoint per caller: the guilty caller rolls back alone."""
        self.slow_batches += 1
        outcomes: list[BaseException | None] = []
        await conn.execute("BEGIN IMMEDIATE")
        for pending in batch:
            await conn.execute("SAVEPOINT caller")
            try:
                for change in pending.changes:
                    await self._apply_one(conn, change)
            except SqlqError as exc:
                await conn.execute("ROLLBACK TO caller")
                outcomes.append(exc)
            else:
                outcomes.append(None)
            await conn.execute("RELEASE caller")
        await conn.execute("COMMIT")
        return outcomes

    async def _apply_one(self, conn: aiosqlite.Connection, change: Change) -> None:
        if isinstance(change, Job):
            try:
                await conn.execute(Q["insert_job"], _job_row(change))
            except sqlite3.IntegrityError:
                raise DuplicateJobError(change.id) from None
            return
        cur = await conn.execute(Q["apply_transition"], _transition_row(change))
        if cur.rowcount == 1:
            return
        rows = list(await conn.execute_fetchall(Q["get_job"], (change.job_id,)))
        if not rows:
            raise JobNotFoundError(change.job_id)
        current = _row_job(rows[0])
        current.check(change)  # raises the precise TransitionError
        raise IllegalTransitionError(change.job_id, "refused by the database guard")

    async def get(self, job_id: str) -> Job | None:
        conn = self._conn
        if conn is None or self._committer is None:
            raise StoreClosedError("sqlite store is not open")
        async with self._tx:
            try:
                rows = list(await conn.execute_fetchall(Q["get_job"], (job_id,)))
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: {exc}") from exc
        return _row_job(rows[0]) if rows else None

    async def compact(self) -> CompactionReport:
        """Delete terminal jobs past retention and truncate the WAL file."""
        conn = self._conn
        if conn is None or self._committer is None:
            raise StoreClosedError("sqlite store is not open")
        t0 = time.perf_counter()
        before = self._disk_bytes()
        async with self._tx:
            try:
                await conn.execute("BEGIN IMMEDIATE")
                cur = await conn.execute(
                    Q["prune_terminal"], (self._clock.time() - self._retention,)
                )
                pruned = cur.rowcount
                await conn.execute("COMMIT")
                await conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                rows = list(await conn.execute_fetchall(Q["count_jobs"]))
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: compaction failed: {exc}") from exc
        self.compactions += 1
        return CompactionReport(
            bytes_before=before,
            bytes_after=self._disk_bytes(),
            jobs_kept=int(rows[0][0]),
            jobs_pruned=pruned,
            seconds=time.perf_counter() - t0,
        )

    def _disk_bytes(self) -> int:
        total = 0
        for suffix in ("", "-wal"):
            try:
                total += os.path.getsize(self.path + suffix)
            except FileNotFoundError:
                pass
        return total

    async def close(self) -> None:
        if self._committer is not None:
            await self._committer.close()
            self._committer = None
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
        self._lock.release()

    def stats(self) -> dict[str, Any]:
        committer = self._committer.stats() if self._committer else {}
        return {
            "engine": self.name,
            "sync": self.sync,
            "group_commit": self._group,
            "emulated_sync_delay_ms": self._sync_delay * 1000,
            **committer,
            "commits": self.commits,
            "rows_written": self.rows,
            "slow_batches": self.slow_batches,
            "disk_bytes": self._disk_bytes(),
            "compactions": self.compactions,
        }


__all__ = ["SQLiteStore"]
