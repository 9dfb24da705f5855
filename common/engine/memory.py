"""The memory engine: the protocol with no persistence at all.

It is the baseline that shows what durability costs, and the fake that runtime
and HTTP tests use. It shares ``JobIndex`` with walq, so its validation cannot
drift from a durable engine's.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Sequence

import msgspec

from sqlq.common.clock import SYSTEM_CLOCK, Clock
from sqlq.common.engine.cascade import tell
from sqlq.common.engine.groupcommit import ENCODE_ERRORS, describe_unencodable
from sqlq.common.engine.index import JobIndex
from sqlq.common.errors import StoreClosedError, StoreError, UnencodableError
from sqlq.common.fair import Policy
from sqlq.common.models import Job
from sqlq.common.schedule import Schedule
from sqlq.common.store import (
    DEFAULT_RETENTION_S,
    Cascaded,
    CascadeObserver,
    Change,
    CompactionReport,
    JobQuery,
    Recovery,
    StoreStats,
    SyncLevel,
)
from sqlq.common.tokens import KEY_BYTES

__all__ = ["MemoryStore"]


class MemoryStore:
    name = "memory"
    durable = False
    shared = False

    def __init__(
        self,
        *,
        sync: SyncLevel = "full",
        retention: float = DEFAULT_RETENTION_S,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.sync: SyncLevel = sync  # accepted for symmetry; nothing is ever synced
        self._retention = retention
        self._clock = clock
        self._index = JobIndex()
        self._open = False
        self._opened_once = False
        self._commits = 0
        self._changes = 0
        self._key: bytes | None = None

    async def open(self) -> Recovery:
        if self._opened_once:
            raise StoreError("memory store was already opened")
        self._open = self._opened_once = True
        return Recovery(jobs=[], running=[], records=0)

    def commit(self, changes: Sequence[Change]) -> Awaitable[None]:
        """Applied at the call, and a future already done (or failed) handed back: as a
        group commit's, never a coroutine a claim must wrap in a task to run."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        try:
            if not self._open:  # closed first, then empty: as every engine checks
                raise StoreClosedError("memory store is not open")
            if changes:
                try:
                    # Nothing is stored as bytes here, but a value a durable engine would
                    # refuse must be refused here too, or the fake hides the failure.
                    msgspec.json.encode(changes)
                except ENCODE_ERRORS as exc:
                    raise UnencodableError(describe_unencodable(exc)) from exc
                cascaded: list[Cascaded] = []
                self._index.apply(changes, cascaded)
                self._commits += 1
                self._changes += len(changes) + len(cascaded)
                if cascaded:
                    tell(self._cascade, cascaded)
        except Exception as exc:  # every error out of the await, as a coroutine's would be
            done.set_exception(exc)
        else:
            done.set_result(None)
        return done

    async def get(self, job_id: str) -> Job | None:
        if not self._open:
            raise StoreClosedError("memory store is not open")
        return self._index.get(job_id)

    async def get_many(self, ids: Sequence[str]) -> list[Job | None]:
        if not self._open:
            raise StoreClosedError("memory store is not open")
        return [self._index.get(i) for i in ids]

    async def list_jobs(self, query: JobQuery) -> list[Job]:
        if not self._open:
            raise StoreClosedError("memory store is not open")
        return await self._index.page_async(query, asyncio.to_thread)  # a build: off the loop

    async def workflow(self, workflow_id: str) -> list[Job]:
        if not self._open:
            raise StoreClosedError("memory store is not open")
        return self._index.workflow(workflow_id)

    async def find_key(self, key: str) -> Job | None:
        if not self._open:
            raise StoreClosedError("memory store is not open")
        return self._index.by_key(key)

    async def list_schedules(self) -> list[Schedule]:
        if not self._open:
            raise StoreClosedError("memory store is not open")
        return [self._index.schedules[n] for n in sorted(self._index.schedules)]

    async def get_schedule(self, name: str) -> Schedule | None:
        if not self._open:
            raise StoreClosedError("memory store is not open")
        return self._index.schedules.get(name)

    def observe_batches(self, observer: Callable[[int, float], None]) -> None:
        pass  # nothing is written, so there are no batches to report

    _cascade: CascadeObserver | None = None

    def observe_cascade(self, observer: CascadeObserver) -> None:
        self._cascade = observer

    async def set_queue_paused(self, queue: str, paused: bool) -> None:
        if not self._open:
            raise StoreClosedError("memory store is not open")
        # nothing to keep: a memory store is never reopened, so no Recovery reports it

    async def set_queue_policy(self, queue: str, policy: Policy | None) -> None:
        if not self._open:
            raise StoreClosedError("memory store is not open")
        # nothing to keep either (``set_queue_paused``)

    async def compact(self) -> CompactionReport:
        t0, began = time.perf_counter(), self._clock.time()
        kept_before = len(self._index)
        pruned = self._index.prune(self._clock.time() - self._retention)
        report = CompactionReport(
            bytes_before=0,
            bytes_after=0,
            jobs_kept=kept_before - pruned,
            jobs_pruned=pruned,
            seconds=time.perf_counter() - t0,
        )
        self._last_compaction = (began, report)
        return report

    async def signing_key(self) -> bytes:
        if self._key is None:
            self._key = os.urandom(KEY_BYTES)  # per process: nothing here outlives it
        return self._key

    async def close(self) -> None:
        self._open = False

    _last_compaction: tuple[float, CompactionReport] | None = None

    def stats(self) -> StoreStats:
        return StoreStats(
            engine=self.name,
            sync="none",
            durable=False,
            last_compaction=self._last_compaction,
            detail={
                "commits": self._commits,
                "changes": self._changes,
                "jobs_indexed": len(self._index),
            },
        )
