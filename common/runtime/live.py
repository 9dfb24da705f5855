"""``LiveJobs``: this process's view of every scheduled or running job, and its counters.

Every change to the view goes through ``add`` or ``applied``, after the change
is durable, so the view, the counts by state and the event totals can never
disagree with each other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from operator import attrgetter

from common.models import TERMINAL, Job, Transition


class LiveJobs:
    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self.counts: Counter[str] = Counter()  # live jobs by state
        self.totals: Counter[str] = Counter()  # events since this process started
        self.on_finished: Callable[[Job], None] | None = None  # told of every job that ends
        self.queues: Counter[str] = Counter()  # live jobs by queue

    def get(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)

    def __len__(self) -> int:
        return len(self.jobs)

    def add(self, job: Job) -> None:
        """A job that is now durable: submitted, or found at recovery."""
        self._publish(job)

    def load(self, jobs: list[Job]) -> None:
        """What recovery found, at once (counted by C loops, not one ``add`` per job)."""
        self.jobs.update(zip(map(attrgetter("id"), jobs), jobs, strict=True))
        for state, n in Counter(map(attrgetter("state"), jobs)).items():
            self.counts[state.value] += n
        self.queues.update(map(attrgetter("queue"), jobs))

    def applied(self, job: Job, t: Transition) -> Job:
        """``job`` after the durable transition ``t``; finished jobs leave the view."""
        new = job.apply(t)
        self._publish(new, job)
        return new

    def _publish(self, new: Job, old: Job | None = None) -> None:
        if old is not None and old.state not in TERMINAL:  # a retried dead job was not counted
            self.counts[old.state.value] -= 1
            self.queues[old.queue] -= 1
        if new.state in TERMINAL:
            self.jobs.pop(new.id, None)
            self.totals[new.state.value] += 1
            if self.on_finished is not None:
                self.on_finished(new)
        else:
            self.jobs[new.id] = new
            self.counts[new.state.value] += 1
            self.queues[new.queue] += 1
