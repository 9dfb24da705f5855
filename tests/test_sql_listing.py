"""The SQL engines' listings plan on an index for a filter that matches few.

Issue #19 item 6: a listing filter that matches few jobs read every retained job
(SQLite planned every filter on the primary key; PostgreSQL's generic plan, which a
prepared statement reaches after five runs, walked jobs_pkey). These tests read the
plan of the very statement ``list_jobs`` runs, with its arguments; the contract suite
checks the pages themselves.

Which shapes have an index: every shape that filters on a live state (scheduled,
running) or a retryable one (dead, cancelled), whatever else it filters on. Completed
jobs, and kind or queue on their own, have none: an index for them costs the write
path more than the listing saves (sqlq/sqlite/indexes.sql and the ``list`` statement
of sqlq/engines/postgres/queries.sql give the measurements); those scan.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from itertools import product
from pathlib import Path
from typing import Any

import pytest

from sqlq.common.models import LIVE, RETRYABLE, Job, State
from sqlq.common.store import Change, JobQuery, JobStore
from sqlq.engines.registry import make_store

NOW = 1_700_000_000.0
STATES = (None, *State)


async def _fill(store: JobStore, n: int = 3000) -> None:
    """Mostly completed no-op jobs in the default queue, as a busy queue retains."""
    jobs = [Job.new(kind="noop", args={}, now=NOW) for _ in range(n)]
    await store.commit(list(jobs))
    starts = [j.start(NOW) for j in jobs]
    await store.commit(list(starts))
    done: list[Change] = []
    for i, (j, s) in enumerate(zip(jobs, starts, strict=True)):
        ran = j.apply(s)
        done.append(ran.bury("boom", NOW) if i % 500 == 0 else ran.complete(None, NOW))
    await store.commit(done)


def _queries() -> list[JobQuery]:
    """Every shape an index serves (a live or retryable state, with or without kind,
    queue and a cursor, oldest or newest first), with values that match few or none."""
    out = []
    for state, kind, queue, after, descending in product(
        sorted(LIVE | RETRYABLE), (None, "nope"), (None, "nope"), (None, "0" * 32, "f" * 32),
        (False, True),
    ):  # fmt: skip
        out.append(
            JobQuery(
                state=state, kind=kind, queue=queue, after=after, limit=50, descending=descending
            )
        )
    return out


# -- SQLite ---------------------------------------------------------------------------


async def test_every_sqlite_listing_shape_plans_on_an_index(tmp_path: Path) -> None:
    store = make_store("sqlite", tmp_path)
    await store.open()
    seen: list[tuple[str, Any]] = []
    real = store._select  # type: ignore[attr-defined]

    async def spy(sql: str, params: Any) -> list[Job]:
        seen.append((sql, params))
        return list(await real(sql, params))

    try:
        await _fill(store)
        store._select = spy  # type: ignore[attr-defined]
        bad = {}
        for query in _queries():
            seen.clear()
            await store.list_jobs(query)
            (sql, params), db_path = seen[0], tmp_path / "sqlite" / "sqlq.db"
            db = sqlite3.connect(db_path)
            try:
                plan = " / ".join(r[3] for r in db.execute("EXPLAIN QUERY PLAN " + sql, params))
            finally:
                db.close()
            if "USING INDEX" not in plan and "USING COVERING INDEX" not in plan:
                bad[str(query)] = plan
        assert bad == {}
    finally:
        await store.close()


# -- PostgreSQL -------------------------------------------------------------------------


def _literal(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


async def test_every_postgres_listing_shape_plans_on_an_index(pg_db: str, tmp_path: Path) -> None:
    """The plan after six runs of the listing's statement on the listing's own
    connection, prepared as asyncpg prepares it (and reuses it: a generic plan may
    follow from the sixth run)."""
    store = make_store("postgres", tmp_path, dsn=pg_db)
    await store.open()
    real = store._read  # type: ignore[attr-defined]
    plans: list[str] = []

    class Recorder:
        async def fetch(self, sql: str, *args: object) -> list[Any]:
            self.sql, self.args = sql, args
            return []

    async def spy(fn: Callable[[Any], Awaitable[Any]], field: str = "query", **kw: Any) -> Any:
        rec = Recorder()
        await fn(rec)
        values = ", ".join(_literal(a) for a in rec.args)

        async def explain(conn: Any) -> list[Any]:
            # Under the default plan_cache_mode (auto), PostgreSQL takes the generic
            # plan whenever its estimate is no worse than the custom plans' (it did at
            # 200k jobs, not at this test's 3,000): so auto is tested as generic.
            auto = await conn.fetchval("SHOW plan_cache_mode") == "auto"
            if auto:
                await conn.execute("SET plan_cache_mode = force_generic_plan")
            await conn.execute(f"PREPARE listing AS {rec.sql}")
            try:
                for _ in range(6):
                    await conn.execute(f"EXECUTE listing({values})")
                rows = await conn.fetch(f"EXPLAIN EXECUTE listing({values})")
            finally:
                await conn.execute("DEALLOCATE listing")
                if auto:
                    await conn.execute("RESET plan_cache_mode")
            plans.append("\n".join(r[0] for r in rows))
            return []

        return await real(explain, field, **kw)

    try:
        await _fill(store)
        async with store._conn() as conn:  # type: ignore[attr-defined]
            await conn.execute("ANALYZE jobs")
        store._read = spy  # type: ignore[attr-defined]
        bad = {}
        for query in _queries():
            plans.clear()
            await store.list_jobs(query)
            plan = plans[0]
            if "Seq Scan" in plan or "jobs_pkey" in plan or "Index" not in plan:
                bad[str(query)] = plan
        assert bad == {}
    finally:
        await store.close()


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
async def test_a_listing_shape_pages_what_the_filter_matches(
    engine: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Every shape's statement keeps the cursor and the limit (the contract suite pages
    the filters; this pins the combined ones against JobQuery.matches)."""
    dsn = request.getfixturevalue("pg_db") if engine == "postgres" else None
    store = make_store(engine, tmp_path, dsn=dsn)
    await store.open()
    try:
        jobs = [
            Job.new(kind=k, args={}, now=NOW, queue=q)
            for k, q in product(("a", "b"), ("x", "y"))
            for _ in range(3)
        ]
        await store.commit(list(jobs))
        starts = [j.start(NOW) for j in jobs[::2]]
        await store.commit(list(starts))
        await store.commit(
            [j.apply(s).bury("no", NOW) for j, s in zip(jobs[::2], starts, strict=True)]
        )
        everything = sorted(
            (j for j in await store.list_jobs(JobQuery(limit=1000))), key=lambda j: j.id
        )
        for state, kind, queue, descending in product(
            STATES, (None, "a"), (None, "y"), (False, True)
        ):
            want = [
                j.id for j in everything if JobQuery(state=state, kind=kind, queue=queue).matches(j)
            ]
            if descending:
                want.reverse()
            got: list[str] = []
            after = None
            while page := await store.list_jobs(
                JobQuery(
                    state=state,
                    kind=kind,
                    queue=queue,
                    after=after,
                    limit=2,
                    descending=descending,
                )
            ):
                got += [j.id for j in page]
                after = page[-1].id
            assert got == want, (state, kind, queue, descending)
    finally:
        await store.close()
