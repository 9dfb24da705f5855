"""The lanes a scheduled job waits in, as pure data structures.

Due jobs wait in one FIFO deque per priority level; a small max-heap holds the
levels that have jobs, so the next job is the oldest of the highest priority.
With one level (the common case) that is one deque: O(1) in and out.

Delayed jobs wait in a min-heap on ``(ready_at, arrival)``, O(log n). Before
any push or pop at ``now``, the delayed jobs due by ``now`` move into their
level's deque in due order, so a job that came due earlier is ahead of one
that arrived due later at the same priority; a job due now never waits behind
the heap. An entry is due once ``ready_at`` is at or before the latest ``now``
seen (``seen``), so a clock that steps back never hides a job already due, and
``discard`` can tell from ``ready_at`` alone which lane an entry is in.

Stale entries. A job cancelled while it waits (or moved on otherwise) is not
looked for in a deque or a heap (O(n)): ``discard`` counts it, ``current`` is
asked of entries only while such counts are above zero, and a stale entry is
dropped when it reaches the front. Sizes exclude stale entries, so a depth is
exact at once; whenever stale entries are more than half of the lanes (after a
discard or a pop) they are purged (O(n), paid for by the discards and pops), so
they never hold memory unbounded, nor a queue past its last live job.

Nothing here reads a clock or sleeps: every decision takes ``now``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


def _always(_: object) -> bool:
    return True


@dataclass(slots=True)
class Lanes(Generic[T]):
    current: Callable[[T], bool] = _always  # is this entry still wanted? (see "stale" above)
    ready: dict[int, deque[T]] = field(default_factory=dict)  # priority -> due entries
    delayed: list[tuple[float, int, int, T]] = field(default_factory=list)
    _levels: list[int] = field(default_factory=list)  # -priority of every non-empty deque
    _arrival: itertools.count[int] = field(default_factory=itertools.count)
    due: int = 0  # entries in the deques, stale ones included
    seen: float = -math.inf  # the latest ``now``: an entry is due iff its ready_at <= seen
    stale_ready: int = 0  # discarded entries still in a deque
    stale_delayed: int = 0  # discarded entries still in the heap

    def push(self, item: T, ready_at: float, priority: int, now: float) -> bool:
        """Queue an entry; returns True if it went to the delayed lane."""
        if ready_at <= now or ready_at <= self.seen:
            if now > self.seen:
                self.seen = now
            delayed = self.delayed
            if delayed and delayed[0][0] <= self.seen:
                self._promote(now)
            self._make_due(item, priority)
            return False
        heapq.heappush(self.delayed, (ready_at, next(self._arrival), priority, item))
        return True

    def load(self, items: list[T], due: list[float], priorities: list[int], now: float) -> None:
        """Many entries at once (recovery), as columns: the due ones in due order, the delayed
        ones heapified once instead of pushed one by one (tuples built by C loops)."""
        self._promote(now)
        seen = self.seen
        ready = sorted(
            ((t, n, p) for n, (t, p) in enumerate(zip(due, priorities, strict=True)) if t <= seen)
        )
        for _, n, priority in ready:
            self._make_due(items[n], priority)
        if len(ready) == len(items):
            return
        # zip stops at the shortest: the arrival counter never ends.
        later = [e for e in zip(due, self._arrival, priorities, items, strict=False) if e[0] > seen]
        self.delayed.extend(later)
        heapq.heapify(self.delayed)

    def next_wakeup(self) -> float | None:
        """When the earliest delayed entry becomes due; None if the heap is empty."""
        delayed = self.delayed
        while self.stale_delayed and delayed and not self.current(delayed[0][3]):
            heapq.heappop(delayed)
            self.stale_delayed -= 1
        return delayed[0][0] if delayed else None

    def pop(self, now: float) -> T | None:
        """The next entry to hand to a worker at ``now``, or None if none is due."""
        if now > self.seen:  # (``_promote`` inlined up to its loop: this is the hot path)
            self.seen = now
        delayed = self.delayed
        if delayed and delayed[0][0] <= self.seen:
            self._promote(now)
        levels = self._levels
        if not levels:
            return None
        if self.stale_ready:
            top = self.top()
            if top is None:
                return None
            priority = top
        else:
            priority = -levels[0]
        lane = self.ready[priority]
        item = lane.popleft()
        self.due -= 1
        if not lane:
            heapq.heappop(self._levels)
            del self.ready[priority]
        if (self.stale_ready or self.stale_delayed) and self._mostly_stale():
            self.purge()  # what is left is mostly stale: hold none of it until its due time
        return item

    def peek(self, now: float) -> int | None:
        """The priority of the entry ``pop`` would hand out at ``now``, or None."""
        self._promote(now)
        return self.top()

    def top(self) -> int | None:
        """The priority of the next due entry as of the last ``now`` (stale fronts dropped)."""
        levels = self._levels
        while levels:
            priority = -levels[0]
            if not self.stale_ready:
                return priority
            lane = self.ready[priority]
            if self.current(lane[0]):
                return priority
            lane.popleft()
            self.due -= 1
            self.stale_ready -= 1
            if not lane:
                heapq.heappop(levels)
                del self.ready[priority]
        return None

    def head(self, now: float) -> T | None:
        """The entry ``pop`` would hand out at ``now``, left in place (stale fronts dropped):
        how a remote claim compares the fronts of several lanes before it takes one."""
        self._promote(now)
        priority = self.top()
        return None if priority is None else self.ready[priority][0]

    def promote(self, now: float) -> None:
        """Move what is due by ``now`` from the heap to the deques."""
        self._promote(now)

    def discard(self, ready_at: float) -> None:
        """An entry (due at ``ready_at``) that is in these lanes is no longer wanted."""
        if ready_at <= self.seen:
            self.stale_ready += 1
        else:
            self.stale_delayed += 1
        if self._mostly_stale():
            self.purge()

    def _mostly_stale(self) -> bool:
        return 2 * (self.stale_ready + self.stale_delayed) > self.due + len(self.delayed)

    def purge(self) -> None:
        """Drop every stale entry now: O(n), so only when they are the larger part."""
        keep = self.current
        for priority, lane in list(self.ready.items()):
            kept = deque(item for item in lane if keep(item))
            self.due -= len(lane) - len(kept)
            if kept:
                self.ready[priority] = kept
            else:
                del self.ready[priority]
        self._levels = [-p for p in self.ready]
        heapq.heapify(self._levels)
        self.delayed = [e for e in self.delayed if keep(e[3])]
        heapq.heapify(self.delayed)
        self.stale_ready = self.stale_delayed = 0

    def _make_due(self, item: T, priority: int) -> None:
        lane = self.ready.get(priority)
        if lane is None:
            lane = self.ready[priority] = deque()
            heapq.heappush(self._levels, -priority)
        lane.append(item)
        self.due += 1

    def _promote(self, now: float) -> None:
        if now > self.seen:
            self.seen = now
        seen = self.seen
        delayed = self.delayed
        while delayed and delayed[0][0] <= seen:
            _, _, priority, item = heapq.heappop(delayed)
            if self.stale_delayed and not self.current(item):
                self.stale_delayed -= 1  # it leaves here, not in a deque
                continue
            self._make_due(item, priority)

    @property
    def entries(self) -> int:
        """Entries held, stale ones included: the lanes are empty when this is 0 (the
        scheduler's hot path reads ``due`` and ``delayed`` itself)."""
        return self.due + len(self.delayed)

    def held(self) -> list[T]:
        """Every entry still wanted, due ones first (O(n): for checks, never the hot path)."""
        keep = self.current
        items = [item for lane in self.ready.values() for item in lane]
        return [i for i in items + [e[3] for e in self.delayed] if keep(i)]

    def __len__(self) -> int:
        return self.due + len(self.delayed) - self.stale_ready - self.stale_delayed

    def sizes(self) -> dict[str, int]:
        return {
            "immediate": self.due - self.stale_ready,
            "delayed": len(self.delayed) - self.stale_delayed,
        }


class QueueLanes(Generic[T]):
    """One queue with entries in its lanes, and where it stands in the scheduler's heaps."""

    __slots__ = ("closed", "lanes", "name", "prio", "timer", "turn")

    def __init__(self, name: str, current: Callable[[T], bool]) -> None:
        self.name = name
        self.lanes: Lanes[T] = Lanes(current)
        self.turn = -1  # its one valid entry in the due heap; -1: not there
        self.prio = 0  # that entry's priority
        self.timer: float | None = None  # its one valid entry in the timer heap
        self.closed = False  # found closed at the top; back when poked
