"""``tests/fake_shared.py``'s shared store, with what remote workers need of it: a claim that
names its queues (``only``, ``besides``), kinds and holder; ``extend``; real remote leases
(``expired`` finds those run out, a fence's ``lease_from``/``lease_before`` holds them);
and a NOTIFY of new work to the other nodes. As ``SharedStore`` states it, so
``SharedSide`` can be tested without PostgreSQL (``test_remote_shared.py`` runs on it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from sqlq.common.errors import IllegalTransitionError
from sqlq.common.models import Job, State, Transition
from sqlq.common.protocol import remote_worker
from sqlq.common.running import Progress
from sqlq.common.store import Change, Extended, Fence, JobQuery, Lease, Renewal
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


@dataclass
class LeasedDatabase(RemoteDatabase):
    node_leases: dict[str, float] = field(default_factory=dict)  # node-held job -> lease end


class LeasedStore(RemoteFakeStore):
    """``RemoteFakeStore`` with a node's leases as real as a remote worker's, as PostgreSQL
    keeps them (the fakes' nodes never lose theirs): a node's claim leases its jobs,
    ``renew`` extends the unexpired ones it holds, ``release`` ends them now (a clean
    stop), ``expired`` finds them run out, and a fence's ``lease_from``/``lease_before``
    holds them. Their ends are kept beside the rows (``Job.lease_until`` is not read)."""

    db: LeasedDatabase

    def __init__(self, db: LeasedDatabase, node: str) -> None:
        super().__init__(db, node)

    async def claim(self, n: int, now: float, lease_until: float, caps: Mapping[str, int],
                    **filters: Any) -> list[Job]:  # fmt: skip
        jobs = await super().claim(n, now, lease_until, caps, **filters)
        if filters.get("holder") is None:
            self.db.node_leases.update((job.id, lease_until) for job in jobs)
        return jobs

    async def renew(self, now: float, lease_until: float, held: Sequence[str],
                    progress: Mapping[str, Progress] | None = None) -> Renewal:  # fmt: skip
        leases, ran_out = self.db.node_leases, set()
        for job_id in held:
            if self.db.holders.get(job_id) != self.node:
                continue
            if leases.get(job_id, now) >= now:
                leases[job_id] = lease_until
            else:
                ran_out.add(job_id)
        kept = [i for i in held if i not in ran_out]
        renewal = await super().renew(now, lease_until, kept, progress)
        return Renewal(renewal.renewed, renewal.cancel_asked, renewal.lost | ran_out)

    async def release(self, now: float) -> int:
        mine = [i for i, node in self.db.holders.items() if node == self.node]
        for job_id in mine:
            self.db.node_leases[job_id] = now
        return len(mine)

    async def expired(self, now: float, limit: int) -> list[Job]:
        theirs = [j for i, until in self.db.node_leases.items() if until < now
                  and (j := self.db.inner._index.get(i)) is not None]  # fmt: skip
        return (await super().expired(now, limit) + theirs)[:limit]

    async def commit(self, changes: Sequence[Change]) -> None:
        await super().commit(changes)
        for job_id in [i for i in self.db.node_leases if i not in self.db.holders]:
            del self.db.node_leases[job_id]  # out of running: no lease left

    async def commit_fenced(self, changes: Sequence[Change], fence: Fence) -> None:
        for c in changes:
            until = self.db.node_leases.get(getattr(c, "job_id", ""))
            if until is None:
                continue
            if fence.lease_from is not None and until < fence.lease_from:
                raise IllegalTransitionError(c.job_id, "the lease ran out")  # type: ignore[union-attr]
            if fence.lease_before is not None and until >= fence.lease_before:
                raise IllegalTransitionError(c.job_id, "the lease was renewed")  # type: ignore[union-attr]
        await super().commit_fenced(changes, fence)
