"""An in-memory fold of changes: the state of the memory engine and walq's index.

``stage`` validates one caller's changes against the committed state plus what
earlier callers in the same batch staged, without touching the committed state;
``publish`` makes a staged batch visible once it is durable. Keeping the two
apart is what lets a group commit reject one caller's changes while the others
in the batch go through, and lets readers see only durable state.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from common.errors import DuplicateJobError, JobNotFoundError
from common.models import TERMINAL, Job, Transition
from common.store import Change


def expired(job: Job, cutoff: float) -> bool:
    """The retention rule, in one place: finished, and last updated before ``cutoff``."""
    return job.state in TERMINAL and job.updated_at < cutoff


class JobIndex:
    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}

    def get(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)

    def __len__(self) -> int:
        return len(self.jobs)

    def stage(self, changes: Sequence[Change], staged: dict[str, Job]) -> dict[str, Job]:
        """The jobs ``changes`` produce on top of ``staged``; raises, changing nothing."""
        mine: dict[str, Job] = {}
        for change in changes:
            if isinstance(change, Job):
                if change.id in mine or change.id in staged or change.id in self.jobs:
                    raise DuplicateJobError(change.id)
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
        self.jobs.update(staged)

    def apply(self, changes: Sequence[Change]) -> None:
        """Stage and publish at once: recovery's fold, and the memory engine's commit."""
        self.jobs.update(self.stage(changes, {}))

    def load(self, jobs: Iterable[Job]) -> None:
        for job in jobs:
            self.jobs[job.id] = job

    def live(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.state not in TERMINAL]

    def prune(self, cutoff: float) -> int:
        """Forget the jobs ``expired`` at ``cutoff``; returns how many."""
        doomed = [j.id for j in self.jobs.values() if expired(j, cutoff)]
        for job_id in doomed:
            del self.jobs[job_id]
        return len(doomed)
