"""Compaction: rewrite the log as a snapshot of what recovery still needs.

It runs in two phases so appends never wait for more than one batch:

1. ``write_snapshot`` (a worker thread, while the writer keeps appending to the
   old log): header + one ``sched`` record per schedule + one ``snap`` record
   per kept job as of sequence ``S``, written to ``<log>.tmp`` and fdatasynced.
2. ``switch`` (the writer's I/O thread, between two batches): append the change
   records written after ``S`` (the carry-over), fdatasync, ``replace`` the tmp
   over the log, fsync the directory. Only then does the writer append to the
   new file, so a power cut can never leave acknowledged records in an inode no
   directory entry names.

A crash before the replace leaves the old log plus a stale tmp (removed at
open); after the replace, the new log, complete on its own.

``Compactor`` owns every piece of compaction state (the snapshot in flight, the
carry-over, who waits for a report) and talks to its store through the narrow
``CompactionHost``; the store only tells it what it appended and runs its
``on_idle`` between batches. ZODB keeps its packer apart from ``FileStorage``
for the same reason: the log's append path stays readable on its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import msgspec

from sqlq.common.engine.index import retired
from sqlq.common.errors import StoreClosedError, StoreError, StoreFailedError
from sqlq.common.models import Job
from sqlq.common.schedule import Schedule
from sqlq.common.store import CompactionReport
from sqlq.walq import log
from sqlq.walq.files import FileOps
from sqlq.walq.records import schedule_record

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class Snapshot:
    fd: int
    path: str
    bytes: int
    kept: int
    pruned: int
    next_seq: int
    cutoff: float  # terminal jobs last updated before this were left out


class SnapshotState(NamedTuple):
    """What a snapshot holds, taken between two batches (immutable records, so the lists of
    references are the snapshot)."""

    jobs: list[Job]
    schedules: list[Schedule]  # every one: a schedule is never past retention
    next_seq: int
    cutoff: float  # the retention cutoff
    now: float
    held: frozenset[str] = frozenset()  # workflows none of whose members goes yet (``retired``)


def create_fresh(fs: FileOps, tmp_path: str, path: str, start_seq: int, now: float) -> None:
    """A log of only a header, in place of whatever ``path`` held (written aside, synced,
    then renamed in, as a snapshot is)."""
    fd = fs.open_new(tmp_path)
    try:
        fs.write(fd, log.header(start_seq, now))
        fs.fdatasync(fd)
    finally:
        fs.close(fd)
    fs.replace(tmp_path, path)
    fs.fsync_dir(os.path.dirname(path) or ".")


def write_snapshot(
    fs: FileOps,
    tmp_path: str,
    jobs: Iterable[Job],
    schedules: Iterable[Schedule],
    next_seq: int,
    cutoff: float,
    now: float,
    held: frozenset[str] = frozenset(),
) -> Snapshot:
    if fs.exists(tmp_path):  # left by a compaction that failed after creating it
        fs.remove(tmp_path)
    fd = fs.open_new(tmp_path)
    try:
        chunks = [log.header(next_seq, now)]
        chunks.extend(schedule_record(s) for s in schedules)  # at most MAX_SCHEDULES
        kept = pruned = 0
        size = sum(len(c) for c in chunks)
        for job in jobs:
            if retired(job, cutoff, held):
                pruned += 1
                continue
            line = log.frame(b'{"snap":%s}' % msgspec.json.encode(job))
            chunks.append(line)
            kept += 1
            size += len(line)
            if len(chunks) >= 4096:
                fs.write(fd, b"".join(chunks))
                chunks.clear()
        fs.write(fd, b"".join(chunks))
        fs.fdatasync(fd)
    except BaseException:
        fs.close(fd)
        _remove_quietly(fs, tmp_path)
        raise
    return Snapshot(
        fd=fd, path=tmp_path, bytes=size, kept=kept, pruned=pruned, next_seq=next_seq, cutoff=cutoff
    )


def switch(fs: FileOps, snap: Snapshot, carry: bytes, log_path: str) -> None:
    """Make the snapshot plus the carry-over the log. Raises on any I/O error."""
    if carry:
        fs.write(snap.fd, carry)
    fs.fdatasync(snap.fd)
    fs.replace(snap.path, log_path)
    fs.fsync_dir(os.path.dirname(log_path) or ".")


def abandon(fs: FileOps, snap: Snapshot) -> None:
    fs.close(snap.fd)
    _remove_quietly(fs, snap.path)


def _remove_quietly(fs: FileOps, path: str) -> None:
    # Only for cleaning up after a failure that is already being raised or logged.
    try:
        fs.remove(path)
    except FileNotFoundError:
        pass


class CompactionHost(Protocol):
    """What a ``Compactor`` needs from its store."""

    fs: FileOps
    path: str
    tmp_path: str

    def snapshot_state(self) -> SnapshotState:
        """Every job and schedule, the next sequence number, the retention cutoff, now."""
        ...

    def switched(self, snap: Snapshot, carried: int) -> int:
        """The new log is in place: adopt its descriptor and sizes; returns jobs pruned."""
        ...

    def log_bytes(self) -> int: ...

    def jobs_kept(self) -> int: ...

    def on_io(self, fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
        """Run ``fn`` on the store's I/O thread (the one that appends)."""
        ...

    def wake(self) -> None:
        """Have the writer call ``on_idle`` soon."""
        ...


Waiters = list[asyncio.Future[CompactionReport]]


class Compactor:
    """Snapshot on its own thread while appends go on; switch between two batches."""

    def __init__(self, host: CompactionHost) -> None:
        self._host = host
        self._snap_io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="walq-snap")
        self._snapshot: asyncio.Future[Snapshot] | None = None
        self._requested = False
        self._carry: list[bytes] = []
        self._waiters: Waiters = []  # asked, not started yet
        self._inflight: Waiters = []  # waiting on the snapshot being written
        self._started = 0.0
        self._started_at = 0.0
        self._bytes_before = 0
        self.compactions = 0
        self.failures = 0
        self.max_switch_stall_s = 0.0
        self.carried_bytes = 0  # appended during the last compaction, carried to the new log
        self.last: CompactionReport | None = None
        self.last_at = 0.0  # wall-clock seconds the last compaction started at

    @property
    def running(self) -> bool:
        return self._snapshot is not None

    def request(self) -> None:
        """Compact at the writer's next idle moment (the log outgrew its live size)."""
        self._requested = True

    async def compact(self) -> CompactionReport:
        """Compact now, and wait for the report."""
        waiter: asyncio.Future[CompactionReport] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._requested = True
        self._host.wake()
        return await waiter

    def appended(self, data: bytes) -> None:
        """A batch reached the old log: while a snapshot is written, carry it over too."""
        if self._snapshot is not None:
            self._carry.append(data)

    async def on_idle(self, failure: BaseException | None) -> None:
        """Between batches: finish a written snapshot, start a requested one."""
        if failure is not None:
            self._resolve(self._waiters + self._inflight, StoreFailedError(f"walq: {failure}"))
            self._waiters, self._inflight, self._requested = [], [], False
            return
        if self._snapshot is not None and self._snapshot.done():
            await self._finish(self._snapshot)
        if self._requested and self._snapshot is None:
            self._requested = False
            self._start()

    def _start(self) -> None:
        state = self._host.snapshot_state()
        now = state.now
        self._carry = []
        self._inflight, self._waiters = self._waiters, []
        self._started = time.perf_counter()
        self._started_at = now  # the host's wall clock, for /stats
        self._bytes_before = self._host.log_bytes()
        h = self._host
        fut = asyncio.get_running_loop().run_in_executor(
            self._snap_io, write_snapshot, h.fs, h.tmp_path, *state
        )
        self._snapshot = fut
        fut.add_done_callback(lambda _: self._host.wake())

    async def _finish(self, fut: asyncio.Future[Snapshot]) -> None:
        self._snapshot = None
        carry = b"".join(self._carry)
        self._carry = []
        waiters, self._inflight = self._inflight, []
        try:
            snap = fut.result()
        except OSError as exc:
            # The old log is untouched, so this is not fatal; report it and go on.
            self.failures += 1
            logger.error("walq: compaction failed, keeping the old log: %r", exc)
            self._resolve(waiters, StoreError(f"compaction failed: {exc}"))
            return
        t0 = time.perf_counter()
        try:
            await self._host.on_io(switch, self._host.fs, snap, carry, self._host.path)
        except OSError as exc:
            # Past the replace we cannot tell which file the directory names: fatal.
            self._resolve(waiters, StoreFailedError(f"compaction switch failed: {exc}"))
            raise StoreFailedError(f"compaction switch failed: {exc}") from exc
        pruned = self._host.switched(snap, len(carry))
        self.carried_bytes = len(carry)
        self.max_switch_stall_s = max(self.max_switch_stall_s, time.perf_counter() - t0)
        self.compactions += 1
        report = CompactionReport(
            bytes_before=self._bytes_before,
            bytes_after=self._host.log_bytes(),
            jobs_kept=self._host.jobs_kept(),
            jobs_pruned=pruned,
            seconds=time.perf_counter() - self._started,
        )
        self.last, self.last_at = report, self._started_at
        logger.info("walq: compacted %d -> %d bytes", report.bytes_before, report.bytes_after)
        self._resolve(waiters, report)

    async def close(self) -> None:
        """At the store's close: drop a snapshot in flight; nobody waits any longer."""
        if self._snapshot is not None:
            try:
                abandon(self._host.fs, await self._snapshot)
            except OSError:
                pass  # the old log is intact, and the stale tmp is removed at open
            self._snapshot = None
        self._resolve(self._waiters + self._inflight, StoreClosedError("walq store closed"))
        self._waiters, self._inflight = [], []
        self._snap_io.shutdown(wait=True)

    def stats(self) -> dict[str, Any]:
        return {
            "compactions": self.compactions,
            "compaction_failures": self.failures,
            "compacting": self.running,
            "max_compaction_stall_ms": round(self.max_switch_stall_s * 1000, 3),
            "last_compaction_carried_bytes": self.carried_bytes,
            "last_compaction": None
            if self.last is None
            else {
                "at": self.last_at,
                "jobs_pruned": self.last.jobs_pruned,
                "bytes_before": self.last.bytes_before,
                "bytes_after": self.last.bytes_after,
                "seconds": round(self.last.seconds, 6),
            },
        }

    @staticmethod
    def _resolve(waiters: Waiters, outcome: CompactionReport | BaseException) -> None:
        for w in waiters:
            if w.done():
                continue
            if isinstance(outcome, BaseException):
                w.set_exception(outcome)
            else:
                w.set_result(outcome)
