"""The lanes a scheduled job waits in, as pure data structures.

Due jobs wait in one FIFO deque per priority level; a small max-heap holds the
levels that have jobs, so the next job is the oldest of the highest priority.
With one level (the common case) that is one deque: O(1) in and out.

Delayed jobs wait ordered on ``(ready_at, arrival)`` (``Delayed``: a run of entries
that came in order, kept as columns, and a min-heap for the rest, O(log n)). Before
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

import bisect
import heapq
import itertools
import math
import operator
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar, cast

T = TypeVar("T")


def _always(_: object) -> bool:
    return True


Entry = tuple[float, int, int, T]  # (ready_at, arrival, priority, item): a heap entry


class Delayed(Generic[T]):
    """Delayed entries, the earliest ``(ready_at, arrival)`` first.

    Nearly all of them come in that order: a batch delayed alike, recovery's load (sorted
    once). Those are appended to a *run* kept as columns, ``ready_at``, arrival and
    priority in arrays and the items in a list: 32 bytes an entry, where a heap entry is a
    tuple, an arrival int and a slot (108 bytes; a million delayed jobs kept 76 MB more). An
    entry that comes out of order goes to a heap as before. The earliest is the smaller of
    the run's head and the heap's top; ``first`` is its ``ready_at`` (inf: none), kept
    current so the hot path reads one attribute. The run's popped head is cut off once it
    is the larger part (amortised O(1)); a popped item's slot is cleared at once.
    """

    __slots__ = ("_arrival", "_at", "_head", "_heap", "_items", "_priority", "first")

    def __init__(self) -> None:
        self._at = array("d")
        self._arrival = array("q")
        self._priority = array("q")
        self._items: list[T | None] = []
        self._head = 0  # the run's entries before this one were popped
        self._heap: list[Entry[T]] = []
        self.first = math.inf

    def __len__(self) -> int:
        return len(self._items) - self._head + len(self._heap)

    def push(self, ready_at: float, arrival: int, priority: int, item: T) -> None:
        at, n = self._at, len(self._items)
        if (n == self._head or ready_at > at[-1]
                or (ready_at == at[-1] and arrival > self._arrival[-1])):  # fmt: skip
            try:
                self._priority.append(priority)
            except OverflowError:  # beyond 64 bits: the heap holds any int
                pass
            else:
                at.append(ready_at)
                self._arrival.append(arrival)
                self._items.append(item)
                if ready_at < self.first:
                    self.first = ready_at
                return
        heapq.heappush(self._heap, (ready_at, arrival, priority, item))
        if ready_at < self.first:
            self.first = ready_at

    def extend(self, at: list[float], arrivals: Sequence[int], priorities: list[int],
               items: list[T]) -> None:  # fmt: skip
        """Many entries, already in ``(ready_at, arrival)`` order (recovery's load)."""
        if not items:
            return
        n = len(self._items)
        later = n == self._head or (at[0], arrivals[0]) > (self._at[-1], self._arrival[-1])
        try:
            priority = array("q", priorities)
        except OverflowError:
            later = False
        if later:
            self._at.extend(at)
            self._arrival.extend(arrivals)
            self._priority.extend(priority)
            self._items.extend(items)
        else:
            heap = self._heap
            heap.extend(zip(at, arrivals, priorities, items, strict=True))
            heapq.heapify(heap)
        self._first()

    def front(self) -> T:
        """The earliest entry's item (there must be one)."""
        heap, h = self._heap, self._head
        if h == len(self._items) or (heap and heap[0][:2] < (self._at[h], self._arrival[h])):
            return heap[0][3]
        return self._items[h]  # type: ignore[return-value]  # (popped slots are before h)

    def pop(self) -> tuple[int, T]:
        """The earliest entry's priority and item, out of the lane (there must be one)."""
        heap, h = self._heap, self._head
        if h == len(self._items) or (heap and heap[0][:2] < (self._at[h], self._arrival[h])):
            _, _, priority, item = heapq.heappop(heap)
        else:
            priority, item = self._priority[h], self._items[h]  # type: ignore[assignment]
            self._items[h] = None
            self._head = h = h + 1
            if h == len(self._items):
                self._clear_run()
            elif h >= 1024 and 2 * h > len(self._items):
                self._cut()
        self._first()
        return priority, item

    def keep(self, wanted: Callable[[T], bool]) -> None:
        """Only the entries whose item is ``wanted``, in the same order."""
        h, items = self._head, self._items
        kept = [i for i in range(h, len(items)) if wanted(items[i])]  # type: ignore[arg-type]
        at, arrival, priority = self._at, self._arrival, self._priority
        self._at = array("d", [at[i] for i in kept])
        self._arrival = array("q", [arrival[i] for i in kept])
        self._priority = array("q", [priority[i] for i in kept])
        self._items = [items[i] for i in kept]
        self._head = 0
        self._heap = [e for e in self._heap if wanted(e[3])]
        heapq.heapify(self._heap)
        self._first()

    def __iter__(self) -> Iterator[T]:
        """Every item, the run's first, then the heap's (in no order)."""
        yield from cast("list[T]", self._items)[self._head :]  # (popped slots: before it)
        for entry in self._heap:
            yield entry[3]

    def _first(self) -> None:
        h = self._head
        run = self._at[h] if h < len(self._items) else math.inf
        self.first = min(run, self._heap[0][0]) if self._heap else run

    def _clear_run(self) -> None:
        self._at, self._arrival, self._priority = array("d"), array("q"), array("q")
        self._items, self._head = [], 0

    def _cut(self) -> None:
        h = self._head
        del self._at[:h], self._arrival[:h], self._priority[:h], self._items[:h]
        self._head = 0


@dataclass(slots=True)
class Lanes(Generic[T]):
    current: Callable[[T], bool] = _always  # is this entry still wanted? (see "stale" above)
    ready: dict[int, deque[T]] = field(default_factory=dict)  # priority -> due entries
    delayed: Delayed[T] = field(default_factory=Delayed)
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
            if self.delayed.first <= self.seen:
                self._promote(now)
            self._make_due(item, priority)
            return False
        self.delayed.push(ready_at, next(self._arrival), priority, item)
        return True

    def load(self, items: list[T], due: list[float], priorities: list[int], now: float) -> None:
        """Many entries at once (recovery), as columns: sorted once by due time (stable, so
        input order among equal times), the due ones into their deques in that order, the
        delayed ones into the delayed lane as one run; every pass a C loop. Nearly sorted
        already (ids and times grow together), so about linear."""
        self._promote(now)
        if all(map(operator.le, due, itertools.islice(due, 1, None))):  # in order already
            at, ordered, ranked = due, items, priorities  # (a batch delayed alike: no sort)
        else:
            order = sorted(range(len(items)), key=due.__getitem__)
            at = list(map(due.__getitem__, order))
            ordered = list(map(items.__getitem__, order))
            ranked = list(map(priorities.__getitem__, order))
        now_due = bisect.bisect_right(at, self.seen)
        for n in range(now_due):
            self._make_due(ordered[n], ranked[n])
        if now_due == len(items):
            return
        later = len(items) - now_due
        first = next(self._arrival)  # their arrivals: first, first + 1, ... in this order
        self._arrival = itertools.count(first + later)
        if now_due:  # (none due, as at a restart behind delayed jobs: no copies of a million)
            at, ranked, ordered = at[now_due:], ranked[now_due:], ordered[now_due:]
        self.delayed.extend(at, range(first, first + later), ranked, ordered)

    def next_wakeup(self) -> float | None:
        """When the earliest delayed entry becomes due; None if the heap is empty."""
        delayed = self.delayed
        while self.stale_delayed and delayed and not self.current(delayed.front()):
            delayed.pop()
            self.stale_delayed -= 1
        return delayed.first if delayed else None

    def pop(self, now: float) -> T | None:
        """The next entry to hand to a worker at ``now``, or None if none is due."""
        if now > self.seen:  # (``_promote`` inlined up to its loop: this is the hot path)
            self.seen = now
        if self.delayed.first <= self.seen:
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

    def discard(self, ready_at: float, item: T | None = None) -> None:
        """An entry (due at ``ready_at``) that is in these lanes is no longer wanted (``item``:
        which, for lanes that keep entries apart by more than their due time)."""
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
        self.delayed.keep(keep)
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
        while delayed.first <= seen:
            priority, item = delayed.pop()
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
        return [i for i in items + list(self.delayed) if keep(i)]

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

    def __init__(
        self, name: str, current: Callable[[T], bool], lanes: Lanes[T] | None = None
    ) -> None:
        self.name = name
        self.lanes: Lanes[T] = Lanes(current) if lanes is None else lanes  # (fair: by key)
        self.turn = -1  # its one valid entry in the due heap; -1: not there
        self.prio = 0  # that entry's priority
        self.timer: float | None = None  # its one valid entry in the timer heap
        self.closed = False  # found closed at the top; back when poked
