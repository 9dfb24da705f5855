"""``LiveJobs``: this process's view of every scheduled or running job, and its counts.

Every change to the view goes through ``add`` or ``applied``, after the change
is durable, so the view, the counts by state and the terminal events (recorded in
``Events`` as a job leaves the view, through ``ended``) can never disagree with
each other.

The counts by queue and by (state, queue) are kept as the view changes, so that
``/metrics`` and ``--max-queues`` read them without walking every live job, and a
queue with no live job has no entry in them at all (a name used once costs nothing
from then on).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from operator import attrgetter
from typing import TypeVar

from sqlq.common.models import TERMINAL, Job, State, Transition
from sqlq.runtime.events import ENDED, Events

_STATE_QUEUE = attrgetter("state", "queue")
K = TypeVar("K", bound=Hashable)


class LiveJobs:
    def __init__(self, events: Events | None = None) -> None:
        self.jobs: dict[str, Job] = {}
        # Keyed by the ``State`` itself, never its ``.value``: the enum's property is a Python
        # call, paid three times a transition here; a ``StrEnum`` hashes and compares as its
        # value, so a lookup by the string finds the same entry.
        self.counts: Counter[State] = Counter()  # live jobs by state
        self.events = events or Events()
        self.on_finished: Callable[[Job], None] | None = None  # told of every job that ends
        self.queues: Counter[str] = Counter()  # live jobs by queue; no zero entries
        self.census: Counter[tuple[State, str]] = Counter()  # by (state, queue); no zero entries

    def get(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)

    def __len__(self) -> int:
        return len(self.jobs)

    def add(self, job: Job) -> None:
        """A job that is now durable: submitted, or found at recovery."""
        self._publish(job)

    def load(self, jobs: list[Job], by_id: dict[str, Job] | None = None) -> None:
        """What recovery found, at once (counted by C loops, not one ``add`` per job);
        ``by_id``: the same jobs by id, taken as the view's own (``Recovery.by_id``)."""
        if by_id is not None and not self.jobs:
            self.jobs = by_id
        else:
            self.jobs.update(zip(map(attrgetter("id"), jobs), jobs, strict=True))
        census = Counter(map(_STATE_QUEUE, jobs))
        for (state, queue), n in census.items():
            self.counts[state] += n
            self.queues[queue] += n
            self.census[state, queue] += n

    def applied(self, job: Job, t: Transition) -> Job:
        """``job`` after the durable transition ``t``; finished jobs leave the view."""
        new = job.apply(t)
        self._publish(new, job)
        return new

    def replaced(self, old: Job, new: Job) -> None:
        """``applied``, for a caller that made ``new`` of ``old`` already (a claim, which
        hands the running job to its worker before the claim is durable)."""
        self._publish(new, old)

    def _publish(self, new: Job, old: Job | None = None) -> None:
        was_live = old is not None and old.state not in TERMINAL  # (a revived one was not)
        live = new.state not in TERMINAL
        moved = not (was_live and live and old is not None and old.queue == new.queue)
        if old is not None and was_live:
            self.counts[old.state] -= 1
            census, key = self.census, (old.state, old.queue)
            n = census.pop(key, 0)  # (``_uncount``, inline: two transitions a job come here)
            if n > 1:
                census[key] = n - 1
            if moved:
                _uncount(self.queues, old.queue)
        if live:
            self.jobs[new.id] = new
            self.counts[new.state] += 1
            self.census[new.state, new.queue] += 1
            if moved:
                self.queues[new.queue] += 1
        else:
            self.jobs.pop(new.id, None)
            self.ended(new)

    def ended(self, job: Job) -> None:
        """``job`` is finished (here, or on another node in shared mode): count it, and
        tell whoever waits on it."""
        self.events.record(ENDED[job.state], job)
        if self.on_finished is not None:
            self.on_finished(job)


def _uncount(counter: Counter[K], key: K) -> None:
    """One fewer of ``key``; the last one takes its entry with it (never left at 0)."""
    n = counter.pop(key, 0)
    if n > 1:
        counter[key] = n - 1
