"""The PostgreSQL engine's rows and statements hold to one naming of the columns.

A job row's columns are named once (``sqlq.engines.rows.JOB_COLUMNS``), a guarded
transition's once (``MOVE_COLUMNS``); the rows, the statements' column lists and
their casts follow those names, never the table's physical order. SQL lives in the
``.sql`` files, and a refused change is named by the job model's own rule.
"""

from __future__ import annotations

import ast
import importlib
import re
from typing import Any

import asyncpg
import msgspec
import pytest

from sqlq.common.engine.groupcommit import GroupCommitter, Pending
from sqlq.common.errors import (
    IllegalTransitionError,
    JobNotFoundError,
    StaleEpochError,
    StoreUnavailableError,
    TransitionError,
)
from sqlq.common.models import Job, State
from sqlq.common.running import AttemptError, Progress
from sqlq.common.store import Change, Fence, Renewal
from sqlq.engines.postgres.queries import MOVE_COLUMNS, TABLE_COLUMNS, Q
from sqlq.engines.postgres.store import PostgresStore
from sqlq.engines.rows import JOB_COLUMNS, TRANSITION_COLUMNS, job_values, row_job
from tests.helpers import NOW, ROOT

PACKAGE = ROOT / "sqlq" / "engines" / "postgres"


def distinct_job() -> Job:
    """A job whose every field holds a value no other field does."""
    return Job(
        id="j1",
        kind="k",
        args={"a": 1},
        state=State.RUNNING,
        attempts=2,
        max_attempts=3,
        ready_at=4.5,
        priority=6,
        epoch=7,
        created_at=8.5,
        updated_at=9.5,
        last_error="e",
        result=[10],
        started_at=11.5,
        queue="q",
        idempotency_key="key",
        request_hash="hash",
        attempts_total=12,
        cancel_requested_at=13.5,
        progress=Progress(percent=14.0, message="m", at=15.5),
        checkpoint={"c": 16},
        snoozes=17,
        errors=(AttemptError(attempt=18, error="x", at=19.5),),
        holder="worker:h",
        lease_until=20.5,
        cancel_forced=True,
    )


def test_a_job_row_is_its_fields_in_the_named_column_order() -> None:
    job = distinct_job()
    by_name = dict(zip(JOB_COLUMNS, job_values(job), strict=True))
    encoded = {
        "args": '{"a":1}', "state": "running", "result": "[10]",
        "progress": '{"percent":14.0,"message":"m","at":15.5}', "checkpoint": '{"c":16}',
        "errors": '[{"attempt":18,"error":"x","at":19.5}]',
    }  # fmt: skip
    assert by_name == {c: encoded.get(c, getattr(job, c)) for c in JOB_COLUMNS}
    assert row_job(job_values(job)) == job
    assert MOVE_COLUMNS[: len(TRANSITION_COLUMNS) - 2] == (
        "id", "expect_epoch", "allowed", *TRANSITION_COLUMNS[2:-3],
    )  # fmt: skip
    # a move carries none of the three (the claim's, the renewals', a forced cancel's)
    assert TRANSITION_COLUMNS[-3:] == ("holder", "lease_until", "cancel_forced")
    assert MOVE_COLUMNS[len(TRANSITION_COLUMNS) - 2 :] == ("holder", "lease_from", "lease_before")
    assert TABLE_COLUMNS == tuple("node" if c == "holder" else c for c in JOB_COLUMNS)


def test_no_sql_is_inline_in_the_engines_python() -> None:
    """House rule: SQL in .sql files (they are read at import)."""
    statement = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|ALTER|DROP)\b", re.I)
    inline = [
        f"{path.name}:{node.lineno}"
        for path in sorted(PACKAGE.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and statement.match(node.value)
    ]
    assert inline == []


@pytest.mark.parametrize("sql", ["queries.sql", "migrate.sql", "schedules.sql"])
def test_the_sql_files_name_modules_that_exist(sql: str) -> None:
    """A header that names a module names one that is there (and holds what it says)."""
    names = re.findall(r"\bsqlq(?:\.\w+)+", (PACKAGE / sql).read_text())
    missing = []
    for name in names:
        module, attr = name, None
        while True:
            try:
                found: Any = importlib.import_module(module)
                break
            except ModuleNotFoundError:
                module, _, tail = module.rpartition(".")
                attr = tail if attr is None else f"{tail}.{attr}"
        for part in (attr or "").split(".") if attr else []:
            found = getattr(found, part, None)
        if found is None:
            missing.append(name)
    assert names
    assert missing == []


async def test_write_batch_casts_each_column_to_the_tables_type(pg_db: str) -> None:
    """write_batch's arrays are positional: each one's cast must be its column's type."""
    conn = await asyncpg.connect(pg_db)
    try:
        types = {
            r[0]: r[1]
            for r in await conn.fetch(
                "SELECT column_name, udt_name FROM information_schema.columns"
                " WHERE table_name = 'jobs'"
            )
        }
    finally:
        await conn.close()
    short = {"text": "text", "int8": "int8", "int4": "int4", "float8": "float8", "bool": "bool"}
    casts = re.findall(r"\$(\d+)::(\w+)\[\]", Q["write_batch"])
    assert [int(n) for n, _ in casts] == list(range(1, len(JOB_COLUMNS) + len(MOVE_COLUMNS) + 1))
    # a move's own columns take the type of the column they are compared with
    like = {"expect_epoch": "epoch", "holder": "node", "lease_from": "lease_until",
            "lease_before": "lease_until", "allowed": "state"}  # fmt: skip
    want = [types[c] for c in TABLE_COLUMNS] + [types[like.get(c, c)] for c in MOVE_COLUMNS]
    assert [short[t] for _, t in casts] == want


async def test_a_claim_reads_the_job_whatever_the_tables_physical_order(pg_db: str) -> None:
    """A column dropped and added again (a later migration might) moves to the table's end:
    a claim still returns the job it claimed, field for field."""
    conn = await asyncpg.connect(pg_db)
    try:
        await conn.execute("ALTER TABLE jobs DROP COLUMN priority")
        await conn.execute("ALTER TABLE jobs ADD COLUMN priority bigint NOT NULL DEFAULT 0")
        await conn.execute(
            "CREATE INDEX jobs_claim ON jobs (priority DESC, ready_at, id)"
            " WHERE state = 'scheduled'"
        )
    finally:
        await conn.close()
    store = PostgresStore(pg_db)
    await store.open()
    try:
        job = Job.new(kind="k", args={"x": 1}, now=NOW, priority=3, queue="q", max_attempts=4)
        await store.commit([job])
        [claimed] = await store.claim(1, NOW, NOW + 60, {})
        running = {"state": State.RUNNING, "epoch": 1, "attempts": 1, "started_at": NOW,
                   "holder": store.node, "lease_until": NOW + 60}  # fmt: skip
        assert claimed == msgspec.structs.replace(job, **running)  # a claim's new epoch
        assert await store.get(job.id) == claimed
    finally:
        await store.close()


async def test_renew_and_release_return_the_counts_they_changed(pg_db: str) -> None:
    """Counted by the statements (RETURNING), not read from a command tag."""
    store = PostgresStore(pg_db)
    await store.open()
    try:
        jobs = [Job.new(kind="k", args=i, now=NOW) for i in range(3)]
        await store.commit(jobs)
        held = await store.claim(3, NOW, NOW + 5, {})
        async with store._conn() as conn:
            renewed = await conn.fetchrow(
                Q["renew"], store.node, NOW + 1, NOW + 9, [j.id for j in held[:2]], [None] * 2
            )
        count, asked, ids = renewed
        assert (count, asked, sorted(ids)) == (2, [], sorted(j.id for j in held[:2]))
        assert await store.renew(NOW + 2, NOW + 9, [j.id for j in held]) == Renewal(3)
        assert await store.release(NOW + 3) == 3
        gone = await store.renew(NOW + 4, NOW + 9, [j.id for j in held])
        assert gone == Renewal(0, lost=frozenset(j.id for j in held))  # released: all lost
    finally:
        await store.close()


async def test_a_refused_change_is_named_by_the_models_rule_then_the_fence(pg_db: str) -> None:
    """The slow path names the guard: what ``Job.check`` says of the row as it is, then
    which part of the fence failed, with the model's own words."""
    store, other = PostgresStore(pg_db), PostgresStore(pg_db)
    await store.open()
    await other.open()
    try:
        job = Job.new(kind="k", args=None, now=NOW)
        await store.commit([job])
        [held] = await store.claim(1, NOW, NOW + 5, {})
        done = held.complete(1, NOW + 1)

        async def refused(changes: list[Change], fence: Fence) -> TransitionError:
            with pytest.raises(TransitionError) as caught:
                await store.commit_fenced(changes, fence)
            return caught.value

        stale = await refused([job.start(NOW)], Fence())
        with pytest.raises(StaleEpochError) as model:
            held.check(job.start(NOW))  # the same rule, from the model
        assert (type(stale), str(stale)) == (StaleEpochError, str(model.value))
        holder = await refused([done], Fence(holder=other.node))
        assert f"belongs to {store.node}, not {other.node}" in str(holder)
        late = await refused([done], Fence(holder=store.node, lease_from=NOW + 6))
        assert "the lease ran out before the outcome was recorded" in str(late)
        alive = await refused([done], Fence(lease_before=NOW + 4))
        assert "the lease was renewed: its node is alive" in str(alive)
        with pytest.raises(JobNotFoundError):
            await store.commit_fenced([Job.new(kind="k", args=None, now=NOW).start(NOW)], Fence())
        await store.commit_fenced([done], Fence(holder=store.node, lease_from=NOW + 1))
        got = await other.get(job.id)
        assert got is not None
        assert (got.state, got.result) == (State.COMPLETED, 1)
        finished = held.apply(done)  # every move out of running is legal: out of completed
        illegal = await refused([finished.start(NOW)], Fence())
        with pytest.raises(IllegalTransitionError) as model2:
            finished.check(finished.start(NOW))
        assert (type(illegal), str(illegal)) == (IllegalTransitionError, str(model2.value))
    finally:
        await other.close()
        await store.close()


async def test_a_call_may_encode_its_own_changes_for_the_committer() -> None:
    """How a fenced commit hands its fence to the encoder: as an argument, on the
    caller's turn, for that call only; other calls keep the engine's encoder."""
    seen: list[Any] = []

    async def flush(batch: list[Pending]) -> list[BaseException | None]:
        seen.extend(p.encoded for p in batch)
        return [None] * len(batch)

    committer = GroupCommitter(flush, encode=lambda c: ("engine", len(c)), name="t")
    committer.start()
    job = Job.new(kind="k", args=None, now=NOW)
    try:
        await committer.submit([job])
        await committer.submit([job, job], lambda c: ("mine", len(c)))
        await committer.submit([job])
    finally:
        await committer.close()
    assert seen == [("engine", 1), ("mine", 2), ("engine", 1)]


def test_the_engines_modules_are_small() -> None:
    too_big = {
        p.name: n for p in PACKAGE.glob("*.py") if (n := len(p.read_text().splitlines())) > 400
    }
    assert too_big == {}


async def test_a_writer_connection_in_a_broken_state_is_replaced(pg_db: str) -> None:
    """asyncpg can leave a connection whose backend was terminated mid-answer in a state
    it refuses every later call in ("another operation is in progress"), without
    closing it. The writer must drop it like a lost one: the batch's callers hear
    StoreUnavailableError (the runtime writes an outcome again on that) and the next
    batch reconnects, instead of every batch failing on that connection."""
    store = PostgresStore(pg_db)
    await store.open()
    try:
        real = await store._db.writer()

        class Stuck:
            """The writer's connection as asyncpg left it: open, and refusing every call."""

            def is_closed(self) -> bool:
                return False

            async def fetchrow(self, *_: object) -> None:
                raise asyncpg.InternalClientError("cannot switch to state 12; another operation")

            def terminate(self) -> None:
                real.terminate()

            async def close(self) -> None:
                await real.close()

        store._db._writer = Stuck()
        job = Job.new(kind="k", args=None, now=NOW)
        with pytest.raises(StoreUnavailableError):
            await store.commit([job])
        await store.commit([job])
        assert store.stats().detail["reconnects"] == 1
        assert await store.get(job.id) == job
    finally:
        await store.close()
