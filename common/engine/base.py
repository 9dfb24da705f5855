"""``DurableStore``: the scaffolding both durable engines share, written once.

An engine supplies what is its own: how to recover (``_recover``), how to
encode a caller's changes (``_encode``), how to write a batch (``_flush``),
what to release at close (``_release``) and its own counters (``_detail``).
This class does the rest the same way for every engine:

- ``open`` runs once: it prepares the data directory, takes its lock, recovers
  on the engine's one I/O thread, then starts the group committer;
- every call on a store that is not open raises ``StoreClosedError``, checked
  before anything else (an empty commit on a closed store is an error too);
- ``close`` drains the committer, lets the engine release its files, stops the
  I/O thread and drops the lock, and is idempotent;
- the emulated sync delay (a benchmark knob) is paid at ``--sync full`` only, on
  the I/O thread, right after the engine's real sync;
- ``stats`` fills the fields every engine reports; a failure's text without its
  absolute paths (a client reads it; the log has the whole of it).

One I/O thread per engine (``IoThread``): all of an engine's blocking calls (write,
fdatasync, opening its files) run there in order, and the event loop never blocks on
them. SQLite's statements run on the thread of its
aiosqlite connection instead, in order too.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, TypeVar

from sqlq.common.clock import SYSTEM_CLOCK, Clock
from sqlq.common.engine.datadir import DirLock, prepare_dir
from sqlq.common.engine.groupcommit import BatchObserver, Committing, GroupCommitter, Pending
from sqlq.common.engine.iothread import IoThread
from sqlq.common.errors import StoreError, StoreFailedError
from sqlq.common.redact import redact_paths
from sqlq.common.store import DEFAULT_RETENTION_S, Change, Recovery, StoreStats, SyncLevel

T = TypeVar("T")


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """Recovery makes millions of objects and frees none: the cyclic collector would walk
    them again and again for nothing (a typed decode of a walq record took 0.87 us a job
    with it, 0.59 without). Process-wide, so it also covers the engine's I/O thread."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


class DurableStore(Committing):
    name = "durable"  # each engine names itself
    durable = True
    shared = False
    lock_name = "engine.lock"

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        sync: SyncLevel = "full",
        retention: float = DEFAULT_RETENTION_S,
        clock: Clock = SYSTEM_CLOCK,
        group_commit: bool = True,
        sync_delay_s: float = 0.0,
    ) -> None:
        self.sync: SyncLevel = sync
        self.dir = os.fspath(data_dir)
        self.retention = retention
        self.clock = clock
        self._group = group_commit
        self._sync_delay = sync_delay_s  # emulated disk latency, benchmark only
        self._lock = DirLock(self.dir, self.lock_name)
        self._io = IoThread(f"{self.name}-io")
        self._committer: GroupCommitter | None = None
        self._observer: BatchObserver | None = None
        self._opened = False
        self.syncs = 0

    # -- what an engine supplies ---------------------------------------------------

    async def _recover(self) -> Recovery:
        raise NotImplementedError

    def _encode(self, changes: Sequence[Change]) -> Any:
        raise NotImplementedError

    async def _flush(self, batch: list[Pending]) -> list[BaseException | None]:
        raise NotImplementedError

    async def _release(self) -> None:
        """Close the engine's files; called at close, and when ``open`` fails."""

    async def _idle(self) -> None:
        """Between batches, in the writer task (see ``GroupCommitter``)."""

    def _detail(self) -> dict[str, Any]:
        return {}

    # -- the shared lifecycle ----------------------------------------------------------

    async def open(self) -> Recovery:
        if self._opened:
            raise StoreError(f"{self.name} store was already opened")
        self._opened = True
        prepare_dir(self.dir)
        self._lock.acquire()
        try:
            with collector_off():
                recovery = await self._recover()
        except BaseException:
            await self._release()
            self._io.shutdown()
            self._lock.release()
            raise
        self._committer = GroupCommitter(
            self._flush, encode=self._encode, name=self.name, group=self._group, idle=self._idle
        )
        self._committer.observer = self._observer
        self._committer.start()
        return recovery

    def _writable(self) -> GroupCommitter:
        """The committer of an open store that has not failed. Every write that does not go
        through the committer (a queue pause, a compaction) asks this first: after a failed
        write or sync nothing more may become durable, whatever path it takes."""
        committer = self._live()
        if committer.failure is not None:
            raise StoreFailedError(
                f"{self.name} has failed: {committer.failure}"
            ) from committer.failure
        return committer

    def commit(self, changes: Sequence[Change]) -> Awaitable[None]:
        committer = self._committer
        if committer is None or not changes:
            return self._nothing()  # (closed: the error out of the await, as the protocol says)
        return committer.submit(changes)  # the batch's future itself (``JobStore.commit``)

    async def _nothing(self) -> None:
        """An empty commit: nothing to write, but a closed store still says so."""
        self._live()

    async def close(self) -> None:
        if self._committer is not None:
            await self._committer.close()
            self._committer = None
        if self._opened:
            await self._release()
            self._io.shutdown()
            self._lock.release()

    async def _on_io(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._io.run(fn, *args)

    def _synced(self) -> None:
        """After a real sync, on the I/O thread: count it, and pay any emulated delay."""
        self.syncs += 1
        if self._sync_delay and self.sync == "full":
            time.sleep(self._sync_delay)

    def stats(self) -> StoreStats:
        stats = StoreStats(
            engine=self.name,
            sync=self.sync,
            durable=True,
            group_commit=self._group,
            emulated_sync_delay_ms=self._sync_delay * 1000,
            syncs=self.syncs,
            detail=self._detail(),
        )
        if self._committer is None:
            return stats
        stats = self._committer.fill(stats)
        if stats.failed is not None:  # for /stats and the dashboard; the log has the full text
            stats.failed = redact_paths(stats.failed)
        return stats
