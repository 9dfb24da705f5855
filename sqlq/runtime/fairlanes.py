"""A queue's lanes by key, for a queue with a policy (``sqlq.common.fair``): pure data.

``FairLanes`` is the scheduler's ``Lanes`` for such a queue, so fairness is a parameter
of the path that exists: the scheduler chooses between queues as always (priority, then
turns), and a fair queue's lanes choose between its keys. Delayed jobs of every key wait
in the one delayed lane the base class keeps; once due, each goes to its key's own
``Lanes`` (by priority, then FIFO). A key is in one of four places:

- **ready**: it has a due job and may start one; in a heap on its start tag (SFQ:
  ``sqlq.common.fair.start_tag``), or, with ``fair`` off, on its head's priority and age;
- **waiting**: its bucket allows no start yet; in a heap on when it will;
- **full**: as many of its jobs run as its concurrency allows; back at ``ended``;
- **idle**: no due job. An idle key that runs nothing and has a full bucket is
  forgotten: made again later, it starts at the virtual time with a full bucket, as it
  would have (a key back from idle starts at the virtual time whatever its finish tag).

A heap entry carries its key's stamp; one whose key moved since is dropped when it
reaches the top. ``pop`` serves the ready key at the top: the queue's own bucket first
(``queue_rate``), then the key's. ``next_wakeup`` is the earliest of the next delayed
job and the next token, so the dispatcher sleeps until then and never polls; a freed
slot is ``ended``, which the claims follow with a poke.

Buckets restart empty (``fair.empty`` at ``started_at``): their state is never stored.
Their times are kept relative to ``started_at`` (``_rel``): near 1.7e9 a float holds
time to 0.24 us, and a start's interval added and its tolerance taken away at that
scale drifted by 0.3 us a start (measured); relative, they are exact to the clock's
own reading. A wakeup made absolute again is rounded up, so a dispatcher that wakes at
it finds the token there (rounded down, a fake clock would spin on it forever).
Nothing here reads a clock or sleeps: every decision takes ``now``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from enum import Enum
from typing import Any

from sqlq.common import fair
from sqlq.common.fair import Policy
from sqlq.common.models import Job
from sqlq.runtime.lanes import Lanes

_SLACK = 64  # a heap is rebuilt once it holds more than twice its keys and this
_ABSENT = object()


class Where(Enum):
    IDLE = 0
    READY = 1
    WAITING = 2
    FULL = 3


class Key:
    """One key's due jobs and where it stands."""

    __slots__ = ("finish", "lanes", "name", "running", "stamp", "tat", "where")

    def __init__(self, name: str | None, lanes: Lanes[Job], tat: float, finish: float) -> None:
        self.name = name
        self.lanes = lanes
        self.running = 0  # its jobs handed out and not yet ended
        self.tat = tat  # its bucket's theoretical arrival time
        self.finish = finish  # its SFQ finish tag
        self.where = Where.IDLE
        self.stamp = -1  # its one valid heap entry


class FairLanes(Lanes[Job]):
    """The lanes of a queue with a policy; the scheduler reads them as any ``Lanes``."""

    def __init__(self, current: Callable[[Job], bool], policy: Policy, started_at: float) -> None:
        super().__init__(current)
        self.policy = policy
        self._base = started_at  # buckets restart empty: none fuller than from here
        self._keys: dict[str | None, Key] = {}
        self._ready: list[tuple[float, float, int, str | None]] = []  # (tag, tag2, stamp, key)
        self._waiting: list[tuple[float, int, str | None]] = []  # (allowed at, stamp, key)
        self._out: dict[str, str | None] = {}  # the jobs counted running here: id -> key
        self._stamps = itertools.count()
        self._sweep_at = _SLACK  # keys held past which idle ones are looked over
        self._virtual = 0.0
        self._queue_tat = self._fresh_tat(policy.queue_rate, started_at)  # (tats: relative)

    # -- what the scheduler calls ----------------------------------------------------------

    def pop(self, now: float) -> Job | None:
        self._promote(now)
        k = self._winner(self.seen)
        if k is None:
            return None
        tag = self._ready[0][0]
        heapq.heappop(self._ready)
        before = k.lanes.due
        job = k.lanes.pop(self.seen)
        self.due -= before - k.lanes.due
        if job is None:  # (``_winner`` saw a live top: not reached)
            self._place(k, self.seen)
            return None
        policy = self.policy
        if policy.fair:
            self._virtual = tag
            k.finish = fair.finish_tag(tag, policy.weight_of(k.name, job.weight))
        k.running += 1
        self._out[job.id] = k.name
        rate, rel = policy.rate_of(k.name), self.seen - self._base
        if rate is not None:
            k.tat = fair.take(rate, k.tat, rel)
        if policy.queue_rate is not None:
            self._queue_tat = fair.take(policy.queue_rate, self._queue_tat, rel)
        k.where = Where.IDLE
        self._place(k, self.seen)
        return job

    def top(self) -> int | None:
        k = self._winner(self.seen)
        return None if k is None else self._top_of(k)

    def head(self, now: float) -> Job | None:
        self._promote(now)
        k = self._winner(self.seen)
        return None if k is None else k.lanes.head(self.seen)

    def promote(self, now: float) -> None:
        """What fell due by ``now`` moves on: delayed jobs to their keys, and keys whose
        token came out of the waiting heap. Left there, a key's past token would be the
        next wakeup, and the dispatcher would spin on it (the base class's rule, for
        tokens: a closed queue is promoted, never popped)."""
        self._promote(now)
        self._tokens_in(self.seen - self._base)

    def next_wakeup(self) -> float | None:
        """The earliest of the next delayed job and the next token of a key with due jobs
        (or of the queue's own bucket, while it holds them all back): always after the
        latest ``now`` seen, whatever has not been promoted since."""
        delayed = super().next_wakeup()
        wake = math.inf if delayed is None else delayed
        rel = self.seen - self._base
        self._tokens_in(rel)
        token = math.inf  # (relative)
        waiting = self._waiting
        while waiting:
            at, stamp, name = waiting[0]
            k = self._keys.get(name)
            if k is not None and k.stamp == stamp and k.where is Where.WAITING:
                token = at
                break
            heapq.heappop(waiting)
        rate = self.policy.queue_rate
        if rate is not None and self._ready:
            at = fair.allowed_at(rate, self._queue_tat)
            if at > rel:
                token = min(token, at)
        if token < math.inf:
            wake = min(wake, self._absolute(token))
        return None if wake == math.inf else wake

    def _tokens_in(self, rel: float) -> None:
        """Keys whose token came by ``rel`` leave the waiting heap, placed anew."""
        waiting, keys = self._waiting, self._keys
        while waiting and waiting[0][0] <= rel:
            _, stamp, name = heapq.heappop(waiting)
            k = keys.get(name)
            if k is not None and k.stamp == stamp and k.where is Where.WAITING:
                k.where = Where.IDLE
                self._place_at(k, rel)

    def discard(self, ready_at: float, job: Job | None = None) -> None:
        """An entry no longer wanted: counted in its key's lanes if due, else in the
        delayed lane's (``job``: which key; the base class needs only ``ready_at``)."""
        if ready_at > self.seen or job is None:
            super().discard(ready_at)
            return
        k = self._keys.get(job.key)
        if k is None:
            return
        before = k.lanes.due
        k.lanes.discard(ready_at)
        self.due -= before - k.lanes.due
        if k.where is not Where.IDLE and self._top_of(k) is None:
            k.where = Where.IDLE
            self._place(k, self.seen)

    @property
    def entries(self) -> int:
        return self.due + len(self.delayed)

    def held(self) -> list[Job]:
        keep = self.current
        due = [job for k in self._keys.values() for job in k.lanes.held()]
        return due + [job for job in self.delayed if keep(job)]

    def __len__(self) -> int:
        return (
            sum(len(k.lanes) for k in self._keys.values())
            + len(self.delayed)
            - (self.stale_delayed)
        )

    def sizes(self) -> dict[str, int]:
        return {
            "immediate": sum(len(k.lanes) for k in self._keys.values()),
            "delayed": len(self.delayed) - self.stale_delayed,
        }

    def purge(self) -> None:
        self.delayed.keep(self.current)
        self.stale_delayed = 0

    # -- what the claims tell --------------------------------------------------------------

    def started(self, job: Job) -> None:
        """``job`` of this queue runs (counted when these lanes are made while it does)."""
        if job.id in self._out:
            return
        self._out[job.id] = job.key
        k = self._key(job.key, self.seen)
        k.running += 1
        if k.where is Where.READY:
            k.where = Where.IDLE
            self._place(k, self.seen)

    def ended(self, job: Job, now: float) -> None:
        """An attempt of ``job``'s key that ``pop`` handed out (or ``started`` counted) is
        over: a slot is free. Any other job's end (popped before these lanes were made,
        and not running when they were) counts nothing: it was never counted."""
        if self._out.pop(job.id, _ABSENT) is _ABSENT:
            return
        k = self._keys.get(job.key)
        if k is None:
            return
        k.running = max(0, k.running - 1)
        if k.where is Where.FULL or k.where is Where.IDLE:
            k.where = Where.IDLE
            self._place(k, max(now, self.seen))

    def pushed_back(self, key: str | None, after_s: float, now: float) -> None:
        """An upstream said "not before ``after_s``" for ``key`` (``sqlq.RateLimited``)."""
        rate = self.policy.rate_of(key)
        if rate is None:
            return
        k = self._key(key, now)
        k.tat = fair.push_back(rate, k.tat, now - self._base, after_s)
        if k.where is Where.READY:
            k.where = Where.IDLE
            self._place(k, now)

    def set_policy(self, policy: Policy, now: float) -> None:
        """The queue's policy changed: every key is placed again under it."""
        self.policy = policy
        if policy.queue_rate is not None:
            self._queue_tat = max(self._queue_tat, self._fresh_tat(policy.queue_rate, now))
        self._ready, self._waiting = [], []
        for k in list(self._keys.values()):
            k.where = Where.IDLE
            self._place(k, now)

    def key_stats(self, now: float) -> list[tuple[str | None, int, int, float]]:
        """Each key held: (key, due jobs, running, how long its next job has been due),
        for the metrics (O(keys): a scrape's, never a job's)."""
        out = []
        for name, k in self._keys.items():
            head = k.lanes.head(self.seen) if k.lanes.due else None
            wait = 0.0 if head is None else max(0.0, now - head.ready_at)
            out.append((name, len(k.lanes), k.running, wait))
        return out

    def keyed(self) -> bool:
        """Whether a job with a key waits or runs here."""
        return any(name is not None for name in self._keys)

    def keys(self) -> dict[str | None, tuple[int, int]]:
        """Each key held: (due jobs, running), for the view (O(keys))."""
        return {name: (len(k.lanes), k.running) for name, k in self._keys.items()}

    # -- choosing -----------------------------------------------------------------------------

    def _make_due(self, item: Job, priority: int) -> None:
        """(Called by the base class as entries fall due.) Into its key's lanes."""
        k = self._key(item.key, self.seen)
        k.lanes.push(item, item.ready_at, priority, self.seen)
        self.due += 1
        if k.where is Where.IDLE or (
            k.where is Where.READY and not self.policy.fair and priority > self._ready_prio(k)
        ):
            k.where = Where.IDLE
            self._place(k, self.seen)

    def _winner(self, now: float) -> Key | None:
        """The ready key to serve at ``now`` (left at the top of the heap), or None."""
        keys = self._keys
        rel = now - self._base
        self._tokens_in(rel)
        rate = self.policy.queue_rate
        if rate is not None and fair.allowed_at(rate, self._queue_tat) > rel:
            return None
        ready = self._ready
        while ready:
            _, _, stamp, name = ready[0]
            k = keys.get(name)
            if k is None or k.stamp != stamp or k.where is not Where.READY:
                heapq.heappop(ready)
                continue
            if self._top_of(k) is None:  # its due jobs were all discarded
                heapq.heappop(ready)
                k.where = Where.IDLE
                self._place(k, now)
                continue
            return k
        return None

    def _place(self, k: Key, now: float) -> None:
        """Put an idle-marked ``k`` where it stands at ``now``."""
        self._place_at(k, now - self._base)

    def _place_at(self, k: Key, rel: float) -> None:
        """``_place`` at a time relative to the base: the waiting heap's own unit, so a key
        taken out of it at ``rel`` is never put back at that same token (a round trip
        through an absolute time could round it back to ``<= rel``, for ever)."""
        policy = self.policy
        top = self._top_of(k)
        if top is None:
            k.where = Where.IDLE
            k.stamp = -1
            self._maybe_forget(k, rel)
            return
        limit = policy.concurrency_of(k.name)
        if limit is not None and k.running >= limit:
            k.where, k.stamp = Where.FULL, -1
            return
        k.stamp = stamp = next(self._stamps)
        rate = policy.rate_of(k.name)
        if rate is not None:
            at = fair.allowed_at(rate, k.tat)
            if at > rel:
                k.where = Where.WAITING
                heapq.heappush(self._waiting, (at, stamp, k.name))
                self._bound(self._waiting)
                return
        k.where = Where.READY
        if policy.fair:
            entry = (fair.start_tag(self._virtual, k.finish), 0.0, stamp, k.name)
        else:  # the plain order among keys: priority, then the oldest head
            head = k.lanes.head(self.seen)
            entry = (float(-top), head.ready_at if head is not None else 0.0, stamp, k.name)
        heapq.heappush(self._ready, entry)
        self._bound(self._ready)

    def _ready_prio(self, k: Key) -> int:
        for tag, _, stamp, name in self._ready:
            if stamp == k.stamp and name == k.name:
                return int(-tag)
        return 0

    def _top_of(self, k: Key) -> int | None:
        before = k.lanes.due
        top = k.lanes.top()
        self.due -= before - k.lanes.due
        return top

    def _key(self, name: str | None, now: float) -> Key:
        k = self._keys.get(name)
        if k is None:
            if len(self._keys) > self._sweep_at:
                self._sweep(now)
            tat = self._fresh_tat(self.policy.rate_of(name), now)
            k = self._keys[name] = Key(name, Lanes(self.current), tat, self._virtual)
        return k

    def _fresh_tat(self, rate: fair.Rate | None, now: float) -> float:
        """A bucket made at ``now``: as full as one made empty at the start has become."""
        rel = now - self._base
        return rel if rate is None else max(rel, fair.empty(rate, 0.0))

    def _sweep(self, now: float) -> None:
        """Forget every idle key whose bucket has filled since it went idle (amortised:
        once the keys held double), so keys held stay bounded by the keys in use."""
        for k in [k for k in self._keys.values() if k.where is Where.IDLE]:
            self._maybe_forget(k, now - self._base)
        self._sweep_at = 2 * len(self._keys) + _SLACK

    def _absolute(self, rel: float) -> float:
        """``rel`` as a time on the clock, never before it (see the module's docstring)."""
        at = self._base + rel
        while at - self._base < rel:
            at = math.nextafter(at, math.inf)
        return at

    def _maybe_forget(self, k: Key, rel: float) -> None:
        """An idle key made again later would be exactly this one: forget it."""
        if k.running or k.lanes.entries:
            return
        rate = self.policy.rate_of(k.name)
        if rate is not None and k.tat > max(rel, fair.empty(rate, 0.0)):
            return  # its bucket is not full: made again, it would be fuller
        del self._keys[k.name]  # (made again, it starts at the virtual time: as it would)

    def _bound(self, heap: list[Any]) -> None:
        """Drop a heap's outdated entries once they are the larger part (O(n), amortised)."""
        if len(heap) > 2 * len(self._keys) + _SLACK:
            keys = self._keys
            heap[:] = [e for e in heap if (k := keys.get(e[-1])) is not None and k.stamp == e[-2]]
            heapq.heapify(heap)
