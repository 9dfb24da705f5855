"""An in-memory fold of changes: the state of the memory engine and walq's index.

``stage`` validates one caller's changes against the committed state plus what
earlier callers in the same batch staged, without touching the committed state;
``publish`` makes a staged batch visible once it is durable. Keeping the two
apart is what lets a group commit reject one caller's changes while the others
in the batch go through, and lets readers see only durable state.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence

from common.errors import DuplicateJobError, DuplicateKeyError, JobNotFoundError
from common.models import TERMINAL, Job, Transition
from common.store import Change, JobQuery


def expired(job: Job, cutoff: float) -> bool:
    """The retention rule, in one place: finished, and last updated before ``cutoff``."""
    return job.state in TERMINAL and job.updated_at < cutoff


class JobIndex:
    """Jobs by id, idempotency keys, and ids in order for paging.

    The sorted ids are rebuilt only when a page is asked for after a change:
    ids are time-ordered, so the list is nearly sorted and Timsort takes it in
    about linear time; the submit path pays nothing for paging.
    """

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self.keys: dict[str, str] = {}  # idempotency key -> job id
        self._order: list[str] | None = None  # sorted ids; None: rebuild on the next page

    def get(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)

    def __len__(self) -> int:
        return len(self.jobs)

    def stage(
        self,
        changes: Sequence[Change],
        staged: dict[str, Job],
        staged_keys: set[str] | frozenset[str] = frozenset(),
    ) -> dict[str, Job]:
        """The jobs ``changes`` produce on top of ``staged`` (whose new jobs hold
        ``staged_keys``); raises, changing nothing."""
        mine: dict[str, Job] = {}
        my_keys: set[str] = set()
        for change in changes:
            if isinstance(change, Job):
                if change.id in mine or change.id in staged or change.id in self.jobs:
                    raise DuplicateJobError(change.id)
                key = change.idempotency_key
                if key is not None:
                    if key in self.keys or key in staged_keys or key in my_keys:
                        raise DuplicateKeyError(key)
                    my_keys.add(key)
                mine[change.id] = change
            else:
                current = self._current(change, mine, staged)
                mine[change.job_id] = current.apply(change)
        return mine

    def _current(self, t: Transition, mine: dict[str, Job], staged: dict[str, Job]) -> Job:
        job = mine.get(t.job_id) or staged.get(t.job_id) or self.jobs.get(t.job_id)
        if job is None:
            raise JobNotFoundError(t.job_id)
        return job

    def publish(self, staged: dict[str, Job]) -> None:
        jobs = self.jobs
        for job_id, job in staged.items():
            if job_id not in jobs:
                self._order = None
                if job.idempotency_key is not None:
                    self.keys[job.idempotency_key] = job_id
            jobs[job_id] = job

    def apply(self, changes: Sequence[Change]) -> None:
        """Stage and publish at once: recovery's fold, and the memory engine's commit."""
        self.publish(self.stage(changes, {}))

    def replay(self, changes: Iterable[Change]) -> None:
        """Recovery's fold: each change straight into the state, checked as ``stage`` checks
        (``Job.apply`` for a transition), without staging. Not atomic: a change that is
        refused raises with the ones before it applied, which only recovery may afford,
        because a refused change there fails the whole recovery."""
        jobs, keys = self.jobs, self.keys
        for change in changes:
            if isinstance(change, Job):
                if change.id in jobs:
                    raise DuplicateJobError(change.id)
                key = change.idempotency_key
                if key is not None:
                    if key in keys:
                        raise DuplicateKeyError(key)
                    keys[key] = change.id
                jobs[change.id] = change
            else:
                job = jobs.get(change.job_id)
                if job is None:
                    raise JobNotFoundError(change.job_id)
                jobs[change.job_id] = job.apply(change)
        self._order = None

    def load(self, jobs: Iterable[Job]) -> None:
        self.publish({job.id: job for job in jobs})

    def forget(self, job_id: str) -> None:
        """Drop a job past retention, and its idempotency key with it."""
        job = self.jobs.pop(job_id, None)
        if job is not None:
            self._order = None
            if job.idempotency_key is not None:
                self.keys.pop(job.idempotency_key, None)

    def by_key(self, key: str) -> Job | None:
        job_id = self.keys.get(key)
        return None if job_id is None else self.jobs.get(job_id)

    def page(self, query: JobQuery) -> list[Job]:
        if self._order is None:
            self._order = sorted(self.jobs)
        order, jobs = self._order, self.jobs
        start = 0 if query.after is None else bisect.bisect_right(order, query.after)
        out: list[Job] = []
        for job_id in order[start:] if start else order:
            job = jobs[job_id]
            if query.matches(job):
                out.append(job)
                if len(out) >= query.limit:
                    break
        return out

    def live(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.state not in TERMINAL]

    def prune(self, cutoff: float) -> int:
        """Forget the jobs ``expired`` at ``cutoff``; returns how many."""
        doomed = [j.id for j in self.jobs.values() if expired(j, cutoff)]
        for job_id in doomed:
            self.forget(job_id)
        return len(doomed)
