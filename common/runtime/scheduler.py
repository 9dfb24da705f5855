"""The scheduler: two lanes, one dispatcher task, one bounded ready channel.

The dispatcher moves due jobs from the lanes into the ready channel, where the
workers take them. When nothing is due it sleeps on one timer armed for the
earliest ``ready_at``; ``add`` wakes it early for an immediate job or a delayed
one earlier than the armed time. There is no polling loop.

Workers and the HTTP layer only see ``add``, ``take`` and ``sizes``, so an
engine that claims jobs in its database (PostgreSQL, later) can replace the
in-memory lanes without either of them changing.
"""

from __future__ import annotations

import asyncio
import math

from common.clock import Clock
from common.runtime.lanes import Lanes


class Scheduler:
    def __init__(self, clock: Clock, channel_size: int) -> None:
        self._clock = clock
        self._lanes = Lanes()
        self._ready: asyncio.Queue[str] = asyncio.Queue(maxsize=max(1, channel_size))
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
        if not delayed or ready_at < self._armed:
            self._wake.set()

    async def take(self) -> str:
        """The next due job id; waits until there is one."""
        return await self._ready.get()

    def sizes(self) -> dict[str, int]:
        return {**self._lanes.sizes(), "ready_channel": self._ready.qsize()}

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            job_id = self._lanes.pop(self._clock.time())
            if job_id is not None:
                await self._ready.put(job_id)  # blocks while every worker is busy
                self.dispatched += 1
                continue
            wake_at = self._lanes.next_wakeup()
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
