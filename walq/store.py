"""``WalStore``: the JobStore on walq's append-only log.

State lives in memory (a ``JobIndex``); the log is its durable history. The
writer task turns a batch of commits into one ``write`` and one ``fdatasync``
on a dedicated I/O thread, then publishes the batch to the index and wakes its
callers. Recovery is the fold of the log's valid prefix (see ``walq.log``);
compaction rewrites it as a snapshot (see ``walq.compact``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from common.clock import SYSTEM_CLOCK, Clock
from common.engine.datadir import DirLock, prepare_dir
from common.engine.groupcommit import GroupCommitter, Pending
from common.engine.index import JobIndex
from common.errors import (
    CorruptLogError,
    SqlqError,
    StoreClosedError,
    StoreError,
    StoreFailedError,
)
from common.models import Job, State, Transition
from common.store import Change, CompactionReport, Recovery, SyncLevel
from walq import compact as compaction
from walq import log
from walq.files import OS_FILES, FileOps

logger = logging.getLogger(__name__)

LOG_NAME = "walq.log"
LOCK_NAME = "walq.lock"


def _op(change: Change) -> bytes:
    if isinstance(change, Job):
        return b'{"put":%s}' % msgspec.json.encode(change)
    return b'{"set":%s}' % msgspec.json.encode(change)


def encode_ops(changes: Sequence[Change]) -> bytes:
    """One commit call's ops, encoded on the caller's turn (see ``GroupCommitter``)."""
    return _op(changes[0]) if len(changes) == 1 else b",".join([_op(c) for c in changes])


def change_record(seq: int, ops: bytes) -> bytes:
    """One framed line holding one commit call's encoded ops."""
    return log.frame(b'{"seq":%d,"ops":[%s]}' % (seq, ops))


class WalStore:
    name = "walq"
    durable = True

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        sync: SyncLevel = "full",
        retention: float = 3600.0,
        clock: Clock = SYSTEM_CLOCK,
        fs: FileOps = OS_FILES,
        group_commit: bool = True,
        compact_floor_bytes: int = 64 << 20,
        compact_ratio: float = 4.0,
        sync_delay_s: float = 0.0,
    ) -> None:
        self.sync: SyncLevel = sync
        self.dir = os.fspath(data_dir)
        self.path = os.path.join(self.dir, LOG_NAME)
        self.tmp_path = self.path + ".tmp"
        self._retention = retention
        self._clock = clock
        self._fs = fs
        self._group = group_commit
        self._floor = compact_floor_bytes
        self._ratio = compact_ratio
        # Emulated extra disk latency, for the benchmark only; always reported in stats.
        self._sync_delay = sync_delay_s
        self._index = JobIndex()
        # Finished jobs in the order they finished, so the ones past retention can be
        # forgotten in O(1) each; otherwise they would count as live and the log
        # could never grow past ratio x "live" size, and would never compact.
        self._finished: deque[tuple[float, str]] = deque()
        self._fd: int | None = None
        self._lock = DirLock(self.dir, LOCK_NAME)
        self._seq = 0
        self._log_bytes = 0
        self._job_bytes = 300.0  # estimated bytes per job in a snapshot
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="walq-io")
        self._snap_io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="walq-snap")
        self._committer: GroupCommitter | None = None
        self._opened = False
        # compaction
        self._compact_requested = False
        self._snap_future: asyncio.Future[compaction.Snapshot] | None = None
        self._carry: list[bytes] = []
        self._waiters: list[asyncio.Future[CompactionReport]] = []
        self._inflight: list[asyncio.Future[CompactionReport]] = []
        self._snap_started = 0.0
        self._log_bytes_before = 0
        # counters
        self.syncs = 0
        self.records = 0
        self.compactions = 0
        self.compaction_failures = 0
        self.max_switch_stall_s = 0.0
        self.carried_bytes = 0  # appended during the last compaction, carried to the new log
        self.last_compaction: CompactionReport | None = None

    # -- open / recovery ---------------------------------------------------------

    async def open(self) -> Recovery:
        if self._opened:
            raise StoreError("walq store was already opened")
        self._opened = True
        prepare_dir(self.dir)
        self._lock.acquire()
        loop = asyncio.get_running_loop()
        try:
            recovery = await loop.run_in_executor(self._io, self._recover)
        except OSError as exc:
            self._lock.release()
            raise StoreError(f"{self.path}: cannot recover: {exc.strerror or exc}") from exc
        except BaseException:
            self._lock.release()
            raise
        self._committer = GroupCommitter(
            self._flush,
            encode=encode_ops,
            name="walq",
            group=self._group,
            between=self._between,
            on_fail=self._on_fail,
        )
        self._committer.start()
        return recovery

    def _recover(self) -> Recovery:
        t0 = time.perf_counter()
        fs = self._fs
        notes: list[str] = []
        if fs.exists(self.tmp_path):
            fs.remove(self.tmp_path)
            notes.append("removed a stale compaction file")
        if not fs.exists(self.path):
            self._create_fresh(start_seq=1)
            self._log_bytes = len(fs.read(self.path))
            self._fd = fs.open_append(self.path)
            return Recovery(jobs=[], running=[], records=0, seconds=time.perf_counter() - t0)
        data = fs.read(self.path)
        sc = log.scan(data)
        torn = 0
        if sc.bad_offset is not None:
            if sc.corrupt:
                raise CorruptLogError(self.path, sc.bad_offset, sc.bad_reason or "bad record")
            torn = len(data) - sc.bad_offset
            kept_as = self._cut(data, sc.bad_offset)
            notes.append(
                f"torn tail of {torn} bytes at offset {sc.bad_offset} ({sc.bad_reason}); "
                f"kept as {kept_as}"
            )
            logger.warning("walq: %s", notes[-1])
        if sc.header is None:
            self._create_fresh(start_seq=1)
            self._log_bytes = len(log.header(1, 0.0))
        else:
            self._log_bytes = sc.valid_end
        self._fold(sc)
        self._seq = sc.last_seq if sc.header is not None else 0
        self._index.prune(self._clock.time() - self._retention)
        self._finished = deque(
            sorted((j.updated_at, j.id) for j in self._index.jobs.values() if j.terminal)
        )
        self._fd = fs.open_append(self.path)
        live = self._index.live()
        return Recovery(
            jobs=live,
            running=[j.id for j in live if j.state is State.RUNNING],
            records=len(sc.snapshot) + len(sc.changes),
            torn_bytes=torn,
            seconds=time.perf_counter() - t0,
            notes=notes,
        )

    def _create_fresh(self, start_seq: int) -> None:
        fd = self._fs.open_new(self.tmp_path)
        try:
            self._fs.write(fd, log.header(start_seq, self._clock.time()))
            self._fs.fdatasync(fd)
        finally:
            self._fs.close(fd)
        self._fs.replace(self.tmp_path, self.path)
        self._fs.fsync_dir(self.dir)

    def _cut(self, data: bytes, offset: int) -> str:
        """Move ``data[offset:]`` aside, truncate the log there, and sync both."""
        return cut_tail(self._fs, self.path, data, offset)

    def _fold(self, sc: log.Scan) -> None:
        jobs = self._index.jobs
        try:
            for snap in sc.snapshot:
                job = Job.from_dict(snap)
                jobs[job.id] = job
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptLogError(self.path, 0, f"bad snapshot record: {exc!r}") from exc
        if sc.snapshot:
            self._job_bytes = max(100.0, sc.valid_end / max(1, len(sc.snapshot) + len(sc.changes)))
        for offset, record in sc.changes:
            try:
                for op in record["ops"]:
                    if "put" in op:
                        job = Job.from_dict(op["put"])
                        if job.id in jobs:
                            raise ValueError(f"job {job.id} submitted twice")
                        jobs[job.id] = job
                    else:
                        t = Transition.from_dict(op["set"])
                        current = jobs.get(t.job_id)
                        if current is None:
                            raise ValueError(f"change to unknown job {t.job_id}")
                        jobs[t.job_id] = current.apply(t)
            except (KeyError, TypeError, ValueError, SqlqError) as exc:
                raise CorruptLogError(self.path, offset, f"record does not fold: {exc}") from exc

    # -- commits -------------------------------------------------------------------

    async def commit(self, changes: Sequence[Change]) -> None:
        if not changes:
            return
        if self._committer is None:
            raise StoreClosedError("walq store is not open")
        await self._committer.submit(changes)

    async def _flush(self, batch: list[Pending]) -> list[BaseException | None]:
        staged: dict[str, Job] = {}
        outcomes: list[BaseException | None] = []
        lines: list[bytes] = []
        seq = self._seq
        for pending in batch:
            try:
                mine = self._index.stage(pending.changes, staged)
            except SqlqError as exc:
                outcomes.append(exc)
                continue
            staged.update(mine)
            seq += 1
            lines.append(change_record(seq, pending.encoded))
            outcomes.append(None)
        if lines:
            data = b"".join(lines)
            await asyncio.get_running_loop().run_in_executor(self._io, self._append, data)
            self._seq = seq
            self._log_bytes += len(data)
            self.records += len(lines)
            if self._snap_future is not None:
                self._carry.append(data)
            self._index.publish(staged)
            self._finished.extend((j.updated_at, j.id) for j in staged.values() if j.terminal)
            if self._should_compact():
                self._compact_requested = True
        return outcomes

    def _append(self, data: bytes) -> None:
        """Write one batch and make it durable at the sync level. Runs on the I/O thread."""
        assert self._fd is not None
        self._fs.write(self._fd, data)
        if self.sync == "full":
            self._fs.fdatasync(self._fd)
            if self._sync_delay:
                time.sleep(self._sync_delay)
            self.syncs += 1

    def _expire(self) -> None:
        """Forget finished jobs past retention (the snapshot would leave them out)."""
        cutoff = self._clock.time() - self._retention
        jobs = self._index.jobs
        while self._finished and self._finished[0][0] < cutoff:
            updated_at, job_id = self._finished.popleft()
            job = jobs.get(job_id)
            if job is not None and job.terminal and job.updated_at == updated_at:
                del jobs[job_id]

    def _should_compact(self) -> bool:
        if self._snap_future is not None or self._log_bytes < self._floor:
            return False
        self._expire()
        return self._log_bytes > self._ratio * self._job_bytes * max(1, len(self._index))

    async def get(self, job_id: str) -> Job | None:
        if self._committer is None:
            raise StoreClosedError("walq store is not open")
        return self._index.get(job_id)

    # -- compaction ------------------------------------------------------------------

    async def compact(self) -> CompactionReport:
        if self._committer is None:
            raise StoreClosedError("walq store is not open")
        if self._committer.failure is not None:
            raise StoreFailedError(f"walq has failed: {self._committer.failure}")
        waiter: asyncio.Future[CompactionReport] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._compact_requested = True
        self._committer.poke()
        return await waiter

    def _on_fail(self, exc: BaseException) -> None:
        """The writer failed: compactions asked for will never run; say so now."""
        failure = StoreFailedError(f"walq has failed: {exc}")
        _resolve(self._waiters + self._inflight, exc=failure)
        self._waiters, self._inflight = [], []
        self._compact_requested = False

    async def _between(self) -> None:
        """Runs in the writer task between batches: start or finish a compaction."""
        if self._snap_future is not None and self._snap_future.done():
            await self._finish_compaction(self._snap_future)
        if self._compact_requested and self._snap_future is None:
            self._compact_requested = False
            self._start_compaction()

    def _start_compaction(self) -> None:
        now = self._clock.time()
        jobs = list(self._index.jobs.values())  # jobs are immutable: the refs are the snapshot
        self._carry = []
        self._inflight, self._waiters = self._waiters, []
        self._snap_started = time.perf_counter()
        self._log_bytes_before = self._log_bytes
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(
            self._snap_io,
            compaction.write_snapshot,
            self._fs,
            self.tmp_path,
            jobs,
            self._seq + 1,
            now - self._retention,
            now,
        )
        self._snap_future = fut
        committer = self._committer
        if committer is not None:
            fut.add_done_callback(lambda _: committer.poke())

    async def _finish_compaction(self, fut: asyncio.Future[compaction.Snapshot]) -> None:
        self._snap_future = None
        carry = b"".join(self._carry)
        self._carry = []
        waiters, self._inflight = self._inflight, []
        try:
            snap = fut.result()
        except OSError as exc:
            # The old log is untouched, so this is not fatal; report it and go on.
            self.compaction_failures += 1
            logger.error("walq: compaction failed, keeping the old log: %r", exc)
            _resolve(waiters, exc=StoreError(f"compaction failed: {exc}"))
            return
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(
                self._io, compaction.switch, self._fs, snap, carry, self.path
            )
        except OSError as exc:
            # Past the replace we cannot tell which file the directory names: fatal.
            _resolve(waiters, exc=StoreFailedError(f"compaction switch failed: {exc}"))
            raise StoreFailedError(f"compaction switch failed: {exc}") from exc
        self.carried_bytes = len(carry)
        old, self._fd = self._fd, snap.fd
        if old is not None:
            self._fs.close(old)
        self.max_switch_stall_s = max(self.max_switch_stall_s, time.perf_counter() - t0)
        pruned = self._index.prune(snap.cutoff)
        before = self._log_bytes_before
        self._log_bytes = snap.bytes + len(carry)
        self._job_bytes = max(100.0, snap.bytes / max(1, snap.kept))
        self.compactions += 1
        report = CompactionReport(
            bytes_before=before,
            bytes_after=self._log_bytes,
            jobs_kept=len(self._index),
            jobs_pruned=pruned,
            seconds=time.perf_counter() - self._snap_started,
        )
        self.last_compaction = report
        logger.info("walq: compacted %d -> %d bytes", before, self._log_bytes)
        _resolve(waiters, report=report)

    # -- close / stats -------------------------------------------------------------------

    async def close(self) -> None:
        if self._committer is not None:
            await self._committer.close()
            self._committer = None
        if self._snap_future is not None:
            try:
                snap = await self._snap_future
                compaction.abandon(self._fs, snap)
            except OSError:
                pass  # already counted nowhere, and the old log is intact
            self._snap_future = None
        _resolve(self._waiters + self._inflight, exc=StoreClosedError("walq store closed"))
        self._waiters, self._inflight = [], []
        if self._fd is not None:
            self._fs.close(self._fd)
            self._fd = None
        self._io.shutdown(wait=True)
        self._snap_io.shutdown(wait=True)
        self._lock.release()

    def stats(self) -> dict[str, Any]:
        committer = self._committer.stats() if self._committer else {}
        return {
            "engine": self.name,
            "sync": self.sync,
            "group_commit": self._group,
            "emulated_sync_delay_ms": self._sync_delay * 1000,
            **committer,
            "fsyncs": self.syncs,
            "records": self.records,
            "log_bytes": self._log_bytes,
            "jobs_indexed": len(self._index),
            "compactions": self.compactions,
            "compaction_failures": self.compaction_failures,
            "compacting": self._snap_future is not None,
            "max_compaction_stall_ms": round(self.max_switch_stall_s * 1000, 3),
            "last_compaction_carried_bytes": self.carried_bytes,
        }


def _resolve(
    waiters: list[asyncio.Future[CompactionReport]],
    *,
    report: CompactionReport | None = None,
    exc: BaseException | None = None,
) -> None:
    for w in waiters:
        if w.done():
            continue
        if report is not None:
            w.set_result(report)
        else:
            w.set_exception(exc or StoreError("compaction abandoned"))


def broken_path(fs: FileOps, log_path: str) -> str:
    n = 1
    while fs.exists(f"{log_path}.broken-{n}"):
        n += 1
    return f"{log_path}.broken-{n}"


def cut_tail(fs: FileOps, log_path: str, data: bytes, offset: int) -> str:
    """Keep ``data[offset:]`` as ``<log>.broken-<n>``, then truncate the log at ``offset``.

    The aside copy is synced before the truncation, so the cut bytes are never
    only in memory.
    """
    aside = broken_path(fs, log_path)
    fd = fs.open_new(aside)
    try:
        fs.write(fd, data[offset:])
        fs.fdatasync(fd)
    finally:
        fs.close(fd)
    fs.fsync_dir(os.path.dirname(log_path) or ".")
    fd = fs.open_append(log_path)
    try:
        fs.truncate(fd, offset)
        fs.fdatasync(fd)
    finally:
        fs.close(fd)
    return aside
