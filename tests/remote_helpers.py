"""What the remote runtime's tests share: a service with remote queues on the fake clock,
and the protocol's calls (claim, heartbeat, report) as one-liners."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlq.common.clock import FakeClock
from sqlq.common.models import Job
from sqlq.common.protocol import (
    BeatItem,
    ClaimRequest,
    Granted,
    HeartbeatRequest,
    ProgressIn,
    Reported,
    What,
)
from sqlq.common.roles import ADMIN, Principal, Role
from sqlq.common.store import JobStore
from sqlq.runtime.kinds import Registry
from sqlq.runtime.service import Service
from tests.helpers import ServiceFactory, submit

REMOTE = frozenset({"r", "r2"})


def worker(name: str, *queues: str) -> Principal:
    """A worker principal for ``queues`` (none: every queue)."""
    return Principal(name, Role.WORKER, frozenset(queues) if queues else None)


async def remote_service(services: ServiceFactory, clock: FakeClock, **config: Any) -> Service:
    """A started service (memory engine, 2 in-process workers) whose queues ``r`` and ``r2``
    are remote."""
    config.setdefault("remote_queues", REMOTE)
    config.setdefault("workers", 2)
    rt = services(clock=clock, kinds=config.pop("kinds", Registry()), **config)
    await rt.start()
    return rt


async def remote_on(services: ServiceFactory, store: JobStore, clock: FakeClock,
                    jobs: int = 0) -> Service:  # fmt: skip
    """A started service on ``store`` whose queue ``r`` alone is remote (no in-process
    worker), with ``jobs`` jobs of kind ``k`` submitted to it."""
    rt = services(store, clock=clock, remote_queues=frozenset({"r"}), workers=0,
                  all_remote=False)  # fmt: skip
    await rt.start()
    for _ in range(jobs):
        await submit(rt, "k", queue="r")
    return rt


async def claim(
    rt: Service,
    queues: Sequence[str] = ("r",),
    *,
    who: Principal = ADMIN,
    worker_name: str = "w1",
    **req: Any,
) -> list[Granted]:
    answer = await rt.remote.claim(
        ClaimRequest(queues=list(queues), worker=worker_name, **req), who
    )
    return answer.claims


async def claim_one(rt: Service, **req: Any) -> Granted:
    [granted] = await claim(rt, **req)
    return granted


async def beat(
    rt: Service, *tokens: str, who: Principal = ADMIN, progress: ProgressIn | None = None
) -> list[Any]:
    answer = await rt.remote.heartbeat(
        HeartbeatRequest(items=[BeatItem(token=t, progress=progress) for t in tokens]), who
    )
    return list(answer.items)


async def report(rt: Service, token: str, what: What, who: Principal = ADMIN) -> Reported:
    return await rt.remote.report(token, what, who)


async def stored(rt: Service, job_id: str) -> Job:
    job = await rt.store.get(job_id)
    assert job is not None
    return job
