"""The two lanes a scheduled job waits in, as pure data structures.

Immediate lane: a deque, O(1) in and out, for jobs due now. Delayed lane: a
min-heap on ``(ready_at, priority, arrival)``, O(log n), for the rest. Due
delayed jobs are drained before immediate ones that arrived after them only in
``ready_at`` order; a job ready now never waits behind the heap.

Nothing here reads a clock or sleeps: every decision takes ``now``.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class Lanes:
    immediate: deque[str] = field(default_factory=deque)
    delayed: list[tuple[float, int, int, str]] = field(default_factory=list)
    _arrival: itertools.count[int] = field(default_factory=itertools.count)

    def push(self, job_id: str, ready_at: float, priority: int, now: float) -> bool:
        """Queue a job; returns True if it went to the delayed lane."""
        if ready_at <= now:
            self.immediate.append(job_id)
            return False
        heapq.heappush(self.delayed, (ready_at, priority, next(self._arrival), job_id))
        return True

    def next_wakeup(self) -> float | None:
        """When the earliest delayed job becomes due; None if the heap is empty."""
        return self.delayed[0][0] if self.delayed else None

    def pop(self, now: float) -> str | None:
        """The next job to hand to a worker at ``now``, or None if none is due.

        Due delayed jobs go first: they have waited longer than anything that
        arrived in the immediate lane after their ``ready_at``.
        """
        if self.delayed and self.delayed[0][0] <= now:
            return heapq.heappop(self.delayed)[3]
        if self.immediate:
            return self.immediate.popleft()
        return None

    def __len__(self) -> int:
        return len(self.immediate) + len(self.delayed)

    def sizes(self) -> dict[str, int]:
        return {"immediate": len(self.immediate), "delayed": len(self.delayed)}
