"""``PostgresStore``: the shared engine. One ``jobs`` table that any number of nodes use at once.

Writes. One writer connection per node and a group committer in front of it,
as in the single-node engines: concurrent commits become one batch, and a batch
is one statement (``batch.py``); a call that changes a schedule is applied on its
own after it (``schedules.py``: a tick is one statement too). Claims, leases
and reads go through a small pool (``connections.py``). Nothing is kept in
memory: ``open`` recovers no jobs (nor schedules), because the queue is the
database's, not this process's.

Failures. A lost connection, a database that is restarting, or one out of reach
past the deadline every call has (``connections.DEADLINE_S``, ``--db-timeout``) is
``StoreUnavailableError`` for the calls it touched, and the engine reconnects
on the next call; it does not fail for good the way a local engine does after
an fsync error, because PostgreSQL keeps its own WAL honest and comes back. A
data error (a NUL in a text column, an integer PostgreSQL cannot hold) fails
only the caller whose value it was (``UnencodableError``).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from functools import partial
from typing import Any, TypeVar

import asyncpg

from sqlq.common.clock import SYSTEM_CLOCK, Clock
from sqlq.common.engine.cascade import tell
from sqlq.common.engine.groupcommit import BatchObserver, Committing, GroupCommitter, Pending
from sqlq.common.errors import StoreError, StoreUnavailableError, ValidationError
from sqlq.common.fair import Policy
from sqlq.common.models import Job, State
from sqlq.common.running import Progress
from sqlq.common.schedule import Schedule, key_range
from sqlq.common.store import (
    DEFAULT_RETENTION_S,
    Cascaded,
    Change,
    CompactionReport,
    Extended,
    Fence,
    JobQuery,
    Lease,
    QueueCount,
    Recovery,
    Renewal,
    StoreStats,
    SyncLevel,
)
from sqlq.engines.listing import postgres_args, postgres_shape
from sqlq.engines.postgres import fair, flows, leases, signing
from sqlq.engines.postgres.batch import (
    Encoded,
    fast_path_safe,
    write_batch,
    write_members,
    write_one_by_one,
)
from sqlq.engines.postgres.connections import (
    DEADLINE_S,
    UNAVAILABLE,
    Connections,
    application_name,
    node_name,
)
from sqlq.engines.postgres.flows import ROW_WIDTH, job_of
from sqlq.engines.postgres.prune import prune
from sqlq.engines.postgres.queries import LIST_STATEMENTS, SCHEDULE_LIST_STATEMENTS, SQ, Q
from sqlq.engines.postgres.schedule_rows import row_schedule
from sqlq.engines.postgres.schedules import flush

T = TypeVar("T")


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
        deadline_s: float = DEADLINE_S,
    ) -> None:
        self.dsn = dsn
        self.sync: SyncLevel = sync
        self.retention = retention
        self.clock = clock
        self.node = node or node_name()
        self._group = group_commit
        settings = {"synchronous_commit": "on" if sync == "full" else "off",
                    "application_name": application_name(self.node)}  # fmt: skip
        self._db = Connections(dsn, name=self.name, settings=settings, pool_size=pool_size,
                               deadline_s=deadline_s)  # fmt: skip
        self.where = self._db.where
        self._committer: GroupCommitter | None = None
        self._observer: BatchObserver | None = None
        self._opened = False
        self.syncs = 0  # batches committed (each one WAL flush at synchronous_commit=on)
        self.slow_batches = 0  # batches redone one caller at a time
        self._key: bytes | None = None
        self._between = leases.Between()  # what claims remember: tokens, turns, sweeps

    # -- lifecycle -------------------------------------------------------------------

    async def open(self) -> Recovery:
        if self._opened:
            raise StoreError(f"{self.name} store was already opened")
        self._opened = True
        t0 = time.perf_counter()
        paused, policies = await self._db.open()
        self._committer = GroupCommitter(
            self._flush, encode=Encoded, name=self.name, group=self._group
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
            queue_policies=policies,
        )

    async def close(self) -> None:
        if self._committer is not None:
            await self._committer.close()
            self._committer = None
        await self._db.close()

    # -- writes ----------------------------------------------------------------------

    async def commit(self, changes: Sequence[Change]) -> None:
        committer = self._live()
        if changes:
            await committer.submit(changes)

    async def commit_fenced(self, changes: Sequence[Change], fence: Fence) -> None:
        committer = self._live()
        if changes:
            await committer.submit(changes, partial(Encoded, fence=fence))

    async def _flush(self, batch: list[Pending]) -> list[BaseException | None]:
        try:
            conn = await self._db.writer()
        except StoreUnavailableError as exc:
            # Not connected again yet: each caller hears it as what it is, so an outcome is
            # written again (``write_fenced``) and a submission is a 503, not a failed batch.
            return [exc] * len(batch)
        if not any(p.encoded.members for p in batch):
            ends = await self._write(conn, batch)
        else:
            moved: list[Cascaded] = []  # (a workflow's members: ``write_members``)
            ends = await write_members(conn, batch, self._db, partial(self._write, conn), moved)
            self.syncs += sum(1 for p in batch if p.encoded.members)
            tell(self._cascade, moved)
        if any(p.encoded.wakes for p in batch):  # (after the commit: ``Between.plain_may``)
            self._between.heard()
        return ends

    async def _write(
        self, conn: asyncpg.Connection, batch: list[Pending]
    ) -> list[BaseException | None]:
        """A batch of callers that make or move no workflow member."""
        encoded: list[Encoded] = [p.encoded for p in batch]
        if not batch:
            return []
        try:
            if any(e.steps is not None for e in encoded):  # a schedule change: schedules.py
                outcomes, syncs, slow = await flush(
                    conn, batch, self._db.pool, self._db.lost_writer
                )
                self.syncs, self.slow_batches = self.syncs + syncs, self.slow_batches + slow
                return outcomes
            if fast_path_safe(encoded) and await write_batch(conn, encoded):
                self.syncs += 1
                return [None] * len(batch)
            self.slow_batches += 1
            outcomes = await write_one_by_one(conn, batch, self._db.pool, self._db.deadline_s)
            self.syncs += 1
            return outcomes
        except UNAVAILABLE as exc:
            # The answer was lost: each caller hears so, and the next batch reconnects.
            return [StoreUnavailableError(self._db.lost_writer(exc))] * len(batch)

    # -- reads and the shared mode's calls ------------------------------------------------

    def _conn(
        self, claims: bool = False, listing: bool = False
    ) -> AbstractAsyncContextManager[asyncpg.Connection]:
        return self._db.acquire(claims=claims, listing=listing)

    @property
    def _listener(self) -> asyncpg.Connection | None:
        """The connection that LISTENs, while it does (tests wait for it)."""
        return self._db.listener

    async def _read(
        self,
        fn: Callable[[asyncpg.Connection], Awaitable[T]],
        field: str = "query",
        listing: bool = False,
    ) -> T:
        """``fn`` on a pooled connection (a listing's own, for ``listing``). A value
        PostgreSQL refuses to compare (a NUL in text, say) is the caller's bad input,
        named by ``field``: a 422, never a 500. A statement PostgreSQL rolled back as a
        deadlock's victim (a renewal against the writer's batch, both updating this node's
        rows) changed nothing and may be sent again: ``StoreUnavailableError``, as for a
        lost connection, not a bug's traceback."""
        async with self._conn(listing=listing) as conn:
            try:
                return await fn(conn)
            except asyncpg.DataError as exc:
                raise ValidationError(
                    field, f"PostgreSQL cannot take this value ({exc.sqlstate})"
                ) from None
            except asyncpg.TransactionRollbackError as exc:
                raise StoreUnavailableError(
                    f"PostgreSQL rolled the statement back: {type(exc).__name__}"
                ) from None

    async def get(self, job_id: str) -> Job | None:
        row = await self._read(lambda c: c.fetchrow(Q["get"], job_id), "job_id")
        return None if row is None else job_of(row)

    async def find_key(self, key: str) -> Job | None:
        row = await self._read(lambda c: c.fetchrow(Q["find_key"], key), "idempotency_key")
        return None if row is None else job_of(row)

    async def list_jobs(self, query: JobQuery) -> list[Job]:
        shape, args = postgres_shape(query), postgres_args(query)
        if query.schedule is not None:  # by the key range, on jobs_key (schedules.sql)
            sql, field = SCHEDULE_LIST_STATEMENTS[shape], "schedule"
            args += key_range(query.schedule)
        else:  # the one free-text filter: state, queue and the cursor are checked shapes
            sql, field = LIST_STATEMENTS[shape], "kind"
        rows = await self._read(lambda c: c.fetch(sql, *args), field, listing=True)
        return [job_of(r) for r in rows]

    async def list_schedules(self) -> list[Schedule]:
        rows = await self._read(lambda c: c.fetch(SQ["schedules"]))
        return [row_schedule(r) for r in rows]

    async def get_schedule(self, name: str) -> Schedule | None:
        row = await self._read(lambda c: c.fetchrow(SQ["schedule"], name), "name")
        return None if row is None else row_schedule(row)

    async def set_queue_paused(self, queue: str, paused: bool) -> None:
        await self._read(lambda c: c.fetchrow(Q["set_paused"], queue, paused))
        self._between.heard()  # (its jobs may be the plain claim's again)

    async def paused_queues(self) -> list[str]:
        paused = [r[0] for r in await self._read(lambda c: c.fetch(Q["paused"]))]
        self._between.paused = frozenset(paused)
        return paused

    async def set_queue_policy(self, queue: str, policy: Policy | None) -> None:
        await self._read(lambda c: fair.set_policy(c, queue, policy))
        self._between.heard()

    async def queue_policies(self) -> dict[str, Policy]:
        return await self._read(fair.policies)

    async def push_back(self, queue: str, key: str | None, hold_s: float) -> None:
        await self._read(lambda c: fair.push_back(c, queue, key, hold_s), "key")

    async def finished(self, ids: Sequence[str]) -> list[Job]:
        return list(map(job_of, await self._read(lambda c: c.fetch(Q["finished"], list(ids)))))

    async def workflow(self, workflow_id: str) -> list[Job]:
        return await self._read(lambda c: flows.workflow(c, workflow_id), "workflow_id")

    async def get_many(self, ids: Sequence[str]) -> list[Job | None]:
        rows = await self._read(lambda c: c.fetch(Q["get_many"], list(ids)), "job_id")
        found = {job.id: job for job in map(job_of, rows)}
        return [found.get(i) for i in ids]

    async def claim(
        self,
        n: int,
        now: float,
        lease_until: float,
        caps: Mapping[str, int],
        *,
        only: Sequence[str] | None = None,
        besides: Sequence[str] = (),
        kinds: Sequence[str] | None = None,
        holder: str | None = None,
        policies: Mapping[str, Policy] | None = None,
    ) -> list[Job]:
        """``leases.claim``: for this node, or for the remote worker named by ``holder``."""
        async with self._conn(claims=True) as conn:
            return await leases.claim(conn, n, now, lease_until, caps, holder or self.node,
                                      only, besides, kinds, policies, self._between,
                                      holder is not None)  # fmt: skip

    async def extend(self, now: float, held: Sequence[Lease]) -> list[Extended]:
        """``leases.extend``: every remote lease given, fenced, in one statement."""
        return await self._read(lambda c: leases.extend(c, now, held), "leases")

    async def signing_key(self) -> bytes:
        """``signing.signing_key``: one row every node reads, kept once read."""
        if self._key is None:
            self._key = await self._read(signing.signing_key)
        return self._key

    async def next_due(self, now: float, *, remote: bool = False) -> float | None:
        """The earliest delayed job's due time, or a fair queue's next token if sooner (of
        this node's claims, or with ``remote`` of remote workers')."""
        due: float | None = await self._read(lambda c: c.fetchval(Q["next_due"], now))
        return leases.next_due(self._between, remote, due, now)

    async def renew(
        self,
        now: float,
        lease_until: float,
        held: Sequence[str],
        progress: Mapping[str, Progress] | None = None,
    ) -> Renewal:
        """``leases.renew``: this node's leases, their progress and the cancels asked for."""
        args = leases.renew_args(self.node, now, lease_until, held, progress)
        count, asked, renewed = await self._read(lambda c: c.fetchrow(Q["renew"], *args))
        return Renewal(int(count), frozenset(asked), frozenset(held) - frozenset(renewed))

    async def request_cancel(
        self, job_id: str, now: float, *, forced_until: float | None = None
    ) -> Job | None:
        """Not a transition: any node may ask, whatever epoch it read, and the holder's next
        outcome obeys it (write_batch's cancel rule); a forced one holds a remote worker's
        lease (queries.sql ``request_cancel``)."""
        row = await self._read(
            lambda c: c.fetchrow(Q["request_cancel"], job_id, now, forced_until), "job_id"
        )
        if row is None:  # not running, or asked already: read as it is now, in a new snapshot
            return await self.get(job_id)
        return job_of(tuple(row)[:ROW_WIDTH])

    async def expired(self, now: float, limit: int) -> list[Job]:
        return list(map(job_of, await self._read(lambda c: c.fetch(Q["expired"], now, limit))))

    async def release(self, now: float) -> int:
        released: int = await self._read(lambda c: c.fetchval(Q["release"], self.node, now))
        return released

    async def census(self) -> list[QueueCount]:
        rows = await self._between.counted(lambda: self._read(lambda c: c.fetch(Q["census"])))
        return [QueueCount(r[0], State(r[1]), int(r[2])) for r in rows]

    async def nodes(self, now: float) -> list[dict[str, Any]]:
        return await self._read(lambda c: leases.nodes(c, now, self.node))

    def listen(self, wake: Callable[[], None], cancel: Callable[[str], None] | None = None) -> None:
        """LISTEN on a connection of its own, reconnecting while the store is open:
        ``wake`` when work is submitted or requeued, ``cancel(job_id)`` when a cancel of a
        job this node holds is asked for (``cancel`` may be left out: no cancels heard)."""
        self._db.listen(wake, cancel, self.node, self._between.heard)

    # -- maintenance -----------------------------------------------------------------------

    async def compact(self) -> CompactionReport:
        """Prune finished jobs past retention, on one node at a time (an advisory lock)."""
        t0, began = time.perf_counter(), self.clock.time()
        async with self._conn() as conn:
            report = await prune(conn, self.clock.time() - self.retention, t0)
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
                "reconnects": self._db.reconnects,
                "unavailable_calls": self._db.unavailable,
                "slow_batches": self.slow_batches,
                "last_db_error": self._db.last_error,
            },
        )
        return self._committer.fill(stats) if self._committer is not None else stats
