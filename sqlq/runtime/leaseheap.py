"""``LeaseHeap``: when the remote leases a local engine's runtime holds run out.

In local mode (memory, walq, SQLite) nothing but this process watches a remote
worker's lease, so the runtime keeps a min-heap of ``(lease_until, job id)`` and one
timer on the injected clock for its earliest entry. A heartbeat moves a job's lease
on without touching the heap: when the old entry comes up, ``due`` hands the job
to its owner, which finds the lease renewed and ``push``-es it again at the new
time (one entry per job per lease period, not per heartbeat). An earlier time (a
forced cancel's grace) is pushed at once; ``_at`` remembers each job's earliest live
entry so a later one is dropped when it comes up. So the heap holds about one entry
per remotely held job, and a timer fires about once per lease period.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from sqlq.common.clock import Clock, Timer


class LeaseHeap:
    def __init__(self, clock: Clock, due: Callable[[list[str]], None]) -> None:
        self._clock = clock
        self._due = due  # told of the jobs whose entry came up (a lease may have run out)
        self._heap: list[tuple[float, str]] = []
        self._at: dict[str, float] = {}  # job id -> its one live entry's time
        self._timer: Timer | None = None
        self._armed = math.inf  # the time the timer is set for

    def push(self, job_id: str, until: float) -> None:
        """Look at ``job_id`` once ``until`` has passed (its lease's end, or earlier)."""
        at = self._at.get(job_id)
        if at is not None and at <= until:
            return  # an earlier entry comes up first and looks again then
        self._at[job_id] = until
        heapq.heappush(self._heap, (until, job_id))
        if until < self._armed:
            self._arm(until)

    def forget(self, job_id: str) -> None:
        """``job_id`` is no longer remotely held: its entry is dropped when it comes up."""
        self._at.pop(job_id, None)

    def __len__(self) -> int:
        return len(self._at)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed = at
        self._timer = self._clock.call_later(max(0.0, at - self._clock.time()), self._fire)

    def _fire(self) -> None:
        self._timer, self._armed = None, math.inf
        now = self._clock.time()
        heap, live = self._heap, self._at
        came: list[str] = []
        while heap and heap[0][0] <= now:
            until, job_id = heapq.heappop(heap)
            if live.get(job_id) == until:
                del live[job_id]
                came.append(job_id)
        if len(heap) > 2 * len(live) + 64:  # mostly dropped entries: rebuild
            self._heap = heap = [(until, job_id) for job_id, until in live.items()]
            heapq.heapify(heap)
        if heap:
            self._arm(heap[0][0])
        if came:
            self._due(came)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer, self._armed = None, math.inf
