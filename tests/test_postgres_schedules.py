"""Schedules in the PostgreSQL engine: what the contract suite cannot show on one store.

Two nodes racing for the same ticks, the migration from schema version 1, the plan of
a schedule's listing, and the per-caller path a call with a schedule change takes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import asyncpg
import msgspec
import pytest

from sqlq.common.errors import (
    DuplicateKeyError,
    OverlapError,
    StaleScheduleError,
    StoreUnavailableError,
    UnencodableError,
)
from sqlq.common.models import Job
from sqlq.common.schedule import AdvanceSchedule, DropSchedule, PutSchedule, key_range, tick_key
from sqlq.common.store import Fence, JobQuery
from sqlq.engines.listing import postgres_args, postgres_shape
from sqlq.engines.postgres import schedules
from sqlq.engines.postgres.connections import LIST_SETTINGS
from sqlq.engines.postgres.migrate import LATEST, migrate, migrations, version
from sqlq.engines.postgres.migrate import Q as MQ
from sqlq.engines.postgres.queries import SCHEDULE_LIST_STATEMENTS, SQ, Q
from sqlq.engines.postgres.store import PostgresStore
from sqlq.engines.rows import JOB_COLUMNS, job_values
from tests import shared_helpers
from tests.helpers import NOW
from tests.schedule_records import CREATED, MINUTE, advance, create, record, tick_job

stores = shared_helpers.stores  # the fixture, by its name
Stores = Callable[..., Any]
ROUNDS = 40


async def test_two_nodes_racing_for_every_tick_make_one_job_per_tick(stores: Stores) -> None:
    """Both nodes read the schedule, then commit the same tick at once (each through its
    own writer connection, so the statements really meet in PostgreSQL): one moves the
    cursor and inserts its job, the other hears StaleScheduleError and inserts nothing."""
    a, b = await stores(node="a"), await stores(node="b")
    await create(a, record())
    winners = {"a": 0, "b": 0}
    for i in range(1, ROUNDS + 1):
        seen_a, seen_b = await asyncio.gather(a.get_schedule("nightly"), b.get_schedule("nightly"))
        assert seen_a == seen_b
        assert seen_a is not None
        tick = CREATED + i * MINUTE
        jobs = {"a": tick_job("nightly", tick), "b": tick_job("nightly", tick)}
        outcomes = await asyncio.gather(
            *(s.commit([advance(seen_a, tick, jobs[n]), jobs[n]]) for n, s in (("a", a), ("b", b))),
            return_exceptions=True,
        )
        assert sorted(type(o).__name__ for o in outcomes) == ["NoneType", "StaleScheduleError"]
        won = "ab"[outcomes.index(None)]
        winners[won] += 1
        assert await b.get(jobs[won].id) == jobs[won]
        assert await a.get(jobs["ba"[outcomes.index(None)]].id) is None
    listed = await a.list_jobs(JobQuery(schedule="nightly", limit=1000))
    keys = sorted(j.idempotency_key or "" for j in listed)
    assert keys == sorted(tick_key("nightly", CREATED + i * MINUTE) for i in range(1, ROUNDS + 1))
    final = await b.get_schedule("nightly")
    assert final is not None
    assert final.cursor == CREATED + ROUNDS * MINUTE
    assert sum(winners.values()) == ROUNDS


async def test_two_nodes_committing_many_ticks_at_once_never_double_one(stores: Stores) -> None:
    """Each node commits every tick from its own cursor, all at once: whatever the
    interleaving, no tick gets two jobs and the cursor ends at a tick someone committed."""
    a, b = await stores(node="a"), await stores(node="b")
    s = await create(a, record())
    ticks = [CREATED + i * MINUTE for i in range(1, 11)]
    calls = []
    for store in (a, b):
        for tick in ticks:
            job = tick_job(s.name, tick)
            calls.append(store.commit([advance(s, tick, job), job]))
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert outcomes.count(None) == 1  # all advance from the one cursor: one applies
    assert all(isinstance(o, StaleScheduleError) for o in outcomes if o is not None)
    listed = await a.list_jobs(JobQuery(schedule=s.name))
    assert len(listed) == 1
    got = await a.get_schedule(s.name)
    assert got is not None
    assert got.last_job == listed[0].id
    assert tick_key(s.name, got.cursor) == listed[0].idempotency_key


async def test_calls_without_schedule_changes_keep_the_one_statement(stores: Stores) -> None:
    """A batch with a tick in it: the other calls are still one statement (no batch is
    redone one caller at a time), and a refused tick fails only its own caller."""
    store = await stores(group_commit=True)
    s = await create(store, record())
    plain = [Job.new(kind="noop", args={"i": i}, now=NOW) for i in range(4)]
    tick = tick_job(s.name, CREATED + MINUTE)
    stale = tick_job(s.name, CREATED + MINUTE)
    outcomes = await asyncio.gather(
        store.commit([advance(s, CREATED + MINUTE, tick), tick]),
        *(store.commit([j]) for j in plain),
        store.commit([advance(s, CREATED + MINUTE, stale), stale]),
        return_exceptions=True,
    )
    assert outcomes[:-1] == [None] * 5
    assert isinstance(outcomes[-1], StaleScheduleError)
    assert store.slow_batches == 0
    assert [await store.get(j.id) for j in plain] == plain
    assert await store.get(stale.id) is None


async def test_the_ticks_of_a_batch_are_one_statement_and_each_hears_its_own(
    stores: Stores,
) -> None:
    """Ticks of twenty schedules committed at once: one statement (one commit) for all
    of them, and each refusal (a stale cursor, a live idle job, no such schedule) goes
    to its own caller, whose job is not inserted, while the others' are."""
    store = await stores()
    made = [await create(store, record(f"s{n:02}", overlap="skip")) for n in range(20)]
    busy = tick_job("s01", CREATED)
    await store.commit([busy])
    calls, jobs = [], []
    for n, s in enumerate(made):
        job = tick_job(s.name, CREATED + MINUTE)
        jobs.append(job)
        if n == 0:
            change = advance(s, CREATED + MINUTE, job)
            change = msgspec.structs.replace(change, expect_cursor=CREATED - 1)  # stale
        elif n == 1:
            change = advance(s, CREATED + MINUTE, job, idle=busy.id)  # its last job is live
        elif n == 2:
            change = msgspec.structs.replace(advance(s, CREATED + MINUTE, job), name="gone")
        elif n == 3:
            change = advance(s, CREATED + MINUTE, job, idle="0" * 32)  # gone: not live
        else:
            change = advance(s, CREATED + MINUTE, job)
        calls.append([change, job])
    before = store.syncs
    outcomes = await asyncio.gather(*(store.commit(c) for c in calls), return_exceptions=True)
    assert store.syncs - before == 1
    refused = [StaleScheduleError, OverlapError, StaleScheduleError]
    assert [type(o) for o in outcomes[:3]] == refused
    assert "cursor" in str(outcomes[0])
    assert "does not exist" in str(outcomes[2])
    assert outcomes[3:] == [None] * 17
    got = [await store.get(j.id) for j in jobs]
    assert got == [None, None, None, *jobs[3:]]
    listed = await store.list_schedules()
    assert [x.cursor for x in listed] == [CREATED] * 3 + [CREATED + MINUTE] * 17
    assert [x.last_job for x in listed[3:]] == [j.id for j in jobs[3:]]


async def test_a_call_of_several_changes_applies_in_order_or_not_at_all(stores: Stores) -> None:
    store = await stores()
    created = record("multi")
    job = tick_job("multi", CREATED + MINUTE)
    await store.commit(
        [PutSchedule(schedule=created, expect_version=0), advance(created, CREATED + MINUTE, job),
         job]
    )  # fmt: skip
    got = await store.get_schedule("multi")
    assert got is not None
    assert (got.cursor, got.last_job) == (CREATED + MINUTE, job.id)
    # A put and a drop, then an advance from a cursor that is not there: all rolled back.
    wrong = AdvanceSchedule(
        name="other", expect_version=1, expect_cursor=CREATED + 1, cursor=CREATED + 9
    )
    with pytest.raises(StaleScheduleError, match="cursor"):
        await store.commit(
            [PutSchedule(schedule=record("other"), expect_version=0), DropSchedule(name="multi"),
             wrong]
        )  # fmt: skip
    assert await store.get_schedule("other") is None
    assert await store.get_schedule("multi") == got
    # The idle job is inserted earlier in the same call: it is live when the advance runs.
    first = tick_job("multi", CREATED + 2 * MINUTE)
    with pytest.raises(OverlapError):
        await store.commit([first, advance(got, CREATED + 2 * MINUTE, first, idle=first.id)])
    assert await store.get(first.id) is None


async def test_a_tick_of_two_jobs_one_colliding_names_the_key_and_applies_nothing(
    stores: Stores,
) -> None:
    store = await stores()
    s = await create(store, record())
    taken = Job.new(kind="noop", args={}, now=NOW, idempotency_key="taken")
    await store.commit([taken])
    ok, clash = tick_job(s.name, CREATED + MINUTE), msgspec.structs.replace(taken, id="c" * 32)
    with pytest.raises(DuplicateKeyError, match="taken"):
        await store.commit([advance(s, CREATED + MINUTE, ok), ok, clash])
    assert await store.get(ok.id) is None
    assert await store.get_schedule(s.name) == s
    with pytest.raises(DuplicateKeyError, match="taken"):  # one job: the statement names it
        await store.commit([advance(s, CREATED + MINUTE, clash), clash])
    assert await store.get_schedule(s.name) == s


async def test_fenced_commits_take_schedule_changes_and_bad_values_fail_their_caller(
    stores: Stores,
) -> None:
    """commit_fenced (the shared mode's outcomes) holds transitions to the fence; a
    schedule change in it is applied as in commit."""
    store = await stores()
    s = record()
    await store.commit_fenced([PutSchedule(schedule=s, expect_version=0)], Fence(holder="x"))
    job = tick_job(s.name, CREATED + MINUTE)
    await store.commit_fenced([advance(s, CREATED + MINUTE, job), job], Fence(holder="x"))
    assert (await store.get(job.id)) == job
    with pytest.raises(UnencodableError):
        await store.commit([PutSchedule(schedule=record("big", version=2**70), expect_version=0)])
    with pytest.raises(UnencodableError):  # a NUL PostgreSQL's text refuses
        await store.commit([PutSchedule(schedule=record("nul\x00"), expect_version=0)])
    assert [x.name for x in await store.list_schedules()] == ["nightly"]


async def test_a_connection_lost_midway_fails_only_the_calls_not_yet_committed(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other calls' statement committed before the tick's call lost the connection:
    they are durable and hear so; the tick's caller hears StoreUnavailableError."""
    store = await stores()
    s = await create(store, record())

    async def lost(*_: object) -> None:
        raise ConnectionResetError("the writer's connection went away")

    monkeypatch.setattr(schedules, "advance_all", lost)
    plain = Job.new(kind="noop", args={}, now=NOW)
    tick = tick_job(s.name, CREATED + MINUTE)
    outcomes = await asyncio.gather(
        store.commit([plain]),
        store.commit([advance(s, CREATED + MINUTE, tick), tick]),
        return_exceptions=True,
    )
    assert outcomes[0] is None
    assert isinstance(outcomes[1], StoreUnavailableError)
    monkeypatch.undo()
    assert await store.get(plain.id) == plain
    await store.commit([advance(s, CREATED + MINUTE, tick), tick])  # the writer reconnects
    assert await store.get(tick.id) == tick


# -- the migration ------------------------------------------------------------------------


async def _at_version_1(dsn: str) -> asyncpg.Connection:
    """A database as the previous sqlq left it: schema version 1, nothing of 2."""
    conn = await asyncpg.connect(dsn)
    await conn.execute(MQ["create_version"])
    await conn.execute(MQ["first_version"])
    await conn.execute(migrations()[0].sql)
    await conn.execute(MQ["set_version"], 1)
    return conn


async def test_a_version_1_database_migrates_forward_keeping_its_jobs(pg_dsn: str) -> None:
    conn = await _at_version_1(pg_dsn)
    try:
        # A locale collation on the key column, as a database created with one gives it:
        # ICU sorts ";" before ":", so a's key range, [sched:a:, sched:a;), is empty there.
        await conn.execute(
            'ALTER TABLE jobs ALTER COLUMN idempotency_key TYPE text COLLATE "en-x-icu"'
        )
        a, ab = (
            Job.new(kind="noop", args={}, now=NOW, idempotency_key=tick_key(name, 5))
            for name in ("a", "ab")
        )
        # As version 1's code wrote them: its columns only (write_batch now writes version
        # 3's too).
        old_columns = JOB_COLUMNS[: JOB_COLUMNS.index("attempts_total") + 1]
        await conn.executemany(
            f"INSERT INTO jobs ({', '.join(old_columns)})"
            f" VALUES ({', '.join(f'${n + 1}' for n in range(len(old_columns)))})",
            [job_values(j)[: len(old_columns)] for j in (a, ab)],
        )
        low, high = key_range("a")
        inside = "SELECT count(*) FROM jobs WHERE idempotency_key >= $1 AND idempotency_key < $2"
        assert await conn.fetchval(inside, low, high) == 0  # what the C collation mends
        assert await migrate(pg_dsn) == (1, LATEST)
        assert await version(conn) == LATEST
        assert await conn.fetchval(inside, low, high) == 1
        collation = await conn.fetchval(
            "SELECT collation_name FROM information_schema.columns"
            " WHERE table_name = 'jobs' AND column_name = 'idempotency_key'"
        )
        assert collation == "C"
    finally:
        await conn.close()
    store = PostgresStore(pg_dsn)
    await store.open()
    try:
        assert await store.find_key(tick_key("ab", 5)) == ab
        with pytest.raises(DuplicateKeyError):  # jobs_key is still the unique key index
            await store.commit(
                [Job.new(kind="noop", args={}, now=NOW, idempotency_key=ab.idempotency_key)]
            )
        assert await store.list_jobs(JobQuery(schedule="a")) == [a]
        assert await store.list_jobs(JobQuery(schedule="ab")) == [ab]
        s = await create(store, record())
        assert await store.list_schedules() == [s]
    finally:
        await store.close()


# -- the listing's plan -------------------------------------------------------------------


async def test_a_schedules_listing_is_planned_on_the_key_index(stores: Stores, pg_db: str) -> None:
    store = await stores()
    others = [
        Job.new(kind="noop", args={}, now=NOW, idempotency_key=f"k{i:05}" if i % 2 else None)
        for i in range(4000)
    ]
    for n in range(0, len(others), 500):
        await store.commit(others[n : n + 500])
    s = await create(store, record())
    for i in range(1, 4):
        now = await store.get_schedule(s.name)
        assert now is not None
        job = tick_job(s.name, CREATED + i * MINUTE)
        await store.commit([advance(now, CREATED + i * MINUTE, job), job])
    conn = await asyncpg.connect(pg_db, server_settings=LIST_SETTINGS)
    try:
        await conn.execute("ANALYZE jobs")
        for query in (
            JobQuery(schedule=s.name),
            JobQuery(schedule=s.name, state=None, kind="noop", after="0" * 32, limit=2),
        ):
            sql = SCHEDULE_LIST_STATEMENTS[postgres_shape(query)]
            args = [*postgres_args(query), *key_range(s.name)]
            plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + sql, *args))
            assert "jobs_key" in plan, plan
            assert "Seq Scan" not in plan, plan
            assert len(await conn.fetch(sql, *args)) == min(3, query.limit)
    finally:
        await conn.close()


def test_a_ticks_insert_casts_as_write_batch_does() -> None:
    """The advance statement's job columns are write_batch's, cast for cast."""

    def unnest(sql: str) -> str:
        at = sql.index("unnest(\n")
        return sql[at : sql.index("$18::int8[]", at)]

    assert unnest(SQ["advance"]) == unnest(Q["write_batch"])
