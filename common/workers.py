"""The worker pool and the health loop that replaces hung workers.

N worker tasks take job ids from the scheduler. While a worker holds a job its
handler heartbeats through ``JobContext.beat``. Every ``hb_timeout / 4`` the
health loop looks for a worker silent longer than ``hb_timeout``: that worker
is declared hung and *abandoned* (its job is requeued with a new epoch through
the retry policy, and a replacement starts at once). It is not cancelled,
because a handler stuck in a thread or process cannot be; if it ever finishes,
its result is fenced off by the epoch (and counted), and the task exits. So at
most N workers are ever live (not hung).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Protocol

from common.kinds import JobContext
from common.models import JSON, Job

log = logging.getLogger(__name__)


Claimed = asyncio.Future[bool]  # resolves once the claim is durable: True, or False if refused


class Runner(Protocol):
    """What a worker needs from the runtime."""

    def rng_for_job(self) -> Any: ...

    async def take(self) -> str: ...

    def claim(self, job_id: str) -> tuple[Job, Claimed] | None: ...

    def execute(self, job: Job, ctx: JobContext) -> Awaitable[JSON]: ...

    def succeeded(self, job: Job, result: JSON, claimed: Claimed) -> None: ...

    def failed(self, job: Job, error: str, claimed: Claimed) -> None: ...

    def hung(self, job: Job, claimed: Claimed) -> None: ...


@dataclass(eq=False, slots=True)
class Worker:
    wid: int
    task: asyncio.Task[None] | None = None
    ctx: JobContext | None = None
    claimed: Claimed | None = None
    hung: bool = False
    jobs_done: int = 0
    started_at: float = field(default_factory=time.monotonic)


def describe(exc: BaseException) -> str:
    text = str(exc)
    return (f"{type(exc).__name__}: {text}" if text else type(exc).__name__)[:1000]


class WorkerPool:
    def __init__(
        self, runner: Runner, *, workers: int, hb_timeout_s: float, healthcheck: bool
    ) -> None:
        self._runner = runner
        self.size = workers
        self.hb_timeout = hb_timeout_s
        self.healthcheck = healthcheck
        self.live: list[Worker] = []
        self.abandoned: list[Worker] = []
        self._ids = itertools.count(1)
        self._health_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._idle = asyncio.Event()  # set when stopping and no live worker holds a job
        self.declared_hung = 0
        self.replaced = 0
        self.max_live_seen = 0

    def start(self) -> None:
        for _ in range(self.size):
            self._spawn()
        if self.healthcheck:
            self._health_task = asyncio.create_task(self._health(), name="sqlq-health")

    def _spawn(self) -> None:
        w = Worker(next(self._ids))
        w.task = asyncio.create_task(self._work(w), name=f"sqlq-worker-{w.wid}")
        self.live.append(w)
        self.max_live_seen = max(self.max_live_seen, len(self.live))

    async def _work(self, w: Worker) -> None:
        runner = self._runner
        while not self._stopping:
            job_id = await runner.take()
            claim = runner.claim(job_id)
            if claim is None:
                continue
            job, claimed = claim
            ctx = JobContext(job, runner.rng_for_job())
            w.ctx, w.claimed = ctx, claimed
            try:
                result = await runner.execute(job, ctx)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                runner.failed(job, describe(exc), claimed)
            else:
                runner.succeeded(job, result, claimed)
            w.ctx = w.claimed = None
            w.jobs_done += 1
            if self._stopping and not self.busy():
                self._idle.set()
            if w.hung:
                # Declared hung while it worked: its job was requeued and a
                # replacement runs in its place. Its late outcome above is fenced.
                self.abandoned.remove(w)
                return

    async def _health(self) -> None:
        while True:
            await asyncio.sleep(self.hb_timeout / 4)
            self.check(time.monotonic())

    def check(self, now: float) -> list[Worker]:
        """Declare every worker silent for longer than ``hb_timeout`` hung."""
        hung = [
            w for w in self.live if w.ctx is not None and now - w.ctx.last_beat > self.hb_timeout
        ]
        for w in hung:
            assert w.ctx is not None
            assert w.claimed is not None
            w.hung = True
            self.live.remove(w)
            self.abandoned.append(w)
            self.declared_hung += 1
            log.warning(
                "worker %d silent for %.0f ms holding job %s: declared hung, replaced",
                w.wid,
                (now - w.ctx.last_beat) * 1000,
                w.ctx.job.id,
            )
            self._runner.hung(w.ctx.job, w.claimed)
            if not self._stopping:
                self._spawn()
                self.replaced += 1
        return hung

    def hurry(self) -> None:
        """Cut the grace period short (a second signal). Safe from a signal handler."""
        self._idle.set()

    def busy(self) -> int:
        return sum(1 for w in self.live if w.ctx is not None)

    async def stop(self, grace_s: float) -> None:
        """Take no new jobs; give running ones ``grace_s`` to finish; cancel the rest."""
        self._stopping = True
        if self._health_task is not None:
            self._health_task.cancel()
        if self.busy():
            try:
                await asyncio.wait_for(self._idle.wait(), grace_s)
            except TimeoutError:
                log.warning("grace period over: cancelling %d running jobs", self.busy())
        tasks = [w.task for w in (*self.live, *self.abandoned) if w.task is not None]
        if self._health_task is not None:
            tasks.append(self._health_task)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stats(self) -> dict[str, Any]:
        return {
            "configured": self.size,
            "live": len(self.live),
            "busy": self.busy(),
            "healthy": len(self.live),
            "hung_declared": self.declared_hung,
            "replaced": self.replaced,
            "abandoned_still_running": len(self.abandoned),
            "max_live_seen": self.max_live_seen,
            "healthcheck": self.healthcheck,
            "hb_timeout_ms": self.hb_timeout * 1000,
        }
