"""``tests/fake_shared.py``'s shared store, with what remote workers need of it: a claim that
names its queues (``only``, ``besides``), kinds and holder; ``extend``; real remote leases
(``expired`` finds those run out, a fence's ``lease_from``/``lease_before`` holds them);
and a NOTIFY of new work to the other nodes. As ``SharedStore`` states it, so
``SharedSide`` can be tested without PostgreSQL (``test_remote_shared.py`` runs on it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import msgspec

from sqlq.common.errors import IllegalTransitionError
from sqlq.common.models import Job, State, Transition
from sqlq.common.protocol import remote_worker
from sqlq.common.store import Change, Extended, Fence, JobQuery, Lease
from tests.fake_shared import Database, FakeSharedStore


@dataclass
class RemoteDatabase(Database):
    wakes: dict[str, Callable[[], None]] = field(default_factory=dict)  # node -> its wake
    extends: int = 0  # extend statements run


class RemoteFakeStore(FakeSharedStore):
    db: RemoteDatabase

    def __init__(self, db: RemoteDatabase, node: str) -> None:
        super().__init__(db, node)

    async def commit(self, changes: Sequence[Change]) -> None:
        await super().commit(changes)
        if any(isinstance(c, Job) for c in changes) or any(
            isinstance(c, Transition) and c.state is State.SCHEDULED for c in changes
        ):
            for node, wake in self.db.wakes.items():
                if node != self.node:
                    wake()

    async def commit_fenced(self, changes: Sequence[Change], fence: Fence) -> None:
        for c in changes:
            if not isinstance(c, Transition):
                continue
            job = self.db.inner._index.get(c.job_id)
            lease = job.lease_until if job is not None else None
            if remote_worker(job.holder if job is not None else None) is not None:
                if fence.lease_from is not None and (lease is None or lease < fence.lease_from):
                    raise IllegalTransitionError(c.job_id, "the lease ran out")
                if fence.lease_before is not None and (lease is None or
                                                       lease >= fence.lease_before):  # fmt: skip
                    raise IllegalTransitionError(c.job_id, "the lease was renewed")
        await super().commit_fenced(changes, fence)

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
    ) -> list[Job]:
        jobs = await self.db.inner.list_jobs(JobQuery(state=State.SCHEDULED, limit=1000))
        due = sorted((j for j in jobs if j.ready_at <= now
                      and (only is None or j.queue in only) and j.queue not in besides
                      and (kinds is None or j.kind in kinds)),
                     key=lambda j: (-j.priority, j.ready_at))[:n]  # fmt: skip
        out = []
        for job in due:
            t = job.start(now, holder=holder or self.node, lease_until=lease_until)
            t = msgspec.structs.replace(t, epoch=job.epoch + 1)
            await self.db.inner.commit([t])
            self.db.holders[job.id] = holder or self.node
            out.append(job.apply(t))
        return out

    async def extend(self, now: float, leases: Sequence[Lease]) -> list[Extended]:
        self.db.extends += 1
        out = []
        for lease in leases:
            job = self.db.inner._index.get(lease.job_id)
            if (job is None or job.state is not State.RUNNING or job.epoch != lease.epoch
                    or job.holder != lease.holder or job.lease_until is None
                    or job.lease_until < now):  # fmt: skip
                continue
            t = job.renew(now, lease.lease_until, lease.progress)  # (a forced lease stays)
            await self.db.inner.commit([t])
            after = job.apply(t)
            assert after.lease_until is not None
            out.append(Extended(job.id, after.lease_until, job.cancel_requested_at is not None))
        return out

    async def expired(self, now: float, limit: int) -> list[Job]:
        jobs = await self.db.inner.list_jobs(JobQuery(state=State.RUNNING, limit=1000))
        return [j for j in jobs if remote_worker(j.holder) is not None
                and j.lease_until is not None and j.lease_until < now][:limit]  # fmt: skip

    def listen(self, wake: Callable[[], None], cancel: Callable[[str], None]) -> None:
        super().listen(wake, cancel)
        self.db.wakes[self.node] = wake
