"""``WalStore``: the JobStore on walq's append-only log.

State lives in memory (a ``JobIndex``); the log is its durable history. The
writer task turns a batch of commits into one ``write`` and one ``fdatasync``
on the engine's I/O thread, then publishes the batch to the index and wakes its
callers. Recovery is the fold of the log's valid prefix (see ``walq.log``),
every record through ``JobIndex.replay``, the same checks commits make; compaction
rewrites the log as a snapshot (see ``walq.compact``). Schedules share the index
and the records (``walq.records``), and a rule of their own (``walq.schedules``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from operator import attrgetter
from typing import Any

import msgspec

from sqlq.common.engine.base import DurableStore
from sqlq.common.engine.cascade import tell
from sqlq.common.engine.groupcommit import ENCODE_ERRORS, Pending, describe_unencodable
from sqlq.common.engine.index import JobIndex, Staged, expired, retired
from sqlq.common.engine.trim import release_freed
from sqlq.common.errors import (
    CorruptLogError,
    JobNotFoundError,
    SqlqError,
    StoreError,
    UnencodableError,
)
from sqlq.common.fair import Policy, stored_policies
from sqlq.common.models import TERMINAL, Job, State, Transition
from sqlq.common.schedule import AdvanceSchedule, Schedule
from sqlq.common.store import Cascaded, Change, CompactionReport, JobQuery, Recovery, StoreStats
from sqlq.walq import log, tail
from sqlq.walq.compact import Compactor, Snapshot, SnapshotState, create_fresh
from sqlq.walq.files import OS_FILES, FileOps
from sqlq.walq.queues import QUEUES_NAME, QueueFile, read_queues, write_queues
from sqlq.walq.records import (
    PatchOps,
    ScheduleOps,
    change_record,
    compacted,
    encode_ops,
    encode_patch,
    jobs_of,
    op_change,
    patch_of,
    snapshot_change,
)
from sqlq.walq.schedules import cursor_fixes, fix_note
from sqlq.walq.signing import KEY_NAME, load_or_make

logger = logging.getLogger(__name__)

LOG_NAME = "walq.log"
LOCK_NAME = "walq.lock"

# Compact once the log exceeds both this size and this many times its live size.
COMPACT_FLOOR_BYTES = 64 << 20
COMPACT_RATIO = 4.0


def _interleaved(changes: Sequence[Change], moves: Sequence[Cascaded]) -> list[Change]:
    """A call's changes with each one's cascade right after it, as ``stage`` applied them."""
    after: dict[int, list[Change]] = {}
    for m in moves:
        after.setdefault(id(m.cause), []).append(m.change)
    ops: list[Change] = []
    for change in changes:
        ops.append(change)
        ops.extend(after.get(id(change), ()))
    return ops


class WalStore(DurableStore):
    name = "walq"
    workflows = True
    lock_name = LOCK_NAME

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        *,
        fs: FileOps = OS_FILES,
        compact_floor_bytes: int = COMPACT_FLOOR_BYTES,
        compact_ratio: float = COMPACT_RATIO,
        **options: Any,
    ) -> None:
        super().__init__(data_dir, **options)
        self.path = os.path.join(self.dir, LOG_NAME)
        self.tmp_path = self.path + ".tmp"
        self.fs = fs
        self._floor = compact_floor_bytes
        self._ratio = compact_ratio
        self._index = JobIndex()
        # Finished jobs in the order they finished, so the ones past retention can be
        # forgotten in O(1) each; otherwise they would count as live and the log
        # could never grow past ratio x "live" size, and would never compact.
        self._finished: deque[tuple[float, str]] = deque()
        self._fd: int | None = None
        self._seq = 0
        self._log_bytes = 0
        self._job_bytes = 300.0  # estimated bytes per job in a snapshot
        self._snapshot_jobs = 0  # snapshot records the last recovery read
        self.records = 0
        self.compactor = Compactor(self)
        self.queues_path = os.path.join(self.dir, QUEUES_NAME)
        self._paused: set[str] = set()
        self._policies: dict[str, Any] = {}  # queue -> its policy as stored (JSON)
        self._pausing = asyncio.Lock()
        self._key: bytes | None = None

    # -- open / recovery ---------------------------------------------------------

    async def _recover(self) -> Recovery:
        try:
            return await self._on_io(self._recover_on_io)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot recover: {exc.strerror or exc}") from exc

    def _recover_on_io(self) -> Recovery:
        queues = read_queues(self.fs, self.queues_path)
        self._paused, self._policies = set(queues.paused), dict(queues.policies)
        recovery = self._recover_log()
        policies = stored_policies(
            [(q, msgspec.json.encode(p)) for q, p in queues.policies.items()]
        )
        return dataclasses.replace(recovery, paused_queues=sorted(self._paused),
                                   queue_policies=policies)  # fmt: skip

    def _recover_log(self) -> Recovery:
        t0 = time.perf_counter()
        fs = self.fs
        notes: list[str] = []
        if fs.exists(self.tmp_path):
            fs.remove(self.tmp_path)
            notes.append("removed a stale compaction file")
        if not fs.exists(self.path):
            create_fresh(fs, self.tmp_path, self.path, 1, self.clock.time())
            self._log_bytes = len(fs.read(self.path))
            self._fd = fs.open_append(self.path)
            return Recovery(jobs=[], running=[], records=0, seconds=time.perf_counter() - t0)
        data = fs.read(self.path)
        self._snapshot_jobs = 0
        sc = log.scan(data, self._fold)
        torn = 0
        if sc.bad_offset is not None:
            if sc.corrupt:
                raise CorruptLogError(self.path, sc.bad_offset, sc.bad_reason or "bad record")
            torn = len(data) - sc.bad_offset
            notes.append(tail.cut_torn(fs, self.path, data, sc.bad_offset, sc.bad_reason))
        if sc.header is None:
            create_fresh(fs, self.tmp_path, self.path, 1, self.clock.time())
            self._log_bytes = len(log.header(1, 0.0))
        else:
            self._log_bytes = sc.valid_end
        if self._snapshot_jobs:
            self._job_bytes = max(100.0, sc.valid_end / max(1, sc.records))
        self._seq = sc.last_seq if sc.header is not None else 0
        fixes = cursor_fixes(self._index.schedules, self._index.keys)  # before any is forgotten
        live, running, finished = self._sort_out()
        by_id = dict(self._index.jobs)  # (a copy of the table: no per-job work for the live)
        for _, job_id in finished:
            del by_id[job_id]
        self._finished = deque(finished)
        self._fd = fs.open_append(self.path)
        notes.extend(self._fix_cursors(fixes) if fixes else ())
        release_freed()  # what the fold made and dropped between the jobs it keeps
        return Recovery(
            jobs=live,
            running=running,
            by_id=by_id,
            records=sc.records,
            torn_bytes=torn,
            seconds=time.perf_counter() - t0,
            notes=notes,
        )

    def _sort_out(self) -> tuple[list[Job], list[str], list[tuple[float, str]]]:
        """In one pass over the recovered jobs: forget those past retention, and return the
        live ones, the running ones' ids, and the finished ones' (updated_at, id) in age
        order (for ``_expire``)."""
        cutoff = self._cutoff()
        held = self._index.held_workflows(cutoff)
        live: list[Job] = []
        running: list[str] = []
        finished: list[tuple[float, str]] = []
        doomed: list[str] = []
        for job in self._index.jobs.values():
            state = job.state
            if state not in TERMINAL:
                live.append(job)
                if state is State.RUNNING:
                    running.append(job.id)
            elif retired(job, cutoff, held):
                doomed.append(job.id)
            else:
                finished.append((job.updated_at, job.id))
        for job_id in doomed:
            self._index.forget(job_id)
        finished.sort()
        return live, running, finished

    def _fix_cursors(self, fixes: list[AdvanceSchedule]) -> list[str]:
        """Fold the recovery rule's advances and append them as one record, durable before
        any commit (see ``walq.schedules``); returns a note for each."""
        self._index.replay(fixes)
        self._append(data := change_record(self._seq + 1, encode_ops(fixes)))
        self._seq, self.records = self._seq + 1, self.records + 1
        self._log_bytes += len(data)
        logger.warning("walq: %s", "; ".join(notes := [fix_note(f) for f in fixes]))
        return notes

    def _fold(self, offset: int, is_snapshot: bool, record: Any) -> None:
        """One record of the log into the state (``JobIndex.replay``: ``Job.apply`` checks; a
        snapshot's job ``JobIndex.insert``, the same checks), as ``log.scan`` reads it."""
        replay = self._index.replay
        try:
            if is_snapshot and type(record) is Job:  # (nearly every record of a snapshot)
                self._index.insert(record.compact())
                self._snapshot_jobs += 1
            elif is_snapshot:  # a job as read (its typed decode failed), or a schedule
                replay([snapshot_change(record)])
                self._snapshot_jobs += 1
            elif isinstance(record, log.ChangeRecord):
                self._replay([compacted(op.change()) for op in record.ops])
            else:
                self._replay([compacted(op_change(op)) for op in record["ops"]])
        except (KeyError, TypeError, ValueError, SqlqError) as exc:
            what = "bad snapshot record" if is_snapshot else "record does not fold"
            raise CorruptLogError(self.path, offset, f"{what}: {exc!r}") from exc

    def _replay(self, changes: list[Change | log.Patch]) -> None:
        """A change record's changes into the state, in order; a patch as the transition it
        stands for on its job as it then is."""
        if not any(type(c) is log.Patch for c in changes):
            self._index.replay(changes)  # type: ignore[arg-type]  # (no patch among them)
            return
        for change in changes:
            if isinstance(change, log.Patch):
                job = self._index.get(change.job_id)
                if job is None:
                    raise JobNotFoundError(change.job_id)
                change = change.transition(job)
            self._index.replay([change])

    async def _release(self) -> None:
        await self.compactor.close()
        if self._fd is not None:
            self.fs.close(self._fd)
            self._fd = None

    # -- commits -------------------------------------------------------------------

    def _encode(self, changes: Sequence[Change]) -> bytes:
        """A call's ops, on the caller's turn (see ``GroupCommitter``): a running job's
        change of only what its attempt reports, alone in its call, as a patch (checked here
        against the committed job, and again in the batch: ``_flush``)."""
        if len(changes) == 1:
            t = changes[0]
            if type(t) is Transition and t.state is State.RUNNING:  # (a start is too: cheap)
                job = self._index.jobs.get(t.job_id)
                patch = None if job is None else patch_of(job, t)
                if patch is not None:
                    return encode_patch(patch)
        return encode_ops(changes)

    def _checked(self, pending: Pending, staged: Staged) -> bytes:
        """A patch's op if it still is exactly its transition on the job as staged before
        it in this batch; else the call encoded whole (``UnencodableError`` if it cannot)."""
        t = pending.changes[0]
        assert isinstance(t, Transition)
        before = staged[t.job_id] if t.job_id in staged else self._index.get(t.job_id)
        if isinstance(before, Job) and patch_of(before, t) is not None:
            return bytes(pending.encoded)
        try:
            return encode_ops(pending.changes)
        except ENCODE_ERRORS as exc:
            raise UnencodableError(describe_unencodable(exc)) from exc

    async def _flush(self, batch: list[Pending]) -> list[BaseException | None]:
        staged: Staged = {}
        staged_keys: set[str] = set()
        outcomes: list[BaseException | None] = []
        lines: list[bytes] = []
        seq = self._seq
        scheduled = False  # whether a call changed a schedule: then not every value is a job
        cascaded: list[Cascaded] = []
        adopted: dict[str, list[str]] = {}  # the batch's new members, by parent (``stage``)
        cutoff = self._cutoff()  # (a job past it is gone: a snapshot in flight left it out)
        for pending in batch:
            encoded = pending.encoded
            before = len(cascaded)
            try:
                if type(encoded) is PatchOps:
                    encoded = self._checked(pending, staged)
                mine = self._index.stage(
                    pending.changes, staged, staged_keys, cascaded, cutoff, adopted
                )
                if len(cascaded) > before:  # a workflow's children: in the parent's record
                    encoded = encode_ops(_interleaved(pending.changes, cascaded[before:]))
            except SqlqError as exc:
                del cascaded[before:]  # (what a refused call's stage had moved)
                outcomes.append(exc)
                continue
            staged.update(mine)
            jobs: dict[str, Job] = mine  # type: ignore[assignment]  # all jobs, unless:
            if type(encoded) is ScheduleOps:  # a schedule changed: not every value is a job
                scheduled, jobs = True, jobs_of(mine)
            staged_keys.update(j.idempotency_key for j in jobs.values() if j.idempotency_key)
            seq += 1
            lines.append(change_record(seq, encoded))
            outcomes.append(None)
        if lines:
            data = b"".join(lines)
            await self._on_io(self._append, data)
            self._seq = seq
            self._log_bytes += len(data)
            self.records += len(lines)
            self.compactor.appended(data)
            self._index.publish(staged)
            jobs = jobs_of(staged) if scheduled else staged  # type: ignore[assignment]
            self._finished.extend((j.updated_at, j.id) for j in jobs.values() if j.terminal)
            if self._should_compact():
                self.compactor.request()
            if cascaded:
                tell(self._cascade, cascaded)
        return outcomes

    def _append(self, data: bytes) -> None:
        """Write one batch and make it durable at the sync level. Runs on the I/O thread."""
        assert self._fd is not None
        self.fs.write(self._fd, data)
        if self.sync == "full":
            self.fs.fdatasync(self._fd)
            self._synced()

    def _cutoff(self) -> float:
        return self.clock.time() - self.retention

    def _expire(self) -> None:
        """Forget finished jobs past retention (the snapshot would leave them out)."""
        cutoff = self._cutoff()
        index = self._index
        jobs = index.jobs
        gone: dict[str, bool] = {}  # a workflow's verdict, once a pass
        while self._finished and self._finished[0][0] < cutoff:
            updated_at, job_id = self._finished.popleft()
            job = jobs.get(job_id)
            if job is None or not expired(job, cutoff) or job.updated_at != updated_at:
                continue
            if job.flow is None:
                index.forget(job_id)
                continue
            # A member goes with its whole workflow: when the last of them expires (each
            # finished member is in ``_finished``, the last one latest), every one goes.
            workflow_id = job.flow.workflow_id
            if workflow_id not in gone:
                gone[workflow_id] = index.workflow_expired(workflow_id, cutoff)
                if gone[workflow_id]:
                    for member in [j.id for j in index.workflow(workflow_id)]:
                        index.forget(member)

    def _should_compact(self) -> bool:
        if self.compactor.running or self._log_bytes < self._floor:
            return False
        self._expire()
        live = len(self._index) + len(self._index.schedules)
        return self._log_bytes > self._ratio * self._job_bytes * max(1, live)

    async def get(self, job_id: str) -> Job | None:
        self._live()
        return self._index.get(job_id)

    async def get_many(self, ids: Sequence[str]) -> list[Job | None]:
        self._live()
        return [self._index.get(i) for i in ids]

    async def set_queue_paused(self, queue: str, paused: bool) -> None:
        self._writable()
        # Shielded: the write runs even if the caller is cancelled (the I/O thread skips no
        # call), so the set in memory follows it whatever happens to the caller; one change
        # at a time, each built on the last one's set.
        await asyncio.shield(self._set_paused(queue, paused))

    async def _set_paused(self, queue: str, paused: bool) -> None:
        async with self._pausing:
            names = (self._paused | {queue}) if paused else (self._paused - {queue})
            await self._write_queues(names, self._policies)
            self._paused = names

    async def set_queue_policy(self, queue: str, policy: Policy | None) -> None:
        self._writable()
        await asyncio.shield(self._set_policy(queue, policy))  # (as ``set_queue_paused``)

    async def _set_policy(self, queue: str, policy: Policy | None) -> None:
        async with self._pausing:
            policies = dict(self._policies)
            if policy is None:
                policies.pop(queue, None)
            else:
                policies[queue] = msgspec.to_builtins(policy)
            await self._write_queues(self._paused, policies)
            self._policies = policies

    async def _write_queues(self, paused: set[str], policies: dict[str, Any]) -> None:
        queues = QueueFile(sorted(paused), dict(sorted(policies.items())))
        try:
            await self._on_io(write_queues, self.fs, self.queues_path, queues)
        except OSError as exc:
            raise StoreError(f"{self.queues_path}: {exc.strerror or exc}") from exc

    async def signing_key(self) -> bytes:
        """``signing.key`` in the data directory (``walq.signing``), read once per open."""
        if self._key is None:
            self._writable()  # a failed store makes nothing durable, a key neither
            path = os.path.join(self.dir, KEY_NAME)
            try:
                self._key = await self._on_io(load_or_make, self.fs, path)
            except OSError as exc:
                raise StoreError(f"{path}: {exc.strerror or exc}") from exc
        return self._key

    async def list_jobs(self, query: JobQuery) -> list[Job]:
        self._live()
        return await self._index.page_async(query, asyncio.to_thread)  # a build: off the loop

    async def find_key(self, key: str) -> Job | None:
        self._live()
        return self._index.by_key(key)

    async def workflow(self, workflow_id: str) -> list[Job]:
        self._live()
        return self._index.workflow(workflow_id)

    async def list_schedules(self) -> list[Schedule]:
        self._live()
        return sorted(self._index.schedules.values(), key=attrgetter("name"))

    async def get_schedule(self, name: str) -> Schedule | None:
        self._live()
        return self._index.schedules.get(name)

    # -- compaction (the Compactor's host) ---------------------------------------------

    async def compact(self) -> CompactionReport:
        self._writable()
        return await self.compactor.compact()

    async def _idle(self) -> None:
        committer = self._committer
        await self.compactor.on_idle(committer.failure if committer is not None else None)

    def snapshot_state(self) -> SnapshotState:
        now = self.clock.time()
        # Jobs and schedules are immutable: the lists of references are the snapshot.
        index = self._index
        jobs, schedules = list(index.jobs.values()), list(index.schedules.values())
        cutoff = now - self.retention
        held = index.held_workflows(cutoff)
        return SnapshotState(jobs, schedules, self._seq + 1, cutoff, now, held)

    def switched(self, snap: Snapshot, carried: int) -> int:
        old, self._fd = self._fd, snap.fd
        if old is not None:
            self.fs.close(old)
        self._log_bytes = snap.bytes + carried
        self._job_bytes = max(100.0, snap.bytes / max(1, snap.kept))
        return self._index.prune(snap.cutoff)

    def log_bytes(self) -> int:
        return self._log_bytes

    def jobs_kept(self) -> int:
        return len(self._index)

    def on_io(self, fn: Callable[..., Any], *args: Any) -> Awaitable[Any]:
        return self._on_io(fn, *args)

    def wake(self) -> None:
        if self._committer is not None:
            self._committer.wake()

    # -- stats -----------------------------------------------------------------------------

    @property
    def last_compaction(self) -> CompactionReport | None:
        return self.compactor.last

    def stats(self) -> StoreStats:
        stats = super().stats()
        stats.disk_bytes = self._log_bytes  # in /stats: log_bytes
        last = self.compactor.last  # its own compactions too, not only the runtime's
        stats.last_compaction = None if last is None else (self.compactor.last_at, last)
        return stats

    def _detail(self) -> dict[str, Any]:
        return {
            "fsyncs": self.syncs,
            "records": self.records,
            "log_bytes": self._log_bytes,
            "jobs_indexed": len(self._index),
            **self.compactor.stats(),
        }
