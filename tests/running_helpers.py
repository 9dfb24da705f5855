"""What the tests of a running job share: a store that holds chosen commits, and counts."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from sqlq.common.engine.memory import MemoryStore
from sqlq.common.models import Job, State, Transition
from sqlq.common.store import Change
from sqlq.runtime.service import Service
from tests.helpers import wait_for

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
        self.name, self.durable, self.shared, self.sync = "memory", False, False, "full"

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
