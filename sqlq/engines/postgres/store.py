"""``PostgresStore``: the shared engine. One ``jobs`` table that any number of nodes use at once.

Writes. One writer connection per node and a group committer in front of it,
as in the single-node engines: concurrent commits become one batch, and a batch
is one statement (``write_batch``: a multi-row INSERT from arrays, a guarded
UPDATE ... FROM unnest, the NOTIFY), so one round trip and one WAL flush at
``synchronous_commit = on``. If a guard refuses a row or an insert collides, the
statement aborts as a whole and the batch is redone one caller at a time, each
in its own transaction, so the caller at fault gets its error and the rest
commit. That slow path runs only when a stale node or a bad request is in it.

Claims, leases and reads go through a small pool. Nothing is kept in memory:
``open`` recovers no jobs, because the queue is the database's, not this
process's.

Failures. A lost connection or a database that is restarting is
``StoreUnavailableError`` for the calls it touched, and the engine reconnects
on the next call; it does not fail for good the way a local engine does after
an fsync error, because PostgreSQL keeps its own WAL honest and comes back. A
data error (a NUL in a text column, an integer PostgreSQL cannot hold) fails
only the caller whose value it was (``UnencodableError``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import asyncpg

from sqlq.common.clock import SYSTEM_CLOCK, Clock
from sqlq.common.engine.groupcommit import BatchObserver, Committing, GroupCommitter, Pending
from sqlq.common.engine.sql import load_queries
from sqlq.common.errors import (
    DuplicateJobError,
    DuplicateKeyError,
    IllegalTransitionError,
    JobNotFoundError,
    SqlqError,
    StaleEpochError,
    StoreClosedError,
    StoreError,
    StoreUnavailableError,
    UnencodableError,
    ValidationError,
)
from sqlq.common.models import TRANSITIONS, Job, State, Transition
from sqlq.common.store import (
    DEFAULT_RETENTION_S,
    Change,
    CompactionReport,
    Fence,
    JobQuery,
    QueueCount,
    Recovery,
    StoreStats,
    SyncLevel,
)
from sqlq.engines.listing import postgres_args, postgres_shape, postgres_statements
from sqlq.engines.postgres.migrate import check, connect, where
from sqlq.engines.rows import job_values, row_job, transition_values

log = logging.getLogger(__name__)

T = TypeVar("T")
Q = load_queries("sqlq.engines.postgres", "queries.sql")
LIST_STATEMENTS = postgres_statements(Q)
PRUNE_LOCK = 0x5371_6C72  # one node at a time prunes
CAP_LOCK = 0x5371_6C73  # with the queue's hash: one node at a time claims from a capped queue
CHANNEL = "sqlq_jobs"
NO_FENCE = Fence()
# The claim connection's planner settings: see the claim statement in queries.sql.
CLAIM_SETTINGS = {"enable_sort": "off", "enable_bitmapscan": "off"}
# Listings run on connections of their own that plan every run for its values. asyncpg
# reuses a prepared statement, and after five runs PostgreSQL takes a generic plan,
# which for `kind = $2 ORDER BY id LIMIT $1` guesses from the column's few distinct
# values that most rows match and walks jobs_pkey: at 200k jobs, 209-231 ms for a kind
# or queue that matches none, against 56-72 ms for the custom plan's scan (a state
# filter reads jobs_state_id either way: 1-3 ms), every second per dashboard viewer.
LIST_SETTINGS = {"plan_cache_mode": "force_custom_plan"}

# The states a job may move into a state from, as "|a|b|" for write_batch's strpos.
ALLOWED_FROM = {
    to: "|" + "|".join(sorted(f.value for f, tos in TRANSITIONS.items() if to in tos)) + "|"
    for to in State
}

# The database is out of reach (or going away): the call failed, the engine did not.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,  # admin or crash shutdown, starting up
    asyncpg.exceptions.InsufficientResourcesError,  # too many connections, disk full
)


REFUSED = "SQ001"  # the SQLSTATE sqlq_expect raises: a guard refused a row of the batch


def node_name() -> str:
    """Unique per start: a restarted process must not renew its dead predecessor's leases."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


def _transition_row(t: Transition, fence: Fence) -> tuple[Any, ...]:
    return (
        *transition_values(t)[:2],
        ALLOWED_FROM[t.state],
        *transition_values(t)[2:],
        fence.holder,
        fence.lease_from,
        fence.lease_before,
    )


class Encoded:
    """One caller's changes as rows, made on the caller's turn (see ``GroupCommitter``)."""

    __slots__ = ("ids", "jobs", "moves", "wakes")

    def __init__(self, changes: Sequence[Change], fence: Fence) -> None:
        self.jobs = [job_values(c) for c in changes if isinstance(c, Job)]
        self.moves = [_transition_row(c, fence) for c in changes if isinstance(c, Transition)]
        self.ids = [c.id if isinstance(c, Job) else c.job_id for c in changes]
        self.wakes = bool(self.jobs) or any(
            isinstance(c, Transition) and c.state is State.SCHEDULED for c in changes
        )


def _columns(rows: list[tuple[Any, ...]], width: int) -> list[list[Any]]:
    if not rows:
        return [[] for _ in range(width)]
    return [list(col) for col in zip(*rows, strict=True)]


def _batch_args(encoded: Sequence[Encoded]) -> list[Any]:
    jobs = [row for e in encoded for row in e.jobs]
    moves = [row for e in encoded for row in e.moves]
    return [*_columns(jobs, 18), *_columns(moves, 15), len(moves), any(e.wakes for e in encoded)]


def _fast_path_safe(encoded: Sequence[Encoded]) -> bool:
    """One statement sees one snapshot: every job at most once in the whole batch."""
    ids = [i for e in encoded for i in e.ids]
    return len(ids) == len(set(ids))


class PostgresStore(Committing):
    name = "postgres"
    durable = True
    shared = True

    def __init__(
        self,
        dsn: str,
        *,
        sync: SyncLevel = "full",
        retention: float = DEFAULT_RETENTION_S,
        clock: Clock = SYSTEM_CLOCK,
        group_commit: bool = True,
        pool_size: int = 4,
        node: str | None = None,
    ) -> None:
        self.dsn = dsn
        self.where = where(dsn)
        self.sync: SyncLevel = sync
        self.retention = retention
        self.clock = clock
        self.node = node or node_name()
        self._group = group_commit
        self._pool_size = pool_size
        self._settings = {"synchronous_commit": "on" if sync == "full" else "off"}
        self._writer: asyncpg.Connection | None = None
        self._pool: asyncpg.Pool | None = None
        self._claimer: asyncpg.Pool | None = None  # one connection, only for claims
        self._lister: asyncpg.Pool | None = None  # only for listings (LIST_SETTINGS)
        self._listener: asyncpg.Connection | None = None
        self._listen_task: asyncio.Task[None] | None = None
        self._wake: Callable[[], None] | None = None
        self._committer: GroupCommitter | None = None
        self._observer: BatchObserver | None = None
        self._opened = False
        self._closed = False
        self.syncs = 0  # batches committed (each one WAL flush at synchronous_commit=on)
        self.reconnects = 0
        self.unavailable = 0  # calls refused because the database was out of reach
        self.slow_batches = 0  # batches redone one caller at a time
        self.last_error: str | None = None

    # -- lifecycle -------------------------------------------------------------------

    async def open(self) -> Recovery:
        if self._opened:
            raise StoreError(f"{self.name} store was already opened")
        self._opened = True
        t0 = time.perf_counter()
        conn = await connect(self.dsn, server_settings=self._settings)
        try:
            await check(conn, self.dsn)
            paused = [r[0] for r in await conn.fetch(Q["paused"])]
        except BaseException:
            await conn.close()
            raise
        self._writer = conn
        try:
            self._pool = await asyncpg.create_pool(
                self.dsn, min_size=1, max_size=self._pool_size, server_settings=self._settings
            )
            self._claimer = await asyncpg.create_pool(
                self.dsn, min_size=1, max_size=1,
                server_settings={**self._settings, **CLAIM_SETTINGS},
            )  # fmt: skip
            self._lister = await asyncpg.create_pool(
                self.dsn, min_size=1, max_size=self._pool_size,
                server_settings={**self._settings, **LIST_SETTINGS},
            )  # fmt: skip
        except UNAVAILABLE as exc:
            await conn.close()
            raise StoreError(f"cannot connect to PostgreSQL at {self.where}: {exc}") from None
        self._committer = GroupCommitter(
            self._flush, encode=self._encode, name=self.name, group=self._group
        )
        self._committer.observer = self._observer
        self._committer.start()
        return Recovery(
            jobs=[],
            running=[],
            records=0,
            seconds=time.perf_counter() - t0,
            notes=[f"shared queue at {self.where}; this node is {self.node}"],
            paused_queues=paused,
        )

    async def close(self) -> None:
        if self._committer is not None:
            await self._committer.close()
            self._committer = None
        if self._listen_task is not None:
            self._listen_task.cancel()
            await asyncio.gather(self._listen_task, return_exceptions=True)
            self._listen_task = None
        for conn in (self._writer, self._listener):
            if conn is not None:
                with contextlib.suppress(*UNAVAILABLE):
                    await asyncio.wait_for(conn.close(), 5)
        self._writer = self._listener = None
        for pool in (self._pool, self._claimer, self._lister):
            if pool is not None:
                with contextlib.suppress(*UNAVAILABLE):
                    await asyncio.wait_for(pool.close(), 5)
        self._pool = self._claimer = self._lister = None
        self._closed = True

    # -- writes ----------------------------------------------------------------------

    async def commit(self, changes: Sequence[Change]) -> None:
        await self.commit_fenced(changes, NO_FENCE)

    async def commit_fenced(self, changes: Sequence[Change], fence: Fence) -> None:
        committer = self._live()
        if changes:
            await committer.submit(_Fenced(changes, fence))

    def _encode(self, changes: Sequence[Change]) -> Encoded:
        fence = changes.fence if isinstance(changes, _Fenced) else NO_FENCE
        return Encoded(changes, fence)

    async def _writer_conn(self) -> asyncpg.Connection:
        if self._writer is None or self._writer.is_closed():
            try:
                self._writer = await asyncpg.connect(self.dsn, server_settings=self._settings)
            except (*UNAVAILABLE, asyncpg.PostgresError) as exc:
                raise StoreUnavailableError(self._unreachable(exc)) from None
            self.reconnects += 1
            log.warning("reconnected to PostgreSQL at %s", self.where)
        return self._writer

    def _unreachable(self, exc: BaseException) -> str:
        self.unavailable += 1
        self.last_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return f"PostgreSQL at {self.where} is unavailable: {self.last_error}"

    async def _flush(self, batch: list[Pending]) -> list[BaseException | None]:
        encoded: list[Encoded] = [p.encoded for p in batch]
        try:
            conn = await self._writer_conn()
            if _fast_path_safe(encoded):
                try:
                    await conn.fetchrow(Q["write_batch"], *_batch_args(encoded))
                except (asyncpg.UniqueViolationError, asyncpg.DataError):
                    pass
                except asyncpg.PostgresError as exc:
                    if exc.sqlstate != REFUSED:
                        raise
                else:
                    self.syncs += 1
                    return [None] * len(batch)
            self.slow_batches += 1
            outcomes = [await self._one_caller(conn, e) for e in encoded]
            self.syncs += 1
            return outcomes
        except UNAVAILABLE as exc:
            # The answer was lost: each caller hears so, and the next batch reconnects.
            writer, self._writer = self._writer, None
            if writer is not None:
                writer.terminate()
            error = StoreUnavailableError(self._unreachable(exc))
            return [error] * len(batch)

    async def _one_caller(self, conn: asyncpg.Connection, e: Encoded) -> BaseException | None:
        """One caller's changes in one transaction, change by change, to name what failed."""
        try:
            async with conn.transaction():
                for row in e.jobs:
                    await self._one(conn, [row], [], e.wakes)
                for row in e.moves:
                    await self._one(conn, [], [row], e.wakes)
        except SqlqError as exc:
            return exc
        except asyncpg.DataError as exc:
            return UnencodableError(f"a value PostgreSQL cannot store ({exc.sqlstate})")
        return None

    async def _one(
        self, conn: asyncpg.Connection, jobs: list[Any], moves: list[Any], wakes: bool
    ) -> None:
        args = [*_columns(jobs, 18), *_columns(moves, 15), len(moves), wakes]
        try:
            await conn.fetchrow(Q["write_batch"], *args)
        except asyncpg.UniqueViolationError as exc:
            job_id, key = jobs[0][0], jobs[0][15]
            if exc.constraint_name == "jobs_key":
                raise DuplicateKeyError(key) from None
            raise DuplicateJobError(job_id) from None
        except asyncpg.PostgresError as exc:
            if exc.sqlstate != REFUSED:
                raise
            raise await self._why(moves[0]) from None

    async def _why(self, row: tuple[Any, ...]) -> SqlqError:
        """Name the guard that refused a transition, reading the row as it is now."""
        assert self._pool is not None
        job_id, expect_epoch, allowed, state = row[0], row[1], row[2], row[3]
        holder, lease_from, lease_before = row[12], row[13], row[14]
        found = await self._pool.fetchrow(Q["why_refused"], job_id)
        if found is None:
            return JobNotFoundError(job_id)
        if found["epoch"] != expect_epoch:
            return StaleEpochError(
                job_id, f"epoch is {found['epoch']}, the change expected {expect_epoch}"
            )
        if f"|{found['state']}|" not in allowed:
            return IllegalTransitionError(job_id, f"{found['state']} -> {state} is not allowed")
        lease = found["lease_until"]
        if holder is not None and found["node"] != holder:
            return StaleEpochError(job_id, f"the claim belongs to {found['node']}, not {holder}")
        if lease_from is not None and (lease is None or lease < lease_from):
            return StaleEpochError(job_id, "the lease ran out before the outcome was recorded")
        if lease_before is not None and (lease is None or lease >= lease_before):
            return StaleEpochError(job_id, "the lease was renewed: its node is alive")
        return StaleEpochError(job_id, "the job changed while the change was written")

    # -- reads and the shared mode's calls ------------------------------------------------

    @contextlib.asynccontextmanager
    async def _conn(
        self, claims: bool = False, listing: bool = False
    ) -> AsyncIterator[asyncpg.Connection]:
        pool = self._claimer if claims else self._lister if listing else self._pool
        if pool is None:
            raise StoreClosedError(f"{self.name} store is not open")
        try:
            async with pool.acquire() as conn:
                yield conn
        except UNAVAILABLE as exc:
            raise StoreUnavailableError(self._unreachable(exc)) from None

    async def _read(
        self,
        fn: Callable[[asyncpg.Connection], Awaitable[T]],
        field: str = "query",
        listing: bool = False,
    ) -> T:
        """``fn`` on a pooled connection (a listing's own, for ``listing``). A value
        PostgreSQL refuses to compare (a NUL in text, say) is the caller's bad input,
        named by ``field``: a 422, never a 500."""
        async with self._conn(listing=listing) as conn:
            try:
                return await fn(conn)
            except asyncpg.DataError as exc:
                raise ValidationError(
                    field, f"PostgreSQL cannot take this value ({exc.sqlstate})"
                ) from None

    async def get(self, job_id: str) -> Job | None:
        row = await self._read(lambda c: c.fetchrow(Q["get"], job_id), "job_id")
        return None if row is None else row_job(row)

    async def find_key(self, key: str) -> Job | None:
        row = await self._read(lambda c: c.fetchrow(Q["find_key"], key), "idempotency_key")
        return None if row is None else row_job(row)

    async def list_jobs(self, query: JobQuery) -> list[Job]:
        sql, args = LIST_STATEMENTS[postgres_shape(query)], postgres_args(query)
        rows = await self._read(
            lambda c: c.fetch(sql, *args),
            "kind",  # the one free-text filter: state, queue and the cursor are checked shapes
            listing=True,
        )
        return [row_job(r) for r in rows]

    async def set_queue_paused(self, queue: str, paused: bool) -> None:
        await self._read(lambda c: c.fetchrow(Q["set_paused"], queue, paused))

    async def paused_queues(self) -> list[str]:
        return [r[0] for r in await self._read(lambda c: c.fetch(Q["paused"]))]

    async def finished(self, ids: Sequence[str]) -> list[Job]:
        rows = await self._read(lambda c: c.fetch(Q["finished"], list(ids)))
        return [row_job(r) for r in rows]

    async def claim(
        self, n: int, now: float, lease_until: float, caps: dict[str, int]
    ) -> list[Job]:
        capped = sorted(caps)
        async with self._conn(claims=True) as conn:
            rows = list(await conn.fetch(Q["claim"], now, n, lease_until, capped, self.node))
            for queue in capped:
                if len(rows) >= n:
                    break
                async with conn.transaction():
                    await conn.execute(
                        "SELECT pg_advisory_xact_lock($1, hashtext($2))", CAP_LOCK, queue
                    )
                    rows += await conn.fetch(
                        Q["claim_capped"], now, n - len(rows), lease_until, queue, self.node,
                        caps[queue],
                    )  # fmt: skip
        jobs = [row_job(r) for r in rows]
        jobs.sort(key=lambda j: (-j.priority, j.ready_at, j.id))
        return jobs

    async def next_due(self, now: float) -> float | None:
        due: float | None = await self._read(lambda c: c.fetchval(Q["next_due"], now))
        return due

    async def renew(self, now: float, lease_until: float, held: Sequence[str]) -> int:
        status = await self._read(
            lambda c: c.execute(Q["renew"], self.node, now, lease_until, list(held))
        )
        return int(status.split()[-1])

    async def expired(self, now: float, limit: int) -> list[Job]:
        rows = await self._read(lambda c: c.fetch(Q["expired"], now, limit))
        return [row_job(r) for r in rows]

    async def release(self, now: float) -> int:
        status = await self._read(lambda c: c.execute(Q["release"], self.node, now))
        return int(status.split()[-1])

    async def census(self) -> list[QueueCount]:
        rows = await self._read(lambda c: c.fetch(Q["census"]))
        return [QueueCount(r[0], State(r[1]), int(r[2])) for r in rows]

    async def nodes(self, now: float) -> list[dict[str, Any]]:
        rows = await self._read(lambda c: c.fetch(Q["nodes"], now - 3600))
        return [
            {"name": r[0], "started_at": r[1], "seen_at": r[2], "running": int(r[3]),
             "this": r[0] == self.node}
            for r in rows
        ]  # fmt: skip

    # -- waking ----------------------------------------------------------------------------

    def listen(self, wake: Callable[[], None]) -> None:
        """LISTEN on a connection of its own, reconnecting while the store is open."""
        self._wake = wake
        if self._listen_task is None:
            self._listen_task = asyncio.create_task(self._listen(), name="sqlq-pg-listen")

    async def _listen(self) -> None:
        delay = 0.1
        while True:
            try:
                conn = await asyncpg.connect(self.dsn)
            except (*UNAVAILABLE, asyncpg.PostgresError):
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            self._listener, delay = conn, 0.1
            lost = asyncio.Event()
            conn.add_termination_listener(lambda _c, ev=lost: ev.set())
            await conn.add_listener(CHANNEL, self._notified)
            if self._wake is not None:
                self._wake()  # anything submitted while we were not listening
            await lost.wait()
            self._listener = None

    def _notified(self, *_: object) -> None:
        if self._wake is not None:
            self._wake()

    # -- maintenance -----------------------------------------------------------------------

    async def compact(self) -> CompactionReport:
        """Prune finished jobs past retention, on one node at a time (an advisory lock)."""
        t0, began = time.perf_counter(), self.clock.time()
        async with self._conn() as conn:
            before = int(await conn.fetchval(Q["size"]))
            pruned = 0
            if await conn.fetchval("SELECT pg_try_advisory_lock($1)", PRUNE_LOCK):
                try:
                    horizon = self.clock.time() - self.retention
                    pruned, _nodes = await conn.fetchrow(Q["prune"], horizon)
                finally:
                    await conn.execute("SELECT pg_advisory_unlock($1)", PRUNE_LOCK)
            after = int(await conn.fetchval(Q["size"]))
            live = int(
                await conn.fetchval(
                    "SELECT count(*) FROM jobs WHERE state IN ('scheduled', 'running')"
                )
            )
        report = CompactionReport(
            bytes_before=before,
            bytes_after=after,
            jobs_kept=live,
            jobs_pruned=int(pruned),
            seconds=time.perf_counter() - t0,
        )
        self._last_compaction = (began, report)
        return report

    _last_compaction: tuple[float, CompactionReport] | None = None  # this node's

    def stats(self) -> StoreStats:
        stats = StoreStats(
            engine=self.name,
            sync=self.sync,
            durable=True,
            last_compaction=self._last_compaction,
            group_commit=self._group,
            syncs=self.syncs,
            detail={
                "database": self.where,
                "node": self.node,
                "reconnects": self.reconnects,
                "unavailable_calls": self.unavailable,
                "slow_batches": self.slow_batches,
                "last_db_error": self.last_error,
            },
        )
        return self._committer.fill(stats) if self._committer is not None else stats


class _Fenced(list[Change]):
    """A caller's changes with the fence they must also pass (the committer sees a list)."""

    def __init__(self, changes: Sequence[Change], fence: Fence) -> None:
        super().__init__(changes)
        self.fence = fence
