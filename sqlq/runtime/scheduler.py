"""The scheduler: lanes per queue, one dispatcher task, and the workers waiting for a job.

A job leaves the lanes only when a worker takes it, never ahead of one, so a job
that arrives with a higher priority is the very next one to start. ``take``
pops the next due job at once when there is one (no task switch on the hot
path: an extra hop through the dispatcher cost ~0.3 ms per job, measured);
otherwise the worker waits, longest first, and ``add`` hands a due job straight
to it. The dispatcher task only wakes waiting workers when delayed jobs come
due: it sleeps on one timer armed for the earliest ``ready_at``, re-armed by
``add`` for an earlier one. No polling loop.

Each named queue has its own lanes, kept only while they hold a job: a queue
used once and emptied costs nothing from then on. A queue may be closed for now
(paused, or running as many jobs as its cap allows): ``gate`` says which, and
``poke(queue)`` tells the scheduler when that may have changed. Of the open
queues, the one whose next job has the highest priority goes first; ties take
turns, so one queue cannot starve another of equal priority.

With one queue holding jobs (the common case) there is nothing to choose: its
lanes are popped directly. With more, choosing is O(log q), never a scan:

- a heap of the open queues with a due job, keyed ``(-priority of its next job,
  turn)``; a queue's turn is a fresh number each time it is served (or its key
  changes), so among equal priorities the one served longest ago goes first;
- a heap of the queues with delayed jobs, on their earliest ``ready_at``, which
  moves a queue into the first heap when its jobs fall due;
- a queue found closed at the top leaves the first heap until ``poke`` names it.

Entries in either heap are checked against their queue's record when they reach
the top (an outdated one is dropped), and a heap that grows past twice its
queues is rebuilt, so neither holds more than O(q).

A queue with a policy (``sqlq.common.fair``: per-key rates and concurrency, fair
claims between keys) keeps ``FairLanes`` (``sqlq.runtime.fairlanes``) instead of plain
lanes: chosen between queues as any other, they choose between their keys. Their state
(running counts, buckets) outlives the queue's turn in ``_queues``, in ``_fair``, until
the policy goes; the claims tell of each attempt's end (``ended``) and of an upstream's
push-back (``pushed_back``); a fair queue's wakeup is its next token as well as its next
delayed job, so the dispatcher sleeps until then, and never polls.

Entries in the lanes are the ``Job`` as it was scheduled. A job cancelled while
it waits is ``discard``-ed: counted out of the depth at once and dropped when
it reaches the front (see ``lanes``), so a retry, which schedules it again
with a new epoch, can never be started by the old entry at the old due time.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter

from sqlq.common.clock import Clock, Timer
from sqlq.common.fair import Policy
from sqlq.common.models import Job
from sqlq.runtime.fairlanes import FairLanes
from sqlq.runtime.lanes import QueueLanes

_DUE, _PRIORITY, _KEY = attrgetter("ready_at"), attrgetter("priority"), attrgetter("key")
_SLACK = 64  # a heap is rebuilt once it holds more than twice its queues and this

Gate = Callable[[str], bool]  # may a job of this queue start now?
Taken = Callable[[str], None]  # a job of this queue was handed to a worker
Current = Callable[[Job], bool]  # is this entry still the job as scheduled? (after a discard)


class Scheduler:
    def __init__(
        self,
        clock: Clock,
        gate: Gate = lambda _: True,
        taken: Taken = lambda _: None,
        current: Current = lambda _: True,
    ) -> None:
        self._clock = clock
        self._gate = gate
        self._taken = taken  # called before the next gate check, so a cap counts it at once
        self._current = current
        self._queues: dict[str, QueueLanes[Job]] = {}  # only queues whose lanes hold an entry
        # The one queue's lanes, emptied by the one-queue path (``_pop``), kept for the next
        # job of any queue: with no backlog every job empties them, and making them anew
        # was a dataclass and five containers a job.
        self._spare: QueueLanes[Job] | None = None
        self._heaped = False  # the heaps are kept while more than one queue holds jobs
        self._due: list[tuple[int, int, str]] = []  # (-priority, turn, queue)
        self._timers: list[tuple[float, str]] = []  # (earliest ready_at, queue)
        self._turns = itertools.count()
        # workers, longest-waiting first; each gets the job's entry
        self._waiting: deque[asyncio.Future[Job]] = deque()
        # Entries handed to a waiting worker that has not resumed yet: out of the lanes, so
        # a cancel meanwhile has no entry to discard (counting one would read the depth one
        # low until a purge). Only the hand-out path fills it; at most one a worker.
        self._handed: set[str] = set()
        self._wake = asyncio.Event()
        self._armed = math.inf  # the ready_at the dispatcher's timer is set for
        self._timer: Timer | None = None  # on the injected clock: a fake one jumps to it
        self._task: asyncio.Task[None] | None = None
        self.dispatched = 0
        self.wakeups = 0
        self._fair: dict[str, FairLanes] = {}  # fair queues: their keyed lanes
        # The jobs of a queue running here now (the claims set it): what new fair lanes count.
        self.running: Callable[[str], Sequence[Job]] = lambda _: ()
        self._policies: dict[str, Policy] = {}  # queues with a policy set
        self.fair: Mapping[str, FairLanes] = self._fair  # (read-only: which queues are fair)
        self._started_at = clock.time()  # (a fair queue's buckets restart empty from here)

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

    def add(self, job: Job) -> None:
        if job.key is not None and job.queue not in self._fair:
            self._keyed(job.queue)
        now = self._clock.time()
        q = self._queues.get(job.queue)
        if q is None:
            q = self._queues[job.queue] = self._new_lanes(job.queue)
            if not self._heaped and len(self._queues) > 1:
                self._rebuild(now)  # a second queue holds jobs: from now on, choose
        ready_at = job.ready_at
        delayed = q.lanes.push(job, ready_at, job.priority, now)
        if self._heaped:
            self._arm(q)
            self._offer(q)
        # With every worker busy there is nobody to hand it to: the next take pops it.
        if self._waiting:
            if not delayed:
                self._hand_out()
                if self._waiting and self._fair and job.queue in self._fair:
                    self._wake.set()  # its key may wait for a token: the dispatcher re-arms
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
        for name, group in by_queue.items():
            if name not in self._fair and any(map(_KEY, group)):
                self._keyed(name)
            q = self._queues.get(name)
            if q is None:
                q = self._queues[name] = self._new_lanes(name)
            q.lanes.load(group, list(map(_DUE, group)), list(map(_PRIORITY, group)), now)
        if len(self._queues) > 1:
            self._rebuild(now)
        if self._waiting:
            self._hand_out()
            self._wake.set()

    def discard(self, job: Job) -> None:
        """``job``'s entry, still in its lanes, is no longer wanted (cancelled). One handed to
        a worker meanwhile is not in them: its worker finds the job moved on instead."""
        if job.id in self._handed:
            return
        q = self._queues.get(job.queue)
        if q is None:
            return
        q.lanes.discard(job.ready_at, job)
        if self._heaped:
            self._offer(q)
        self._drop_if_empty(q)

    async def take(self) -> Job:
        """The next due job's entry; waits until there is one.

        A worker whose jobs never suspend (no-op handlers) never yields to the loop: it
        would take job after job, up to the outcomes it may have in flight (4,096), while
        a job handed to a worker that waited sat there unstarted. Measured in S: a tenant's
        one job, claimed second behind a flood, started 4,096th. So while a handed job has
        not reached its worker, a taker that would take one now yields once first: a set's
        truth a take, no more. One that will wait behind others needs no yield: its wait is
        one (and the yield cost no-op jobs a loop turn each, ~2 % of their instructions)."""
        if not self._waiting:  # nobody has waited longer: take the next one now
            if self._handed:
                await asyncio.sleep(0)
            if not self._waiting:  # (nor did anyone start waiting during the yield)
                taken = self._pop(self._clock.time())
                if taken is not None:
                    self.dispatched += 1
                    return taken
        waiter: asyncio.Future[Job] = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        self._wake.set()  # the dispatcher arms the timer for the next delayed job
        job = await waiter  # (cancelled once handed out: only at a stop, when it matters not)
        self._handed.discard(job.id)
        return job

    def _hand_out(self) -> None:
        """Give due jobs to waiting workers, longest-waiting first, while both last."""
        now = self._clock.time()
        while (worker := self._next_worker()) is not None:
            taken = self._pop(now)
            if taken is None:
                return
            self._waiting.popleft()
            self._handed.add(taken.id)
            worker.set_result(taken)
            self.dispatched += 1

    def poke(self, queue: str | None = None) -> None:
        """``queue`` (None: any) may have opened (capacity freed, resumed): look again."""
        if self._heaped:
            now = self._clock.time()
            reopen = self._queues.values() if queue is None else [self._queues.get(queue)]
            for q in reopen:
                if q is None:
                    continue
                fair = q.name in self._fair
                if q.closed or fair:  # (a fair queue: a key may have opened, or may wait)
                    q.closed = False
                    q.lanes.promote(now)
                    self._offer(q)
                    if fair:
                        self._arm(q)
        if self._waiting:
            self._hand_out()
            if self._waiting and queue is not None and queue in self._fair:
                self._wake.set()  # its next token may be sooner now: the dispatcher re-arms

    # -- fair queues ----------------------------------------------------------------------

    def set_policy(self, queue: str, policy: Policy | None, running: Sequence[Job] = ()) -> None:
        """``queue``'s policy is now ``policy`` (None: the default, ``Policy()``: fair
        between keys once a job has one, no limits); ``running``: its jobs running here
        now, which a new policy counts."""
        if policy is None:
            self._policies.pop(queue, None)
        else:
            self._policies[queue] = policy
        fair = self._fair.get(queue)
        if fair is not None and policy is not None and not policy.plain:
            fair.set_policy(policy, self._clock.time())
        elif policy is not None and not policy.plain:
            self._make_fair(queue, policy, running)
        elif fair is not None:  # no limits left: fair only while its keyed jobs last
            fair.set_policy(policy or Policy(), self._clock.time())
            if (policy is not None and not policy.fair) or not fair.keyed():
                self._unmake_fair(queue)
        elif policy is None or policy.fair:  # fair again: if keyed jobs wait, now
            q = self._queues.get(queue)
            if q is not None and any(job.key is not None for job in q.lanes.held()):
                self._make_fair(queue, policy or Policy())
        self.poke(queue)

    def _make_fair(self, queue: str, policy: Policy, running: Sequence[Job] = ()) -> FairLanes:
        """``queue``'s keyed lanes, counting the jobs of it running now (``running``, else
        the claims' own account): its ends are the ones they will hear of."""
        fair = self._fair[queue] = FairLanes(self._current, policy, self._started_at)
        for job in running or self.running(queue):
            fair.started(job)
        self._relane(queue, self._clock.time())
        return fair

    def _unmake_fair(self, queue: str) -> None:
        del self._fair[queue]
        self._relane(queue, self._clock.time())

    def _keyed(self, queue: str) -> None:
        """A job with a key came to ``queue``: fair between keys from now on, unless its
        policy says ``fair: false`` (a queue with limits is fair already)."""
        policy = self._policies.get(queue)
        if policy is None or policy.fair:
            self._make_fair(queue, policy or Policy())

    def policy(self, queue: str) -> Policy | None:
        fair = self._fair.get(queue)
        return None if fair is None else fair.policy

    def ended(self, job: Job) -> None:
        """An attempt of ``job`` handed out here is over: its key's slot is free."""
        fair = self._fair.get(job.queue)
        if fair is not None:
            fair.ended(job, self._clock.time())
            self.poke(job.queue)

    def pushed_back(self, job: Job, after_s: float) -> None:
        """``job``'s handler said its upstream takes no more for ``after_s`` (a handler's
        ``RateLimited``): its key's bucket moves on."""
        fair = self._fair.get(job.queue)
        if fair is not None:
            fair.pushed_back(job.key, after_s, self._clock.time())
            self.poke(job.queue)

    def key_stats(self) -> dict[str, list[tuple[str | None, int, int, float]]]:
        """Every fair queue's keys held (``FairLanes.key_stats``)."""
        now = self._clock.time()
        return {queue: fair.key_stats(now) for queue, fair in self._fair.items()}

    def keys(self, queue: str) -> dict[str | None, tuple[int, int]]:
        """A fair queue's keys held: (due jobs, running) each; empty for any other."""
        fair = self._fair.get(queue)
        return {} if fair is None else fair.keys()

    def _relane(self, queue: str, now: float) -> None:
        """``queue``'s entries into the lanes its policy now asks for (O(its entries): a
        policy set or dropped, never a job's path)."""
        q = self._queues.get(queue)
        if q is None:
            return
        held = q.lanes.held()
        lanes = self._fair.get(queue)
        q.lanes = lanes if lanes is not None else QueueLanes(queue, self._current).lanes
        for job in held:
            q.lanes.push(job, job.ready_at, job.priority, now)
        if self._heaped:
            q.turn, q.timer, q.closed = -1, None, False
            self._arm(q)
            self._offer(q)

    def sizes(self) -> dict[str, int]:
        due = delayed = 0
        for q in self._queues.values():
            sizes = q.lanes.sizes()
            due += sizes["immediate"]
            delayed += sizes["delayed"]
        return {"immediate": due, "delayed": delayed, "workers_waiting": len(self._waiting)}

    def depth(self, queue: str) -> int:
        q = self._queues.get(queue)
        return len(q.lanes) if q is not None else 0

    def held(self) -> dict[str, list[Job]]:
        """Every queue's entries still wanted (O(n): for checks such as the model test)."""
        return {name: q.lanes.held() for name, q in self._queues.items()}

    def queues_held(self) -> int:
        """Queues whose lanes hold an entry now (every other one costs nothing)."""
        return len(self._queues)

    # -- choosing -----------------------------------------------------------------------

    def _pop(self, now: float) -> Job | None:
        """The next job of the open queue whose next job has the highest priority."""
        queues = self._queues
        if not self._heaped:  # the common case: one queue (or none), no choosing
            if not queues:
                return None
            [q] = queues.values()
            name = q.name
            lanes = q.lanes
            if not self._gate(name):
                # What fell due moves to its deque anyway: left in the heap, it would be
                # the next wakeup, already past, and the dispatcher would spin until poked.
                lanes.promote(now)
                return None
            job = lanes.pop(now)
            if not lanes.due and not lanes.delayed:
                self._queues = {}  # (a fresh dict: see _drop_if_empty)
                if not (lanes.stale_ready or lanes.stale_delayed) and name not in self._fair:
                    self._spare = q  # empty: as good as new (``_new_lanes``)
            if job is None:
                return None
            self._taken(name)
            return job
        self._fire(now)
        due = self._due
        while due:
            _, turn, name = due[0]
            held = queues.get(name)
            if held is None or held.turn != turn:
                heapq.heappop(due)  # outdated: its queue moved on
                continue
            heapq.heappop(due)
            q = held
            q.turn = -1
            if not self._gate(name):
                q.closed = True  # out of the heap until poked: never looked at again meanwhile
                continue
            job = q.lanes.pop(now)
            self._offer(q)  # its next job, if any, at a fresh turn: behind its equals
            if self._fair and name in self._fair:
                self._arm(q)  # its next token, if a key waits for one
            self._drop_if_empty(q)
            if job is not None:
                self._taken(name)
                return job
            if not self._heaped:  # one queue is left: the direct path decides
                return self._pop(now)
        return None

    def _offer(self, q: QueueLanes[Job]) -> None:
        """Keep ``q``'s entry in the due heap true: there iff open with a due job, keyed on it."""
        if q.closed:
            return
        top = q.lanes.top()
        if top is None:
            q.turn = -1
            return
        if q.turn >= 0 and top == q.prio:
            return
        q.prio, q.turn = top, next(self._turns)
        heapq.heappush(self._due, (-top, q.turn, q.name))
        if len(self._due) > 2 * len(self._queues) + _SLACK:
            self._due = [(-x.prio, x.turn, x.name) for x in self._queues.values() if x.turn >= 0]
            heapq.heapify(self._due)

    def _arm(self, q: QueueLanes[Job]) -> None:
        """Keep ``q``'s entry in the timer heap at its earliest delayed job."""
        wake = q.lanes.next_wakeup()
        if wake is None or (q.timer is not None and q.timer <= wake):
            return
        q.timer = wake
        heapq.heappush(self._timers, (wake, q.name))
        if len(self._timers) > 2 * len(self._queues) + _SLACK:
            self._timers = [(x.timer, x.name) for x in self._queues.values() if x.timer is not None]
            heapq.heapify(self._timers)

    def _fire(self, now: float) -> None:
        """Queues whose delayed jobs fell due by ``now`` join the due heap."""
        timers = self._timers
        while timers and timers[0][0] <= now:
            at, name = heapq.heappop(timers)
            q = self._queues.get(name)
            if q is None or q.timer != at:
                continue
            q.timer = None
            q.lanes.promote(now)
            self._arm(q)
            self._offer(q)

    def _new_lanes(self, name: str) -> QueueLanes[Job]:
        if self._fair:
            fair = self._fair.get(name)
            if fair is not None:
                return QueueLanes(name, self._current, fair)
        spare = self._spare
        if spare is None:
            return QueueLanes(name, self._current)
        self._spare = None
        spare.name, spare.turn, spare.prio, spare.timer, spare.closed = name, -1, 0, None, False
        spare.lanes.seen = -math.inf  # (what a new queue's lanes have seen: nothing yet)
        return spare

    def _drop_if_empty(self, q: QueueLanes[Job]) -> None:
        if q.lanes.entries or self._queues.get(q.name) is not q:
            return
        del self._queues[q.name]
        if self._fair and q.name in self._fair:
            policy = self._policies.get(q.name)
            if (policy is None or policy.plain) and not self._fair[q.name].keyed():
                del self._fair[q.name]  # fair only for its keys, and they are gone
        q.turn, q.timer = -1, None
        if len(self._queues) <= 1:  # one queue left (or none): back to the direct path
            self._heaped = False
            self._due, self._timers = [], []
            # A dict never shrinks, and walking one that held 10,000 queues skips every
            # hole (the direct path's unpacking did, measured): start a fresh one.
            self._queues = {x.name: x for x in self._queues.values()}

    def _rebuild(self, now: float) -> None:
        """Both heaps from the queues' records (more than one queue holds jobs now)."""
        self._heaped = True
        self._due, self._timers = [], []
        for q in self._queues.values():
            q.turn, q.timer, q.closed = -1, None, False
            q.lanes.promote(now)
            self._arm(q)
            self._offer(q)

    def _next_wakeup(self) -> float | None:
        if not self._heaped:
            return next((q.lanes.next_wakeup() for q in self._queues.values()), None)
        timers = self._timers
        while timers:
            at, name = timers[0]
            q = self._queues.get(name)
            if q is not None and q.timer == at:
                return at
            heapq.heappop(timers)
        return None

    def _next_worker(self) -> asyncio.Future[Job] | None:
        while self._waiting and self._waiting[0].done():  # cancelled while it waited
            self._waiting.popleft()
        return self._waiting[0] if self._waiting else None

    async def _run(self) -> None:
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
                self._timer = self._clock.call_later(delay, self._wake.set)
            await self._wake.wait()
            self.wakeups += 1
