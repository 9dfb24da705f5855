"""A node's connections to the shared database, and what it does when one is lost.

One writer connection (the group committer's), a small pool for reads and the
shared mode's calls, one connection only for claims (``CLAIM_SETTINGS``), a pool
only for listings (``LIST_SETTINGS``), and one that LISTENs. A lost connection
or a database that is restarting is ``StoreUnavailableError`` for the calls it
touched, counted and kept as ``last_error``; the writer reconnects on the next
batch, the pools on the next call, the listener by itself (a listener cut off without
a word is found by a ping every ``PING_S``: it only hears, so it would otherwise wait
for ever). Where the database is, and what the driver said of it, goes to this node's
log, never into the error's message: that message reaches clients, in 503 bodies.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable

import asyncpg
import msgspec

from sqlq.common.errors import StoreClosedError, StoreError, StoreUnavailableError
from sqlq.common.fair import Policy, stored_policies
from sqlq.engines.postgres.migrate import check, connect, where
from sqlq.engines.postgres.queries import Q


def node_name() -> str:
    """Unique per start (a restart must not renew its dead predecessor's leases); ``node:``
    first, so no host's name makes a node pass for a remote worker (``worker:<name>``)."""
    return f"node:{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


def application_name(node: str) -> str:
    """A node's connections' name in ``pg_stat_activity`` (an operator sees who holds what;
    a crash test waits there until a killed node's last commit has landed): the node's
    own, or (past the 63 bytes PostgreSQL keeps) its start and a hash of the whole."""
    raw = node.encode()
    if len(raw) <= 63 and raw.isascii():
        return node
    digest = hashlib.sha256(raw).hexdigest()[:16]
    return raw[:46].decode("ascii", "replace").replace("\ufffd", "?") + ":" + digest


log = logging.getLogger(__name__)

CHANNEL = "sqlq_jobs"
# A cancel asked for (queries.sql request_cancel): {"id": job, "node": its holder}.
CANCEL_CHANNEL = "sqlq_cancel"
KEYED_MOST = 256  # queue names a wake's payload may pass on (batch.keyed_note's fewer)


class CancelNote(msgspec.Struct, frozen=True):
    """A ``sqlq_cancel`` payload; the node is None for a job running with no holder."""

    id: str
    node: str | None = None


_decode_note = msgspec.json.Decoder(CancelNote).decode
# The claim connection's planner settings: see the claim statement in queries.sql.
CLAIM_SETTINGS = {"enable_sort": "off", "enable_bitmapscan": "off"}
# Listings run on connections of their own that plan every run for its values. asyncpg
# reuses a prepared statement, and after five runs PostgreSQL takes a generic plan,
# which for `kind = $2 ORDER BY id LIMIT $1` guesses from the column's few distinct
# values that most rows match and walks jobs_pkey: at 200k jobs, 209-231 ms for a kind
# or queue that matches none, against 56-72 ms for the custom plan's scan (a state
# filter reads jobs_state_id either way: 1-3 ms), every second per dashboard viewer.
LIST_SETTINGS = {"plan_cache_mode": "force_custom_plan"}

# Every call to the database has a deadline: connecting, taking a pooled connection, and
# each statement. Past it the call is ``StoreUnavailableError`` (a 503 with Retry-After),
# so a node cut off from its database answers within a stated bound instead of hanging
# until TCP gives up (about 15 minutes). A submission waits at most two of them: one for
# the batch ahead of it in the writer, one for its own. Listings scan, so they get more.
DEADLINE_S = 2.0
LISTING_DEADLINES = 5  # a listing's deadline, in deadlines
# How often the listening connection is asked whether it is still there (``SELECT 1``
# within the deadline): a link that went silent raises no error on a connection that
# sends nothing, and a listener that hears nothing delays every wake to the next poll.
PING_S = 5.0
# The unavailable database's log line, at most once this often while the error stays the same.
LOG_UNAVAILABLE_S = 10.0

# The database is out of reach (or going away): the call failed, the engine did not.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,  # admin or crash shutdown, starting up
    asyncpg.exceptions.InsufficientResourcesError,  # too many connections, disk full
    # A connection asyncpg left in a state it refuses every call in ("another operation
    # is in progress"), seen after its backend was terminated mid-answer: unusable, but
    # not closed. Dropped like a lost one, so the next call connects again.
    asyncpg.InternalClientError,
)


class Connections:
    """Every connection of one node; ``name`` is the engine's, for messages."""

    def __init__(
        self,
        dsn: str,
        *,
        name: str,
        settings: dict[str, str],
        pool_size: int,
        deadline_s: float = DEADLINE_S,
    ) -> None:
        self.dsn = dsn
        self.where = where(dsn)
        self._name = name
        self._settings = settings
        self._pool_size = pool_size
        self.deadline_s = deadline_s
        # What every connection is opened with: asyncpg's ``timeout`` bounds the connect,
        # ``command_timeout`` each statement a call does not time itself.
        self._bounds = {"timeout": deadline_s, "command_timeout": deadline_s}
        self._writer: asyncpg.Connection | None = None
        self._pool: asyncpg.Pool | None = None
        self._claimer: asyncpg.Pool | None = None  # one connection, only for claims
        self._lister: asyncpg.Pool | None = None  # only for listings (LIST_SETTINGS)
        self.listener: asyncpg.Connection | None = None  # while it LISTENs
        self._listen_task: asyncio.Task[None] | None = None
        self._wake: Callable[[], None] | None = None
        self._keyed: Callable[[list[str]], None] | None = None
        self._cancel: Callable[[str], None] | None = None
        self._node: str | None = None  # whose cancels the listener passes on
        self.ping_s = PING_S
        self.reconnects = 0
        self.unavailable = 0  # calls refused because the database was out of reach
        self.last_error: str | None = None
        self._logged: tuple[str, float] | None = None  # the last unavailable error logged

    async def open(self) -> tuple[list[str], dict[str, Policy]]:
        """Connect, refuse a schema of another version, and open the pools. Returns the
        paused queues and the policies, read on the first connection (the writer's) before
        the pools. If
        a step fails, what the steps before it opened is closed: a node that retries its
        start must not leave connections behind on every try."""
        conn = await connect(self.dsn, server_settings=self._settings, **self._bounds)
        self._writer = conn
        try:
            await check(conn, self.dsn)
            paused = [r[0] for r in await conn.fetch(Q["paused"])]
            policies = stored_policies(
                [(r[0], r[1]) for r in await conn.fetch(Q["policies"])], Policy()
            )
        except BaseException:
            self._discard()
            raise
        try:
            self._pool = await asyncpg.create_pool(
                self.dsn, min_size=1, max_size=self._pool_size, server_settings=self._settings,
                **self._bounds,
            )  # fmt: skip
            self._claimer = await asyncpg.create_pool(
                self.dsn, min_size=1, max_size=1,
                server_settings={**self._settings, **CLAIM_SETTINGS}, **self._bounds,
            )  # fmt: skip
            self._lister = await asyncpg.create_pool(
                self.dsn, min_size=1, max_size=self._pool_size,
                server_settings={**self._settings, **LIST_SETTINGS}, timeout=self.deadline_s,
                command_timeout=self.deadline_s * LISTING_DEADLINES,
            )  # fmt: skip
        except UNAVAILABLE as exc:
            self._discard()
            raise StoreError(f"cannot connect to PostgreSQL at {self.where}: {exc}") from None
        except BaseException:
            self._discard()
            raise
        return paused, policies

    def _discard(self) -> None:
        """Every connection and pool ended at once, without a goodbye to the database (an
        ``open`` that failed: the link may be what failed)."""
        for conn in (self._writer, self.listener):
            if conn is not None:
                conn.terminate()
        for pool in (self._pool, self._claimer, self._lister):
            if pool is not None:
                pool.terminate()
        self._writer = self.listener = None
        self._pool = self._claimer = self._lister = None

    async def close(self) -> None:
        if self._listen_task is not None:
            self._listen_task.cancel()
            await asyncio.gather(self._listen_task, return_exceptions=True)
            self._listen_task = None
        for conn in (self._writer, self.listener):
            if conn is not None:
                with contextlib.suppress(*UNAVAILABLE):
                    await asyncio.wait_for(conn.close(), 5)
        self._writer = self.listener = None
        for pool in (self._pool, self._claimer, self._lister):
            if pool is not None:
                with contextlib.suppress(*UNAVAILABLE):
                    await asyncio.wait_for(pool.close(), 5)
        self._pool = self._claimer = self._lister = None

    # -- the writer ------------------------------------------------------------------

    async def writer(self) -> asyncpg.Connection:
        """The writer's connection, connecting again if it was lost."""
        if self._writer is None or self._writer.is_closed():
            try:
                self._writer = await asyncpg.connect(
                    self.dsn, server_settings=self._settings, **self._bounds
                )
            except (*UNAVAILABLE, asyncpg.PostgresError) as exc:
                raise StoreUnavailableError(self.unreachable(exc)) from None
            self.reconnects += 1
            log.warning("reconnected to PostgreSQL at %s", self.where)
        return self._writer

    def lost_writer(self, exc: BaseException) -> str:
        """The writer's answer was lost to ``exc``: drop its connection (the next batch
        connects again) and say so."""
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.terminate()
        return self.unreachable(exc)

    def unreachable(self, exc: BaseException) -> str:
        """Count a call the database was out of reach for, and the message it fails with.

        The message names no host, port or database, nor echoes the driver's text (a
        refused connect's names the address): it is a 503's body. The log line says where
        and what, once per error and at most every ``LOG_UNAVAILABLE_S`` while it lasts."""
        self.unavailable += 1
        text = str(exc).splitlines()[0] if str(exc) else ""
        self.last_error = f"{type(exc).__name__}: {text}"
        now = time.monotonic()
        if (
            self._logged is None
            or self._logged[0] != self.last_error
            or now - self._logged[1] >= LOG_UNAVAILABLE_S
        ):
            self._logged = (self.last_error, now)
            log.warning("PostgreSQL at %s is unavailable: %s", self.where, self.last_error)
        code = getattr(exc, "sqlstate", None)
        return f"PostgreSQL is unavailable: {type(exc).__name__}{f' ({code})' if code else ''}"

    # -- the pools -------------------------------------------------------------------

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise StoreClosedError(f"{self._name} store is not open")
        return self._pool

    @contextlib.asynccontextmanager
    async def acquire(
        self, claims: bool = False, listing: bool = False
    ) -> AsyncIterator[asyncpg.Connection]:
        """A connection of the claims', the listings' or the general pool, within the
        deadline. A call that found the database out of reach drops its connection, so
        handing it back to the pool does not wait on the lost link as well."""
        pool = self._claimer if claims else self._lister if listing else self._pool
        if pool is None:
            raise StoreClosedError(f"{self._name} store is not open")
        try:
            async with pool.acquire(timeout=self.deadline_s) as conn:
                try:
                    yield conn
                except UNAVAILABLE:
                    with contextlib.suppress(asyncpg.InterfaceError):  # (released already)
                        conn.terminate()
                    raise
        except UNAVAILABLE as exc:
            raise StoreUnavailableError(self.unreachable(exc)) from None

    # -- waking ----------------------------------------------------------------------

    def listen(
        self,
        wake: Callable[[], None],
        cancel: Callable[[str], None] | None = None,
        node: str | None = None,
        keyed: Callable[[list[str]], None] | None = None,
    ) -> None:
        """LISTEN on a connection of its own, reconnecting until ``close``: ``wake`` on
        ``sqlq_jobs`` (and ``keyed`` with the queues it names), and ``cancel(job_id)`` on
        ``sqlq_cancel`` for the jobs ``node`` holds (and those no node holds)."""
        self._wake, self._cancel, self._node, self._keyed = wake, cancel, node, keyed
        if self._listen_task is None:
            self._listen_task = asyncio.create_task(self._listen(), name="sqlq-pg-listen")

    async def _listen(self) -> None:
        delay = 0.1
        while True:
            try:
                conn = await asyncpg.connect(self.dsn, **self._bounds)
            except (*UNAVAILABLE, asyncpg.PostgresError):
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            delay = 0.1
            lost = asyncio.Event()
            conn.add_termination_listener(lambda _c, ev=lost: ev.set())
            try:
                await conn.add_listener(CHANNEL, self._notified)
                if self._cancel is not None:
                    await conn.add_listener(CANCEL_CHANNEL, self._cancel_notified)
                self.listener = conn  # listening on every channel from here
            except (*UNAVAILABLE, asyncpg.PostgresError):
                conn.terminate()  # lost while it began to listen: connect again
            except asyncio.CancelledError:
                conn.terminate()  # closed while it began to listen: ``close`` never saw it
                raise
            if self._keyed is not None:
                self._keyed([])  # anything submitted while we were not listening
            if self._wake is not None:
                self._wake()
            await self._while_alive(conn, lost)
            self.listener = None

    async def _while_alive(self, conn: asyncpg.Connection, lost: asyncio.Event) -> None:
        """Until ``conn`` is lost: closed (its termination listener), or silent, which only
        a ping within the deadline tells (then it is dropped, and ``_listen`` connects again)."""
        while not lost.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lost.wait(), self.ping_s)
                return
            try:
                await conn.fetchval(Q["ping"], timeout=self.deadline_s)
            except (*UNAVAILABLE, asyncpg.PostgresError) as exc:
                log.warning("the listening connection is lost (%s); listening again",
                            type(exc).__name__)  # fmt: skip
                conn.terminate()
                return

    def _notified(self, _conn: object, _pid: object, _channel: object, payload: object) -> None:
        """A wake, told first to ``keyed`` with the queues its payload names as given jobs
        with a key (``batch.keyed_note``), so the claim it wakes is fair between them. A
        hint (anyone may NOTIFY), bounded, and replaced at the next census."""
        if self._keyed is not None:
            self._keyed(str(payload).split("\n", KEYED_MOST)[:KEYED_MOST] if payload else [])
        if self._wake is not None:
            self._wake()

    def _cancel_notified(
        self, _conn: object, _pid: object, _channel: object, payload: object
    ) -> None:
        """A cancel asked for: passed on if this node holds the job. A payload that is not
        a request's (anyone may NOTIFY) is dropped: a hint, made up for by the renewal."""
        try:
            note = _decode_note(str(payload))
        except msgspec.DecodeError:
            return
        if self._cancel is not None and note.node in (None, self._node):
            self._cancel(note.id)
