"""The scheduler: lanes per queue, one dispatcher task, and the workers waiting for a job.

A job leaves the lanes only when a worker takes it, never ahead of one, so a job
that arrives with a higher priority is the very next one to start. ``take``
pops the next due job at once when there is one (no task switch on the hot
path: an extra hop through the dispatcher cost ~0.3 ms per job, measured);
otherwise the worker waits, longest first, and ``add`` hands a due job straight
to it. The dispatcher task only wakes waiting workers when delayed jobs come
due: it sleeps on one timer armed for the earliest ``ready_at``, re-armed by
``add`` for an earlier one. No polling loop.

Each named queue has its own lanes. A queue may be closed for now (paused, or
running as many jobs as its cap allows): ``gate`` says which, and ``poke``
tells the dispatcher when that may have changed. Of the open queues, the one
whose next job has the highest priority goes first; ties take turns, so one
queue cannot starve another of equal priority.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Callable, Sequence
from operator import attrgetter

from common.clock import Clock
from common.models import Job
from common.runtime.lanes import Lanes

_ID, _DUE, _PRIORITY = attrgetter("id"), attrgetter("ready_at"), attrgetter("priority")

Gate = Callable[[str], bool]  # may a job of this queue start now?
Taken = Callable[[str], None]  # a job of this queue was handed to a worker


class Scheduler:
    def __init__(
        self, clock: Clock, gate: Gate = lambda _: True, taken: Taken = lambda _: None
    ) -> None:
        self._clock = clock
        self._gate = gate
        self._taken = taken  # called before the next gate check, so a cap counts it at once
        self._queues: dict[str, Lanes] = {}
        self._turn = 0  # rotates ties between queues
        # workers, longest-waiting first; each gets (job id, its queue)
        self._waiting: deque[asyncio.Future[tuple[str, str]]] = deque()
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

    def add(self, job_id: str, ready_at: float, priority: int = 0, queue: str = "default") -> None:
        lanes = self._queues.get(queue)
        if lanes is None:
            lanes = self._queues[queue] = Lanes()
        delayed = lanes.push(job_id, ready_at, priority, self._clock.time())
        # With every worker busy there is nobody to hand it to: the next take pops it.
        if self._waiting:
            if not delayed:
                self._hand_out()
            elif ready_at < self._armed:
                self._wake.set()  # re-arm the timer for the earlier one

    def load(self, jobs: Sequence[Job]) -> None:
        """Many scheduled jobs at once, before any worker waits (recovery): one heapify per
        queue instead of a push per job."""
        by_queue: dict[str, list[Job]] = {}
        if len({job.queue for job in jobs}) == 1:
            by_queue[jobs[0].queue] = list(jobs)
        else:
            for job in jobs:
                by_queue.setdefault(job.queue, []).append(job)
        now = self._clock.time()
        for queue, group in by_queue.items():
            lanes = self._queues.get(queue)
            if lanes is None:
                lanes = self._queues[queue] = Lanes()
            lanes.load(
                list(map(_ID, group)), list(map(_DUE, group)), list(map(_PRIORITY, group)), now
            )
        if self._waiting:
            self._hand_out()
            self._wake.set()

    async def take(self) -> tuple[str, str]:
        """The next due job's id and queue; waits until there is one."""
        if not self._waiting:  # nobody has waited longer: take the next one now
            taken = self._pop(self._clock.time())
            if taken is not None:
                self.dispatched += 1
                return taken
        waiter: asyncio.Future[tuple[str, str]] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        self._wake.set()  # the dispatcher arms the timer for the next delayed job
        return await waiter

    def _hand_out(self) -> None:
        """Give due jobs to waiting workers, longest-waiting first, while both last."""
        now = self._clock.time()
        while (worker := self._next_worker()) is not None:
            taken = self._pop(now)
            if taken is None:
                return
            self._waiting.popleft()
            worker.set_result(taken)
            self.dispatched += 1

    def poke(self) -> None:
        """A queue may have opened (capacity freed, resumed): look again."""
        if self._waiting:
            self._hand_out()

    def sizes(self) -> dict[str, int]:
        due = sum(lanes.sizes()["immediate"] for lanes in self._queues.values())
        delayed = sum(lanes.sizes()["delayed"] for lanes in self._queues.values())
        return {"immediate": due, "delayed": delayed, "workers_waiting": len(self._waiting)}

    def depth(self, queue: str) -> int:
        lanes = self._queues.get(queue)
        return len(lanes) if lanes is not None else 0

    def _pop(self, now: float) -> tuple[str, str] | None:
        """The next job of the open queue whose next job has the highest priority."""
        if len(self._queues) == 1:  # the common case: no choosing
            [(name, lanes)] = self._queues.items()
            job_id = lanes.pop(now) if self._gate(name) else None
            if job_id is None:
                return None
            self._taken(name)
            return job_id, name
        best: tuple[int, str, Lanes] | None = None
        names = list(self._queues)
        self._turn = (self._turn + 1) % max(1, len(names))
        for name in names[self._turn :] + names[: self._turn]:
            lanes = self._queues[name]
            top = lanes.peek(now)
            if top is not None and (best is None or top > best[0]) and self._gate(name):
                best = (top, name, lanes)
        if best is None:
            return None
        job_id = best[2].pop(now)
        assert job_id is not None  # peek saw it
        self._taken(best[1])
        return job_id, best[1]

    def _next_wakeup(self) -> float | None:
        times = [t for lanes in self._queues.values() if (t := lanes.next_wakeup()) is not None]
        return min(times) if times else None

    def _next_worker(self) -> asyncio.Future[tuple[str, str]] | None:
        while self._waiting and self._waiting[0].done():  # cancelled while it waited
            self._waiting.popleft()
        return self._waiting[0] if self._waiting else None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._hand_out()
            worker = self._next_worker()
            wake_at = self._next_wakeup() if worker is not None else None
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
