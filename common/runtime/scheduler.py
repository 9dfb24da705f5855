"""The scheduler: the lanes, one dispatcher task, and the workers waiting for a job.

A worker that wants a job waits in ``take``. The dispatcher hands the next due
job (``Lanes.pop``: highest priority, then FIFO) to the worker that has waited
longest, and only then: it never takes a job out of the lanes ahead of a
worker, so a job that arrives with a higher priority is the very next one to
start. When nothing is due it sleeps on one timer armed for the earliest
``ready_at``; ``add`` wakes it early for a due job or a delayed one earlier than
the armed time, and ``take`` wakes it when a worker arrives. No polling loop.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque

from common.clock import Clock
from common.runtime.lanes import Lanes


class Scheduler:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lanes = Lanes()
        self._waiting: deque[asyncio.Future[str]] = deque()  # workers, longest-waiting first
        self._wake = asyncio.Event()
        self._armed = math.inf  # the ready_at the dispatcher's timer is set for
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self.dispatched = 0
        self.wakeups = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="sqlq-dispatcher")

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def add(self, job_id: str, ready_at: float, priority: int = 0) -> None:
        delayed = self._lanes.push(job_id, ready_at, priority, self._clock.time())
        # With every worker busy there is nobody to hand it to: a worker's take wakes us.
        if self._waiting and (not delayed or ready_at < self._armed):
            self._wake.set()

    async def take(self) -> str:
        """The next due job id; waits until there is one."""
        waiter: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        self._wake.set()
        return await waiter

    def sizes(self) -> dict[str, int]:
        return {**self._lanes.sizes(), "workers_waiting": len(self._waiting)}

    def _next_worker(self) -> asyncio.Future[str] | None:
        while self._waiting and self._waiting[0].done():  # cancelled while it waited
            self._waiting.popleft()
        return self._waiting[0] if self._waiting else None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            worker = self._next_worker()
            if worker is not None:
                job_id = self._lanes.pop(self._clock.time())
                if job_id is not None:
                    self._waiting.popleft()
                    worker.set_result(job_id)
                    self.dispatched += 1
                    continue
            wake_at = self._lanes.next_wakeup() if worker is not None else None
            self._wake.clear()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if wake_at is None:
                self._armed = math.inf
            else:
                self._armed = wake_at
                delay = max(0.0, wake_at - self._clock.time())
                self._timer = loop.call_later(delay, self._wake.set)
            await self._wake.wait()
            self.wakeups += 1
