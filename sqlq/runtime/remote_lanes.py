"""``RemoteLanes``: the due jobs of remote queues in local mode, and the claims waiting on them.

In-process workers never take a remote queue's job, so those jobs never enter the
scheduler: each remote queue has lanes of its own (``Lanes``: priority, then due
order; a heap for delayed ones), kept only while they hold a job. A claim picks from
the queues it names (``pick``): one queue and no kinds pops the front, as a worker's
``take`` does; several queues are merged on (priority, due time), each in its own
order. A kinds filter looks past the jobs of other kinds, leaving them where they
are: it costs O(jobs passed over) per claim, at most ``SCAN`` of them per queue, so
a queue whose front holds many jobs of kinds nobody asking wants is better split by
kind.

A claim that found nothing waits on its queues' bells (``wait``): a job that becomes
due in one of them rings it, waking the waiters in the order they came up to the
first one with no kinds filter (one that filters may not want the job, so the one
after it is woken too); a resumed queue or a stop wakes them all. A waiter sleeps no
longer than until the earliest delayed job of its open queues comes due, on the
injected clock (``wait_event``), so a fake clock drives a long-poll too.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from collections.abc import Callable, Sequence

from sqlq.common.clock import Clock, wait_event
from sqlq.common.models import Job
from sqlq.runtime.lanes import Lanes

SCAN = 10_000  # jobs a kinds filter looks at per queue and claim, at most
MIN_WAIT_S = 0.001  # a waiter's shortest sleep (a job due now that it may not take)

Room = Callable[[str], int]  # how many jobs of this queue may start now (0: paused or full)


class _Waiter:
    __slots__ = ("event", "picky")

    def __init__(self, picky: bool) -> None:
        self.event = asyncio.Event()
        self.picky = picky  # filters by kind: may not want what woke it


class RemoteLanes:
    def __init__(self, clock: Clock, current: Callable[[Job], bool]) -> None:
        self._clock = clock
        self._current = current  # is this entry still the job as scheduled?
        self._queues: dict[str, Lanes[Job]] = {}  # only queues whose lanes hold an entry
        self._bells: dict[str, deque[_Waiter]] = {}  # queue -> claims waiting on it

    # -- what goes in -------------------------------------------------------------------

    def add(self, job: Job) -> None:
        lanes = self._queues.get(job.queue)
        if lanes is None:
            lanes = self._queues[job.queue] = Lanes(self._current)
        lanes.push(job, job.ready_at, job.priority, self._clock.time())
        if self._bells:
            self.ring(job.queue)

    def load(self, jobs: Sequence[Job]) -> None:
        """Many scheduled jobs at once (recovery)."""
        by_queue: dict[str, list[Job]] = {}
        for job in jobs:
            by_queue.setdefault(job.queue, []).append(job)
        now = self._clock.time()
        for name, group in by_queue.items():
            lanes = self._queues.get(name)
            if lanes is None:
                lanes = self._queues[name] = Lanes(self._current)
            lanes.load(group, [j.ready_at for j in group], [j.priority for j in group], now)

    def discard(self, job: Job) -> None:
        """``job``'s entry, still in its lanes, is no longer wanted (cancelled)."""
        lanes = self._queues.get(job.queue)
        if lanes is not None:
            lanes.discard(job.ready_at)
            self._drop_if_empty(job.queue, lanes)

    def _drop_if_empty(self, queue: str, lanes: Lanes[Job]) -> None:
        if not lanes.entries:
            del self._queues[queue]

    # -- what a claim takes -------------------------------------------------------------------

    def pick(
        self,
        queues: Sequence[str],
        n: int,
        now: float,
        want: Callable[[Job], bool] | None,
        room: Room,
    ) -> list[Job]:
        """Up to ``n`` due jobs of ``queues``, out of the lanes: priority first, then due
        time, each queue at most as many as ``room`` lets start (none of a paused one)."""
        if len(queues) == 1 and want is None:  # one queue, any kind: pop its front
            [queue] = queues
            lanes = self._queues.get(queue)
            if lanes is None:
                return []
            out: list[Job] = []
            for _ in range(min(n, room(queue))):
                job = lanes.pop(now)
                if job is None:
                    break
                out.append(job)
            self._drop_if_empty(queue, lanes)
            return out
        found: list[list[tuple[tuple[int, float], str, tuple[int, int, Job]]]] = []
        for queue in dict.fromkeys(queues):
            lanes = self._queues.get(queue)
            k = min(n, room(queue)) if lanes is not None else 0
            if lanes is None or k <= 0:
                continue
            entries = lanes.wanted(k, now, want, SCAN)
            if entries:
                found.append([((-p, job.ready_at), queue, (p, i, job)) for p, i, job in entries])
        if not found:
            return []
        chosen = found[0][:n] if len(found) == 1 else list(_first(n, found))
        taken: dict[str, list[tuple[int, int, Job]]] = {}
        for _, queue, entry in chosen:
            taken.setdefault(queue, []).append(entry)
        for queue, entries in taken.items():
            lanes = self._queues[queue]
            lanes.remove(entries)
            self._drop_if_empty(queue, lanes)
        return [entry[2] for _, _, entry in chosen]

    # -- waiting ------------------------------------------------------------------------------

    async def wait(self, queues: Sequence[str], picky: bool, within: float, room: Room) -> None:
        """Until a job may have become due in one of ``queues`` (rung), or ``within``."""
        now = self._clock.time()
        timeout = within
        for queue in queues:
            lanes = self._queues.get(queue)
            if lanes is not None and room(queue) > 0:
                wake = lanes.next_wakeup()
                if wake is not None:
                    timeout = min(timeout, wake - now)
        waiter = _Waiter(picky)
        bells = self._bells
        for queue in queues:
            bells.setdefault(queue, deque()).append(waiter)
        try:
            await wait_event(self._clock, waiter.event, max(timeout, MIN_WAIT_S))
        finally:
            for queue in queues:
                bell = bells.get(queue)
                if bell is None:
                    continue
                try:
                    bell.remove(waiter)
                except ValueError:
                    pass
                if not bell:
                    del bells[queue]

    def ring(self, queue: str, everyone: bool = False) -> None:
        """Wake the claims waiting on ``queue``: up to the first that takes any kind."""
        bell = self._bells.get(queue)
        if not bell:
            return
        while bell:
            waiter = bell.popleft()
            waiter.event.set()
            if not waiter.picky and not everyone:
                break
        if not bell:
            del self._bells[queue]

    def ring_all(self) -> None:
        for queue in list(self._bells):
            self.ring(queue, everyone=True)

    # -- what the listing shows -------------------------------------------------------------

    def depth(self, queue: str) -> int:
        lanes = self._queues.get(queue)
        return len(lanes) if lanes is not None else 0

    def waiting(self) -> int:
        """Claims waiting on some bell now (one waiting on several counts once per bell)."""
        return sum(len(bell) for bell in self._bells.values())

    def sizes(self) -> dict[str, int]:
        due = delayed = 0
        for lanes in self._queues.values():
            sizes = lanes.sizes()
            due += sizes["immediate"]
            delayed += sizes["delayed"]
        return {"immediate": due, "delayed": delayed, "queues": len(self._queues)}

    def held(self) -> dict[str, list[Job]]:
        """Every queue's entries still wanted (O(n): for checks such as the model test)."""
        return {name: lanes.held() for name, lanes in self._queues.items()}


def _first(
    n: int, found: list[list[tuple[tuple[int, float], str, tuple[int, int, Job]]]]
) -> list[tuple[tuple[int, float], str, tuple[int, int, Job]]]:
    """The first ``n`` of several queues' candidates, merged on (priority, due), each
    queue's in its own order."""
    out = []
    for item in heapq.merge(*found, key=lambda c: c[0]):
        out.append(item)
        if len(out) >= n:
            break
    return out
