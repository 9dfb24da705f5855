"""What the tests of a running job share: a store that holds chosen commits, and counts;
waiting for a job to run; cancelling one that runs; cutting an attempt off with a stop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from sqlq.common.clock import SYSTEM_CLOCK
from sqlq.common.engine.memory import MemoryStore
from sqlq.common.models import Job, State, Transition
from sqlq.common.specs import JobSpec
from sqlq.common.store import Change, SyncLevel
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.kinds import Registry
from sqlq.runtime.service import Service
from tests.helpers import StoreFactory, final, submit, wait_for

Pick = Callable[[Transition], bool]


class HeldStore:
    """A memory store that records every transition it is asked to commit, and holds the
    commits of those ``pick`` chooses until ``gate`` is set (``held`` says one waits)."""

    def __init__(self, pick: Pick | None = None, **options: Any) -> None:
        self.inner = MemoryStore(**options)
        self.pick = pick
        self.gate = asyncio.Event()
        self.held = asyncio.Event()
        self.transitions: list[Transition] = []
        self.name, self.durable, self.shared = "memory", False, False
        self.sync: SyncLevel = "full"

    async def commit(self, changes: Sequence[Change]) -> None:
        ts = [c for c in changes if isinstance(c, Transition)]
        self.transitions += ts
        if self.pick is not None and any(self.pick(t) for t in ts):
            self.held.set()
            await self.gate.wait()
        await self.inner.commit(changes)

    def touches(self, job_id: str | None = None) -> list[Transition]:
        """The ``running -> running`` writes asked for (progress, checkpoints, cancels): every
        running transition of an attempt but its first (the claim)."""
        seen: set[tuple[str, int, int]] = set()
        out = []
        for t in self.transitions:
            if t.state is not State.RUNNING or (job_id is not None and t.job_id != job_id):
                continue
            attempt = (t.job_id, t.epoch, t.attempts)
            if attempt in seen:
                out.append(t)
            seen.add(attempt)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def asks_cancel(t: Transition) -> bool:
    return t.state is State.RUNNING and t.cancel_requested_at == t.updated_at


async def running(rt: Service, job_id: str) -> Job:
    """The job once its claim is durable and it runs."""
    out: list[Job] = []

    async def started() -> bool:
        job = await rt.get(job_id)
        if job is not None and job.state is State.RUNNING:
            out.append(job)
        return bool(out)

    await wait_for(started, 10, f"job {job_id} to run")
    return out[0]


async def cancelled_running(rt: Service, kind: str) -> Job:
    """A job of ``kind``, asked to cancel once it runs: the job as it ended."""
    job = await submit(rt, kind)
    await running(rt, job.id)
    await rt.cancel(job.id)
    return await final(rt, job.id)


async def cut_off(
    factory: StoreFactory,
    kinds: Registry,
    kind: str,
    during: Callable[[Service, Job], Awaitable[Job | None]],
    release: threading.Event,
) -> tuple[Service, Job, Job | None]:
    """A job of ``kind`` on a service over ``factory``'s files, stopped at once after
    ``during(service, job)`` (its attempt cut off: no outcome written; ``release`` lets the
    handler's thread go), then a second service on the same files, started: that service,
    the job as submitted, and what ``during`` returned."""
    config = RuntimeConfig(workers=2, seed=1)
    first = Service(factory(clock=SYSTEM_CLOCK), config, kinds=kinds)
    await first.start()
    try:
        [job], _ = await first.submit([JobSpec(kind=kind)])
        noted = await during(first, job)
        await first.stop(0)
    finally:
        release.set()
    second = Service(factory(clock=SYSTEM_CLOCK), config, kinds=kinds)
    await second.start()
    return second, job, noted
