"""``RemoteLanes``: the due jobs of remote queues in local mode, and the claims waiting on them.

In-process workers never take a remote queue's job, so those jobs never enter the
scheduler: each remote queue has lanes per kind (``Lanes``: priority, then due order; a
heap for delayed ones), a kind's lanes kept only while they hold a job. A claim compares
the fronts of the lanes it may take from (``pick``) and takes the best one, priority
first, then due time, again and again: a claim naming ``kinds`` looks only at those
kinds' lanes of its queues, so jobs of kinds nobody asking wants (a typo, a worker that
is down) never stand in front of it, and no claim scans past jobs it can't take. The
cost of a claim is O(L + n log L) for L lanes looked at: with ``kinds``, at most
(queues named) x (kinds named), bounded by the protocol's limits; without, every kind
that has a job waiting in the queues named (one lane per kind, so as many as there are
distinct kinds waiting). Stale (cancelled) fronts are dropped as ``Lanes.pop`` does, so
they cost a claim nothing past their one drop.

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
import itertools
from collections import deque
from collections.abc import Callable, Sequence

from sqlq.common.clock import Clock, wait_event
from sqlq.common.models import Job
from sqlq.runtime.lanes import Lanes

MIN_WAIT_S = 0.001  # a waiter's shortest sleep (a job due now that it may not take)

Entry = tuple[int, Job]  # (arrival, job): the arrival breaks ties between lanes
Room = Callable[[str], int]  # how many jobs of this queue may start now (0: paused or full)


class _Waiter:
    __slots__ = ("event", "picky")

    def __init__(self, picky: bool) -> None:
        self.event = asyncio.Event()
        self.picky = picky  # filters by kind: may not want what woke it


class RemoteLanes:
    def __init__(self, clock: Clock, current: Callable[[Job], bool]) -> None:
        self._clock = clock
        self._current: Callable[[Entry], bool] = lambda entry: current(entry[1])
        # queue -> kind -> its lanes; only kinds (and queues) whose lanes hold an entry
        self._queues: dict[str, dict[str, Lanes[Entry]]] = {}
        self._arrival = itertools.count()  # ties between lanes go to the job that came first
        self._bells: dict[str, deque[_Waiter]] = {}  # queue -> claims waiting on it

    # -- what goes in -------------------------------------------------------------------

    def _lanes(self, queue: str, kind: str) -> Lanes[Entry]:
        kinds = self._queues.get(queue)
        if kinds is None:
            kinds = self._queues[queue] = {}
        lanes = kinds.get(kind)
        if lanes is None:
            lanes = kinds[kind] = Lanes(self._current)
        return lanes

    def add(self, job: Job) -> None:
        lanes = self._lanes(job.queue, job.kind)
        lanes.push((next(self._arrival), job), job.ready_at, job.priority, self._clock.time())
        if self._bells:
            self.ring(job.queue)

    def load(self, jobs: Sequence[Job]) -> None:
        """Many scheduled jobs at once (recovery)."""
        groups: dict[tuple[str, str], list[Job]] = {}
        for job in jobs:
            groups.setdefault((job.queue, job.kind), []).append(job)
        now = self._clock.time()
        for (queue, kind), group in groups.items():
            lanes = self._lanes(queue, kind)
            entries = [(next(self._arrival), j) for j in group]
            lanes.load(entries, [j.ready_at for j in group], [j.priority for j in group], now)

    def discard(self, job: Job) -> None:
        """``job``'s entry, still in its lanes, is no longer wanted (cancelled)."""
        kinds = self._queues.get(job.queue)
        lanes = None if kinds is None else kinds.get(job.kind)
        if lanes is not None:
            lanes.discard(job.ready_at)
            self._drop_if_empty(job.queue, job.kind, lanes)

    def _drop_if_empty(self, queue: str, kind: str, lanes: Lanes[Entry]) -> None:
        if not lanes.entries:
            kinds = self._queues[queue]
            del kinds[kind]
            if not kinds:
                del self._queues[queue]

    def _looked_at(
        self, queue: str, kinds: frozenset[str] | None
    ) -> list[tuple[str, Lanes[Entry]]]:
        """The lanes of ``queue`` a claim for ``kinds`` (None: any) may take from."""
        by_kind = self._queues.get(queue)
        if by_kind is None:
            return []
        if kinds is None:
            return list(by_kind.items())
        return [(kind, by_kind[kind]) for kind in kinds if kind in by_kind]

    # -- what a claim takes -------------------------------------------------------------------

    def pick(
        self,
        queues: Sequence[str],
        n: int,
        now: float,
        kinds: frozenset[str] | None,
        room: Room,
    ) -> list[Job]:
        """Up to ``n`` due jobs of ``queues`` (of ``kinds``, if given), out of the lanes:
        priority first, then due time, each queue at most as many as ``room`` lets start
        (none of a paused one)."""
        left: dict[str, int] = {}
        fronts: list[tuple[int, float, int, str, str, Lanes[Entry]]] = []
        for queue in dict.fromkeys(queues):
            lanes_of = self._looked_at(queue, kinds)
            if not lanes_of:
                continue
            k = min(n, room(queue))
            if k <= 0:
                continue
            left[queue] = k
            for kind, lanes in lanes_of:
                head = lanes.head(now)
                if head is not None:
                    n_, job = head
                    fronts.append((-job.priority, job.ready_at, n_, queue, kind, lanes))
                else:
                    self._drop_if_empty(queue, kind, lanes)  # its stale fronts are gone
        if not fronts:
            return []
        if len(fronts) > 1:
            heapq.heapify(fronts)
        out: list[Job] = []
        while fronts and len(out) < n:
            _, _, _, queue, kind, lanes = fronts[0]
            if left[queue] <= 0:
                heapq.heappop(fronts)  # this queue has had its share
                continue
            entry = lanes.pop(now)
            if entry is None:  # (head said there was one: nothing changed since)
                heapq.heappop(fronts)
                continue
            out.append(entry[1])
            left[queue] -= 1
            head = lanes.head(now)
            if head is None:
                heapq.heappop(fronts)
                self._drop_if_empty(queue, kind, lanes)
            else:
                n_, job = head
                heapq.heapreplace(fronts, (-job.priority, job.ready_at, n_, queue, kind, lanes))
        return out

    # -- waiting ------------------------------------------------------------------------------

    async def wait(
        self, queues: Sequence[str], kinds: frozenset[str] | None, within: float, room: Room
    ) -> None:
        """Until a job may have become due in one of ``queues`` (rung), or ``within``."""
        now = self._clock.time()
        timeout = within
        for queue in queues:
            if room(queue) <= 0:
                continue
            for _, lanes in self._looked_at(queue, kinds):
                wake = lanes.next_wakeup()
                if wake is not None:
                    timeout = min(timeout, wake - now)
        waiter = _Waiter(kinds is not None)
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
        """Jobs waiting in ``queue``: O(its kinds with a job waiting)."""
        kinds = self._queues.get(queue)
        return sum(len(lanes) for lanes in kinds.values()) if kinds is not None else 0

    def waiting(self) -> int:
        """Claims waiting on some bell now (one waiting on several counts once per bell)."""
        return sum(len(bell) for bell in self._bells.values())

    def sizes(self) -> dict[str, int]:
        due = delayed = lanes_held = 0
        for kinds in self._queues.values():
            for lanes in kinds.values():
                sizes = lanes.sizes()
                due += sizes["immediate"]
                delayed += sizes["delayed"]
                lanes_held += 1
        return {
            "immediate": due,
            "delayed": delayed,
            "queues": len(self._queues),
            "lanes": lanes_held,
        }

    def held(self) -> dict[str, list[Job]]:
        """Every queue's entries still wanted (O(n): for checks such as the model test)."""
        return {
            name: [entry[1] for lanes in kinds.values() for entry in lanes.held()]
            for name, kinds in self._queues.items()
        }
