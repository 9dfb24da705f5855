"""SQLite-only behaviour of schedules: a batch without a schedule change is still one
statement, a tick is one transaction in the callers' order, a database made before the
schedules table gains it at open, and a schedule's jobs are listed on the key index.
The contract suite (test_store_contract_schedules.py) checks what the changes do."""

from __future__ import annotations

import asyncio
import sqlite3
from itertools import product
from pathlib import Path
from typing import Any

import aiosqlite
import pytest

from sqlq.common.errors import OverlapError
from sqlq.common.models import Job, State
from sqlq.common.schedule import (
    AdvanceSchedule,
    PutSchedule,
    Schedule,
)
from sqlq.common.store import JobQuery
from sqlq.engines.sqlite.batch import on_thread
from sqlq.engines.sqlite.store import SQLiteStore
from tests.helpers import NOW
from tests.schedule_records import CREATED, advance, record, tick_job


def tick(s: Schedule, at: int, idle: str | None = None) -> tuple[AdvanceSchedule, Job]:
    job = tick_job(s.name, at)
    return advance(s, at, job, idle), job


def connection(store: SQLiteStore) -> aiosqlite.Connection:
    db = store._db
    assert isinstance(db, aiosqlite.Connection)
    return db


async def spy(db: aiosqlite.Connection, calls: list[str] | None) -> None:
    """Record the first word of every statement the connection runs (or stop, with
    None): sqlite3's trace, set on the connection's own thread."""
    record = None if calls is None else (lambda sql: calls.append(sql.split()[0]))
    await on_thread(db, lambda conn: conn.set_trace_callback(record))


async def test_a_batch_without_a_schedule_change_is_still_set_wise(
    tmp_path: Path,
) -> None:
    """With schedules in the store and ticks committed beside it, every batch that holds
    none is its INSERT and its UPDATE, at most, in one transaction: the schedules cost it
    nothing."""
    seen: list[str] = []
    store = SQLiteStore(tmp_path)
    await store.open()
    try:
        s = record()
        await store.commit([PutSchedule(schedule=s, expect_version=0)])
        move, first = tick(s, CREATED + 60)
        await store.commit([move, first])
        jobs = [Job.new(kind="noop", args={}, now=NOW) for _ in range(30)]
        await store.commit(jobs)
        await spy(connection(store), seen)
        before = store.stats().batches
        starts = [j.start(NOW + 1) for j in jobs]
        more = [Job.new(kind="noop", args={}, now=NOW) for _ in range(30)]
        await asyncio.gather(
            *(store.commit([t]) for t in starts), *(store.commit([j]) for j in more)
        )
        batches = store.stats().batches - before
        await spy(connection(store), None)
    finally:
        await store.close()
    assert seen.count("BEGIN") <= batches
    assert set(seen) <= {"BEGIN", "INSERT", "UPDATE", "COMMIT"}
    assert seen.count("INSERT") + seen.count("UPDATE") >= batches
    assert batches < len(starts) + len(more)  # the callers shared batches
    assert store.slow_batches == 0


async def test_a_tick_is_one_transaction_of_its_statements_in_order(
    tmp_path: Path,
) -> None:
    """A tick (the advance, then its job) is BEGIN, the guarded UPDATE, the job's row and
    COMMIT: one hop, paid once a tick, and no slow path when nothing is refused."""
    seen: list[str] = []
    store = SQLiteStore(tmp_path)
    await store.open()
    try:
        s = record()
        await store.commit([PutSchedule(schedule=s, expect_version=0)])
        move, job = tick(s, CREATED + 60)
        await spy(connection(store), seen)
        await store.commit([move, job])
        await spy(connection(store), None)
        got = await store.get_schedule(s.name)
        assert got is not None
        assert (got.cursor, got.last_job) == (CREATED + 60, job.id)
        assert await store.get(job.id) == job
    finally:
        await store.close()
    assert seen == ["BEGIN", "UPDATE", "INSERT", "COMMIT"]
    assert store.slow_batches == 0


async def test_changes_of_one_call_apply_in_order_across_the_two_kinds(tmp_path: Path) -> None:
    """A put and an advance in one call (the advance sees the put), and a job inserted
    before an advance that names it idle (it is live: refused, and nothing of the call
    stays, the job's row included)."""
    store = SQLiteStore(tmp_path)
    await store.open()
    try:
        s = record(overlap="skip")
        move, job = tick(s, CREATED + 60)
        await store.commit([PutSchedule(schedule=s, expect_version=0), move, job])
        got = await store.get_schedule(s.name)
        assert got is not None
        assert got.last_job == job.id
        other = Job.new(kind="noop", args={}, now=NOW)
        move2, job2 = tick(got, CREATED + 120, idle=other.id)
        with pytest.raises(OverlapError):
            await store.commit([other, move2, job2])
        assert await store.get(other.id) is None
        assert await store.get(job2.id) is None
        assert await store.get_schedule(s.name) == got
        assert store.slow_batches == 1
    finally:
        await store.close()


async def test_a_database_made_before_schedules_gains_the_table_at_open(tmp_path: Path) -> None:
    """A version-2 database (today's schema without the schedules table, as the engine
    wrote it before) opens with its jobs, gains the table, and says the latest version."""
    store = SQLiteStore(tmp_path)
    await store.open()
    job = Job.new(kind="noop", args={}, now=NOW)
    await store.commit([job])
    await store.close()
    with sqlite3.connect(tmp_path / "sqlq.db") as db:
        db.execute("DROP TABLE schedules")
        db.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    db.close()
    again = SQLiteStore(tmp_path)
    recovery = await again.open()
    try:
        assert recovery.jobs == [job]
        assert await again.list_schedules() == []
        await again.commit([PutSchedule(schedule=record(), expect_version=0)])
        assert await again.get_schedule("nightly") == record()
    finally:
        await again.close()
    with sqlite3.connect(tmp_path / "sqlq.db") as db:
        version = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        spec = db.execute("SELECT json_extract(spec, '$.every_s') FROM schedules").fetchone()
    db.close()
    assert version == ("8",)
    assert "schedules" in tables
    assert spec == (60,)  # plain JSON, readable with plain SQL


async def test_every_schedule_listing_shape_plans_on_the_key_index(tmp_path: Path) -> None:
    """Among many live jobs (which would draw a state filter onto jobs_live) and many
    without a key, every shape of a schedule's listing runs on jobs_key's range."""
    store = SQLiteStore(tmp_path)
    await store.open()
    seen: list[tuple[str, Any]] = []
    real = store._select

    async def record_select(sql: str, params: Any) -> list[Job]:
        seen.append((sql, params))
        return await real(sql, params)

    try:
        s = record("a")
        await store.commit([PutSchedule(schedule=s, expect_version=0)])
        move, job = tick(s, CREATED + 60)
        await store.commit([move, job])
        await store.commit([Job.new(kind="noop", args={}, now=NOW) for _ in range(2000)])
        store._select = record_select  # type: ignore[method-assign]
        plans = {}
        for state, kind, queue, after in product(
            (None, *State), (None, "noop"), (None, "default"), (None, "0" * 32)
        ):
            seen.clear()
            query = JobQuery(schedule="a", state=state, kind=kind, queue=queue, after=after)
            listed = await store.list_jobs(query)
            assert listed == ([job] if query.matches(job) else [])
            (sql, params) = seen[0]
            with sqlite3.connect(tmp_path / "sqlq.db") as db:
                rows = db.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
            db.close()
            plans[str(query)] = " / ".join(r[3] for r in rows)
    finally:
        await store.close()
    assert {q: p for q, p in plans.items() if "USING INDEX jobs_key" not in p} == {}
