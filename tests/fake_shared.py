"""A small fake ``SharedStore``: nodes over one memory store, for shared mode's runtime side.

What shared mode asks of the store for a running job (``request_cancel`` telling
the holder, a renewal that carries progress and answers the cancels asked for,
fenced writes) is faked here as the protocol states it, so ``SharedClaims`` can be
tested without PostgreSQL; it runs the part of the ``SharedStore`` contract it fakes
(``tests/test_store_contract_shared.py``), beside PostgreSQL. Leases never run out here
(nothing expires), and ``notify`` False drops every NOTIFY, so only the renewal's answer
tells the holder.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlq.common.engine.memory import MemoryStore
from sqlq.common.errors import IllegalTransitionError
from sqlq.common.fair import Policy
from sqlq.common.models import Job, State, Transition
from sqlq.common.protocol import remote_worker
from sqlq.common.running import Progress
from sqlq.common.store import Change, Fence, JobQuery, QueueCount, Recovery, Renewal


@dataclass
class Database:
    """What every node of the fake sees."""

    inner: MemoryStore = field(default_factory=MemoryStore)
    opened: bool = False
    holders: dict[str, str] = field(default_factory=dict)  # running job id -> node
    listeners: dict[str, Callable[[str], None]] = field(default_factory=dict)  # node -> cancel
    notify: bool = True
    renewals: list[dict[str, Progress]] = field(default_factory=list)  # progress per renewal
    policies: dict[str, Policy] = field(default_factory=dict)  # queue -> policy
    pushed_back: list[tuple[str, str | None, float]] = field(default_factory=list)


class FakeSharedStore:
    name, durable, shared, sync = "fakeshared", True, True, "full"

    def __init__(self, db: Database, node: str) -> None:
        self.db, self.node = db, node

    async def open(self) -> Recovery:
        if not self.db.opened:
            self.db.opened = True
            await self.db.inner.open()
        return Recovery(jobs=[], running=[], records=0)

    async def close(self) -> None:
        pass

    async def commit(self, changes: Sequence[Change]) -> None:
        await self.db.inner.commit([self._ruled(c) for c in changes])
        for c in changes:
            if isinstance(c, Transition) and c.state is not State.RUNNING:
                self.db.holders.pop(c.job_id, None)

    async def commit_fenced(self, changes: Sequence[Change], fence: Fence) -> None:
        for c in changes:
            if isinstance(c, Transition) and fence.holder is not None:
                if self.db.holders.get(c.job_id) != fence.holder:
                    raise IllegalTransitionError(c.job_id, "not held by this node")
        await self.commit(changes)

    def _ruled(self, c: Change) -> Change:
        """The statement's cancel rule: out of running to scheduled or dead, once a cancel was
        asked for, is cancelled (the holder may not have heard yet)."""
        if not isinstance(c, Transition) or c.state not in (State.SCHEDULED, State.DEAD):
            return c
        job = self.db.inner._index.get(c.job_id)
        if job is None or job.state is not State.RUNNING or job.cancel_requested_at is None:
            return c
        return job.withdraw(c.last_error or "cancelled", c.updated_at)

    async def claim(
        self, n: int, now: float, lease_until: float, caps: Mapping[str, int]
    ) -> list[Job]:
        due = [j for j in await self.db.inner.list_jobs(JobQuery(state=State.SCHEDULED, limit=1000))
               if j.ready_at <= now][:n]  # fmt: skip
        out = []
        for job in due:
            t = job.start(now, holder=self.node, lease_until=lease_until)  # (never runs out)
            t = Transition.from_dict({**t.to_dict(), "epoch": job.epoch + 1})
            await self.db.inner.commit([t])
            self.db.holders[job.id] = self.node
            out.append(job.apply(t))
        return out

    async def next_due(self, now: float, *, remote: bool = False) -> float | None:
        waiting = await self.db.inner.list_jobs(JobQuery(state=State.SCHEDULED, limit=1000))
        later = [j.ready_at for j in waiting if j.ready_at > now]
        return min(later) if later else None

    async def renew(self, now: float, lease_until: float, held: Sequence[str],
                    progress: Mapping[str, Progress] | None = None) -> Renewal:  # fmt: skip
        mine = [i for i in held if self.db.holders.get(i) == self.node]
        self.db.renewals.append(dict(progress or {}))
        asked = set()
        for job_id in mine:
            job = self.db.inner._index.get(job_id)
            if job is None:
                continue
            if progress and job_id in progress:
                await self.db.inner.commit([job.touch(now, progress=progress[job_id])])
            if job.cancel_requested_at is not None:
                asked.add(job_id)
        return Renewal(len(mine), frozenset(asked), frozenset(held) - frozenset(mine))

    async def request_cancel(
        self, job_id: str, now: float, *, forced_until: float | None = None
    ) -> Job | None:
        job = self.db.inner._index.get(job_id)
        if job is None or job.state is not State.RUNNING:
            return job
        first = job.cancel_requested_at is None
        if forced_until is not None and remote_worker(job.holder) and not job.cancel_forced:
            await self.db.inner.commit([job.force_cancel(now, forced_until)])  # (its lease held)
        elif first:
            await self.db.inner.commit([job.request_cancel(now)])
        if first:
            holder = self.db.holders.get(job_id)
            tell = self.db.listeners.get(holder or "")
            if self.db.notify and tell is not None:
                tell(job_id)
        return self.db.inner._index.get(job_id)

    def listen(self, wake: Callable[[], None], cancel: Callable[[str], None]) -> None:
        self.db.listeners[self.node] = cancel

    async def expired(self, now: float, limit: int) -> list[Job]:
        return []

    async def release(self, now: float) -> int:
        return 0

    async def census(self) -> list[QueueCount]:
        jobs = await self.db.inner.list_jobs(JobQuery(limit=1000))
        counts: dict[tuple[str, State], int] = {}
        for j in jobs:
            if not j.terminal:
                counts[j.queue, j.state] = counts.get((j.queue, j.state), 0) + 1
        return [QueueCount(q, s, n) for (q, s), n in counts.items()]

    async def paused_queues(self) -> list[str]:
        return []

    async def set_queue_policy(self, queue: str, policy: Policy | None) -> None:
        """A policy kept as the database keeps it; this fake's claim obeys none (the
        fair claim's contract runs on PostgreSQL, ``tests/test_postgres_fair.py``)."""
        if policy is None:
            self.db.policies.pop(queue, None)
        else:
            self.db.policies[queue] = policy

    async def queue_policies(self) -> dict[str, Policy]:
        return dict(self.db.policies)

    async def push_back(self, queue: str, key: str | None, hold_s: float) -> None:
        """Recorded, not obeyed (as the policies: its claim keeps none)."""
        self.db.pushed_back.append((queue, key, hold_s))

    async def finished(self, ids: Sequence[str]) -> list[Job]:
        return [j for i in ids if (j := self.db.inner._index.get(i)) is not None and j.terminal]

    async def get_many(self, ids: Sequence[str]) -> list[Job | None]:
        return [self.db.inner._index.get(i) for i in ids]

    async def nodes(self, now: float) -> list[dict[str, Any]]:
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.db.inner, name)
