"""The lanes a scheduled job waits in, as pure data structures.

Due jobs wait in one FIFO deque per priority level; a small max-heap holds the
levels that have jobs, so the next job is the oldest of the highest priority.
With one level (the common case) that is one deque: O(1) in and out.

Delayed jobs wait in a min-heap on ``(ready_at, arrival)``, O(log n). Before
any push or pop at ``now``, the delayed jobs due by ``now`` move into their
level's deque in due order, so a job that came due earlier is ahead of one
that arrived due later at the same priority; a job due now never waits behind
the heap.

Nothing here reads a clock or sleeps: every decision takes ``now``.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class Lanes:
    ready: dict[int, deque[str]] = field(default_factory=dict)  # priority -> due job ids
    delayed: list[tuple[float, int, int, str]] = field(default_factory=list)
    _levels: list[int] = field(default_factory=list)  # -priority of every non-empty deque
    _arrival: itertools.count[int] = field(default_factory=itertools.count)
    _due: int = 0

    def push(self, job_id: str, ready_at: float, priority: int, now: float) -> bool:
        """Queue a job; returns True if it went to the delayed lane."""
        if ready_at <= now:
            self._promote(now)
            self._make_due(job_id, priority)
            return False
        heapq.heappush(self.delayed, (ready_at, next(self._arrival), priority, job_id))
        return True

    def load(self, ids: list[str], due: list[float], priorities: list[int], now: float) -> None:
        """Many jobs at once (recovery), as columns: the due ones in due order, the delayed
        ones heapified once instead of pushed one by one (tuples built by C loops)."""
        self._promote(now)
        ready = sorted((t, i, p) for t, i, p in zip(due, ids, priorities, strict=True) if t <= now)
        for _, job_id, priority in ready:
            self._make_due(job_id, priority)
        if len(ready) == len(ids):
            return
        # zip stops at the shortest: the arrival counter never ends.
        later = [e for e in zip(due, self._arrival, priorities, ids, strict=False) if e[0] > now]
        self.delayed.extend(later)
        heapq.heapify(self.delayed)

    def next_wakeup(self) -> float | None:
        """When the earliest delayed job becomes due; None if the heap is empty."""
        return self.delayed[0][0] if self.delayed else None

    def pop(self, now: float) -> str | None:
        """The next job to hand to a worker at ``now``, or None if none is due."""
        self._promote(now)
        if not self._levels:
            return None
        priority = -self._levels[0]
        lane = self.ready[priority]
        job_id = lane.popleft()
        self._due -= 1
        if not lane:
            heapq.heappop(self._levels)
            del self.ready[priority]
        return job_id

    def peek(self, now: float) -> int | None:
        """The priority of the job ``pop`` would hand out at ``now``, or None."""
        self._promote(now)
        return -self._levels[0] if self._levels else None

    def _make_due(self, job_id: str, priority: int) -> None:
        lane = self.ready.get(priority)
        if lane is None:
            lane = self.ready[priority] = deque()
            heapq.heappush(self._levels, -priority)
        lane.append(job_id)
        self._due += 1

    def _promote(self, now: float) -> None:
        delayed = self.delayed
        while delayed and delayed[0][0] <= now:
            _, _, priority, job_id = heapq.heappop(delayed)
            self._make_due(job_id, priority)

    def __len__(self) -> int:
        return self._due + len(self.delayed)

    def sizes(self) -> dict[str, int]:
        return {"immediate": self._due, "delayed": len(self.delayed)}
