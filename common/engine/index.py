"""An in-memory fold of changes: the state of the memory engine and walq's index.

``stage`` validates one caller's changes against the committed state plus what
earlier callers in the same batch staged, without touching the committed state;
``publish`` makes a staged batch visible once it is durable. Keeping the two
apart is what lets a group commit reject one caller's changes while the others
in the batch go through, and lets readers see only durable state.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from functools import partial
from itertools import islice
from typing import cast

from sqlq.common.engine.cascade import (
    Move,
    cascade,
    check_member,
    check_revival,
    counted,
    revived_alone,
)
from sqlq.common.engine.sortedids import SortedIds
from sqlq.common.errors import (
    DuplicateJobError,
    DuplicateKeyError,
    JobNotFoundError,
)
from sqlq.common.models import LIVE, TERMINAL, Job, State, Transition
from sqlq.common.schedule import PutSchedule, Schedule, fold, key_range
from sqlq.common.store import Cascaded, Change, JobQuery


def expired(job: Job, cutoff: float) -> bool:
    """The retention rule, in one place: finished, and last updated before ``cutoff``. A
    workflow's member is pruned only with its whole workflow (``retired``)."""
    return job.state in TERMINAL and job.updated_at < cutoff


def retired(job: Job, cutoff: float, held: frozenset[str]) -> bool:
    """Past retention and to be pruned: ``expired``, and not a member of a workflow in
    ``held`` (``JobIndex.held_workflows``: one with a member that has not expired). A
    workflow goes as a unit, never a parent under a live child."""
    return expired(job, cutoff) and (job.flow is None or job.flow.workflow_id not in held)


# What ``stage`` returns: jobs by id, and schedules (None: dropped) by ``SCHEDULE`` + name.
# Job ids are hex digits, so no job id starts with it.
SCHEDULE = "\x00"
Staged = dict[str, Job | Schedule | None]

Key = tuple[State | None, str | None, str | None]  # (state, queue, kind); None: any
Fields = tuple[State, str, str]  # what a job is listed under: its state, queue and kind
ALL: Key = (None, None, None)
# How many changes may wait for the next page, beyond half the jobs, before the
# indexes are dropped instead (rebuilt on the next page): a server nobody lists
# must not keep a record of every change it ever made.
PENDING_SLACK = 4096


def _mask(query: JobQuery) -> int:
    """Which of state (1), queue (2) and kind (4) ``query`` filters on."""
    return (
        (query.state is not None) | (query.queue is not None) << 1 | (query.kind is not None) << 2
    )


def _key(mask: int, fields: Key) -> Key:
    """The bucket of ``fields`` (a job's, or a query's) in the family ``mask``."""
    state, queue, kind = fields
    return (state if mask & 1 else None, queue if mask & 2 else None, kind if mask & 4 else None)


Built = dict[int, dict[Key, SortedIds]]  # families' buckets by mask, built from a snapshot


def _families(masks: list[int], ids: list[str], jobs: list[Job]) -> Built:
    """The buckets of each family in ``masks``, from a snapshot of the jobs (``ids`` and
    ``jobs``, as the index held them). Pure: it may run on any thread."""
    out: Built = {}
    for mask in masks:
        if mask == 0:
            out[0] = {ALL: SortedIds(sorted(ids))}
            continue
        by_state, by_queue, by_kind = mask & 1, mask & 2, mask & 4
        groups: dict[Key, list[str]] = defaultdict(list)
        for job in jobs:
            groups[
                (
                    job.state if by_state else None,
                    job.queue if by_queue else None,
                    job.kind if by_kind else None,
                )
            ].append(job.id)
        for ids_ in groups.values():
            ids_.sort()  # in the order they were stored: nearly sorted, so about linear
        out[mask] = {key: SortedIds(ids_) for key, ids_ in groups.items()}
    return out


class JobIndex:
    """Jobs by id, idempotency keys, and ids in order per filter, for paging.

    A page is a bisect into the ids that match its filter exactly, then ``limit``
    steps: O(page + log n) whatever the filter and however few jobs match. The
    ids are kept per *family* of filters (none; state; queue; state and queue;
    ... all 8 combinations of state, queue and kind), one ``SortedIds`` per value
    (an empty one is dropped, so a queue or kind that is gone costs nothing).

    What that costs is paid by listing, not by the commit path:

    - a family is built on the first page that filters that way (a pass over
      the jobs), so recovery and a server nobody lists pay nothing; the
      engines build it off the event loop (``page_async``: about 0.5 s at a
      million jobs), from a snapshot, and bring it up to date with what
      changed meanwhile;
    - once any family exists, ``publish`` and ``forget`` only note which jobs
      changed (and what they were listed under); the next page applies the
      notes, each job once however many times it changed meanwhile (a job
      submitted and finished between two dashboard refreshes is one insert);
    - when more changes wait than half the jobs (plus ``PENDING_SLACK``), the
      families are dropped instead: rebuilding costs about as much as catching
      up, and the notes stay bounded.
    """

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self.keys: dict[str, str] = {}  # idempotency key -> job id
        self.schedules: dict[str, Schedule] = {}  # by name
        # A workflow member's children, by the parent's id: who ``cascade`` visits when it
        # ends. Kept while the parent is (``forget``); a child that left waiting is passed.
        self.children: dict[str, list[str]] = {}
        # Each workflow's members, in the order they were stored (dicts as ordered sets).
        self.members: dict[str, dict[str, None]] = {}
        self._buckets: dict[Key, SortedIds] = {}  # every built family's buckets
        self._masks: list[int] = []  # the families built
        # Changed since the last page: job id -> what the buckets list it under (None: not
        # listed). Recorded only while some family is built, or being built.
        self._pending: dict[str, Fields | None] = {}
        # While a family is built off the loop: what changed since its snapshot, as it was
        # then (the first note of each job wins). None: no build in flight.
        self._since: dict[str, Fields | None] | None = None
        self._builds = asyncio.Lock()  # one build at a time
        self._generation = 0  # bumped when the families are dropped: a build then is void

    def get(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id)

    def __len__(self) -> int:
        return len(self.jobs)

    def stage(
        self,
        changes: Sequence[Change],
        staged: Staged,
        staged_keys: set[str] | frozenset[str] = frozenset(),
        cascaded: list[Cascaded] | None = None,
        cutoff: float | None = None,
        adopted: dict[str, list[str]] | None = None,
    ) -> Staged:
        """The jobs and schedules ``changes`` produce on top of ``staged`` (whose new jobs
        hold ``staged_keys``, and whose new workflow members are ``adopted``'s children, by
        parent: a call's own members are added to it once it is staged); raises, changing
        nothing.

        A workflow member's end also changes its waiting children, in the same call
        (``cascade``); those moves are added to ``cascaded``, for the engine to
        write in the same record and to tell the runtime of. Given a retention ``cutoff``,
        a finished job ``retired`` at it is as gone as a pruned one (``JobNotFoundError``),
        though it may still be kept: a snapshot in flight has left it out."""
        mine: Staged = {}
        my_keys: set[str] = set()
        made: list[Job] = []  # new workflow members with parents
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
                if change.flow is not None and change.flow.parents:
                    made.append(change)
            elif isinstance(change, Transition):
                current = self._current(change.job_id, mine, staged)
                if current is None or (
                    cutoff is not None and current.state in TERMINAL and self._gone(current, cutoff)
                ):
                    raise JobNotFoundError(change.job_id)
                new = current.apply(change)
                if new.flow is not None and new.state is not current.state:
                    if revived_alone(current, new):
                        check_revival(new, partial(self._state_of, mine=mine, staged=staged))
                    mine[change.job_id] = new
                    self._cascade(current, new, mine, staged, cascaded, change, adopted, made)
                else:
                    mine[change.job_id] = new
            else:
                name = change.schedule.name if isinstance(change, PutSchedule) else change.name
                idle = getattr(change, "idle", None)
                idle_job = None if idle is None else self._current(idle, mine, staged)
                live = idle_job is not None and idle_job.state in LIVE
                mine[SCHEDULE + name] = fold(self._schedule(name, mine, staged), change, live)
        if made:  # each new member's counts, once the call's other jobs are in
            state_of = partial(self._state_of, mine=mine, staged=staged)
            for job in counted(made):
                check_member(job, state_of)
            if adopted is not None:  # (staged: a later call's cascade in the batch finds it)
                for job in made:
                    for parent in job.flow.parents if job.flow else ():
                        adopted.setdefault(parent, []).append(job.id)
        return mine

    def _gone(self, job: Job, cutoff: float) -> bool:
        """Whether the finished ``job`` is past retention at ``cutoff`` (``retired``)."""
        if not expired(job, cutoff):
            return False
        return job.flow is None or self.workflow_expired(job.flow.workflow_id, cutoff)

    def _cascade(
        self,
        old: Job,
        new: Job,
        mine: Staged,
        staged: Staged,
        out: list[Cascaded] | None,
        cause: Change,
        adopted: dict[str, list[str]] | None = None,
        made: list[Job] | None = None,
    ) -> None:
        """``cascade.walk`` over what is committed, ``staged`` and ``mine``: each child's
        move staged into ``mine`` and added to ``out``. A parent's children are those
        committed, those an earlier call of the batch made (``adopted``) and this call's
        own (``made``): an append and its parent's end in one batch miss nothing."""

        current = partial(self._current, mine=mine, staged=staged)

        def children(parents: tuple[str, ...]) -> dict[str, list[Job]]:
            out: dict[str, list[Job]] = {}
            for parent in parents:
                ids = [*self.children.get(parent, ()), *(adopted or {}).get(parent, ())]
                ids += [j.id for j in made or () if j.flow is not None and parent in j.flow.parents]
                kids = [k for k in (current(c) for c in ids) if k is not None]
                if kids:
                    out[parent] = kids
            return out

        def states(ids: tuple[str, ...]) -> dict[str, str]:
            return {i: j.state.value for i in ids if (j := current(i)) is not None}

        def put(moves: list[Move]) -> None:
            for move in moves:
                mine[move.after.id] = move.after
                if out is not None:
                    out.append(Cascaded(move.before, move.after, move.change, cause))

        cascade(old, new, children, states, put)

    def _state_of(self, job_id: str, mine: Staged, staged: Staged) -> str | None:
        job = self._current(job_id, mine, staged)
        return None if job is None else job.state.value

    def _current(self, job_id: str, mine: Staged, staged: Staged) -> Job | None:
        for layer in (mine, staged):
            if job_id in layer:
                return cast(Job, layer[job_id])
        return self.jobs.get(job_id)

    def _schedule(self, name: str, mine: Staged, staged: Staged) -> Schedule | None:
        for layer in (mine, staged):
            if SCHEDULE + name in layer:
                return cast("Schedule | None", layer[SCHEDULE + name])
        return self.schedules.get(name)

    def publish(self, staged: Staged) -> None:
        jobs, keys = self.jobs, self.keys
        pending = self._pending if self._masks or self._since is not None else None
        for job_id, job in staged.items():
            if not isinstance(job, Job):
                name = job_id[len(SCHEDULE) :]
                if job is None:
                    self.schedules.pop(name, None)
                else:
                    self.schedules[name] = job
                continue
            old = jobs.get(job_id)
            if old is None:
                if job.idempotency_key is not None:
                    keys[job.idempotency_key] = job_id
                if job.flow is not None:
                    self._adopt(job)
                if pending is not None:
                    pending.setdefault(job_id, None)
            elif pending is not None and job_id not in pending:
                pending[job_id] = (old.state, old.queue, old.kind)
            jobs[job_id] = job
        if pending is not None:
            self._bound()

    def _adopt(self, job: Job) -> None:
        """Note ``job`` as its workflow's member, and a child of each of its parents."""
        assert job.flow is not None
        workflow = self.members.get(job.flow.workflow_id)
        if workflow is None:
            self.members[job.flow.workflow_id] = {job.id: None}
        else:
            workflow[job.id] = None
        children = self.children
        for parent in job.flow.parents:
            kids = children.get(parent)
            if kids is None:
                children[parent] = [job.id]
            else:
                kids.append(job.id)

    def _disown(self, job: Job) -> None:
        """Forget ``job`` as its workflow's member and as a parent (``_adopt`` undone)."""
        assert job.flow is not None
        self.children.pop(job.id, None)
        workflow = self.members.get(job.flow.workflow_id)
        if workflow is not None:
            workflow.pop(job.id, None)
            if not workflow:
                del self.members[job.flow.workflow_id]

    def apply(self, changes: Sequence[Change], cascaded: list[Cascaded] | None = None) -> None:
        """Stage and publish at once: the memory engine's commit."""
        self.publish(self.stage(changes, {}, cascaded=cascaded))

    def insert(self, job: Job) -> None:
        """Recovery's fold of one new job (a snapshot's): the checks ``replay`` makes of it,
        without a list around it (a million of them at an open)."""
        if self.jobs.setdefault(job.id, job) is not job:  # (one lookup: a million at an open)
            raise DuplicateJobError(job.id)
        key = job.idempotency_key
        if key is not None:
            if key in self.keys:
                del self.jobs[job.id]  # (refused whole: ``replay`` checks the key first)
                raise DuplicateKeyError(key)
            self.keys[key] = job.id
        if job.flow is not None:
            self._adopt(job)
        if self._masks:  # recovery comes before any listing
            self._drop()

    def replay(self, changes: Iterable[Change]) -> None:
        """Recovery's fold: each change straight into the state, checked as ``stage`` checks
        (``Job.apply`` for a transition), without staging. Not atomic: a change that is
        refused raises with the ones before it applied, which only recovery may afford,
        because a refused change there fails the whole recovery. A workflow's cascade is
        not derived again: the record holds it, written out (``stage``'s ``cascaded``)."""
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
                if change.flow is not None:
                    self._adopt(change)
            elif isinstance(change, Transition):
                job = jobs.get(change.job_id)
                if job is None:
                    raise JobNotFoundError(change.job_id)
                jobs[change.job_id] = job.apply(change)
            else:
                self.publish(self.stage([change], {}))
        if self._masks or self._since is not None:  # recovery comes before any listing
            self._drop()

    def forget(self, job_id: str) -> None:
        """Drop a job past retention, and its idempotency key with it."""
        job = self.jobs.pop(job_id, None)
        if job is not None:
            if job.flow is not None:
                self._disown(job)
            if (self._masks or self._since is not None) and job_id not in self._pending:
                self._pending[job_id] = (job.state, job.queue, job.kind)
                self._bound()
            if job.idempotency_key is not None:
                self.keys.pop(job.idempotency_key, None)

    def held_workflows(self, cutoff: float) -> frozenset[str]:
        """The workflows with a member that has not expired at ``cutoff``: none of their
        members is pruned (``retired``). One pass over the members, none without any."""
        if not self.members:
            return frozenset()
        jobs = self.jobs
        return frozenset(
            workflow_id
            for workflow_id, ids in self.members.items()
            if any(not expired(jobs[i], cutoff) for i in ids if i in jobs)
        )

    def workflow_expired(self, workflow_id: str, cutoff: float) -> bool:
        """Whether every member of a workflow has expired at ``cutoff``."""
        jobs = self.jobs
        ids = self.members.get(workflow_id, {})
        # (newest first: a live member, if any, is most likely among the last stored)
        return all(expired(jobs[i], cutoff) for i in reversed(ids) if i in jobs)

    def workflow(self, workflow_id: str) -> list[Job]:
        """A workflow's members still kept, in the order they were stored."""
        ids = self.members.get(workflow_id, ())
        return [self.jobs[i] for i in ids]

    def by_key(self, key: str) -> Job | None:
        job_id = self.keys.get(key)
        return None if job_id is None else self.jobs.get(job_id)

    def page(self, query: JobQuery) -> list[Job]:
        """A page; a family it needs that is not built yet is built here, on this thread."""
        if query.schedule is not None:
            return self._schedule_page(query)
        mask = _mask(query)
        self._catch_up()
        if mask not in self._masks:
            self._install(_families([mask], list(self.jobs), list(self.jobs.values())))
        bucket = self._buckets.get(_key(mask, (query.state, query.queue, query.kind)))
        if bucket is None:
            return []
        jobs = self.jobs
        ids = bucket.before(query.after) if query.descending else bucket.after(query.after)
        return [jobs[job_id] for job_id in islice(ids, query.limit)]

    async def page_async(
        self, query: JobQuery, offload: Callable[[Callable[[], Built]], Awaitable[Built]]
    ) -> list[Job]:
        """``page``, with a family it needs built by ``offload`` (a thread) from a snapshot
        of the jobs, while commits and other pages go on; then what changed since the
        snapshot is applied to it, on this thread, before it serves a page."""
        mask = _mask(query)
        while query.schedule is None and mask not in self._masks:
            async with self._builds:
                if mask in self._masks:
                    break
                self._catch_up()
                generation = self._generation
                ids, jobs = list(self.jobs), list(self.jobs.values())  # immutable jobs: a snapshot
                self._since = {}
                try:
                    built = await offload(partial(_families, [mask], ids, jobs))
                    if generation == self._generation:
                        self._catch_up()  # the built families, and _since, up to now
                        self._install(built, self._since)
                finally:
                    self._since = None
        return self.page(query)

    def _schedule_page(self, query: JobQuery) -> list[Job]:
        """A page of one schedule's jobs, found by their keys: a walk of the keys (a
        schedule's listing is rare, and its jobs are a few of the retained ones)."""
        low, high = key_range(query.schedule or "")
        ids = sorted(
            (i for k, i in self.keys.items() if low <= k < high and query.beyond(i)),
            reverse=query.descending,
        )
        found = (self.jobs[i] for i in ids)
        return list(islice((j for j in found if query.matches(j)), query.limit))

    # -- the listing families (see the class docstring) ------------------------------------

    def _install(self, built: Built, changed: dict[str, Fields | None] | None = None) -> None:
        """Add families built from a snapshot (but none already there), after ``changed``
        (what changed since the snapshot) is applied to them; nothing may be pending."""
        masks = [mask for mask in built if mask not in self._masks]
        for mask in masks:
            self._buckets.update(built[mask])
        if changed:
            self._apply(changed, masks)
        self._masks.extend(masks)

    def _catch_up(self) -> None:
        """Move each job that changed since the last page to the buckets it belongs in now."""
        pending = self._pending
        if not pending:
            return
        self._pending = {}
        since = self._since
        if since is not None:  # a family being built needs these too, as they were
            for job_id, was in pending.items():
                since.setdefault(job_id, was)
        self._apply(pending, self._masks)

    def _apply(self, changed: dict[str, Fields | None], masks: list[int]) -> None:
        """Move each job in ``changed`` from the buckets of the families ``masks`` it was
        listed under to the ones it belongs in now."""
        jobs, buckets = self.jobs, self._buckets
        for job_id, was in changed.items():
            job = jobs.get(job_id)
            now = None if job is None else (job.state, job.queue, job.kind)
            if now == was:
                continue
            for mask in masks:
                old = None if was is None else _key(mask, was)
                new = None if now is None else _key(mask, now)
                if old == new:
                    continue
                if old is not None:
                    bucket = buckets[old]
                    bucket.discard(job_id)
                    if not bucket:
                        del buckets[old]
                if new is not None:
                    if new not in buckets:
                        buckets[new] = SortedIds()
                    buckets[new].add(job_id)

    def _bound(self) -> None:
        """Drop the families if too much waits for them (not while a page is building one:
        what waits is then bounded by how long the build takes)."""
        if self._since is None and len(self._pending) > PENDING_SLACK + len(self.jobs) // 2:
            self._drop()

    def _drop(self) -> None:
        """Forget every family; the next page builds the one it needs."""
        self._buckets.clear()
        self._masks.clear()
        self._pending.clear()
        self._since = None
        self._generation += 1

    def prune(self, cutoff: float) -> int:
        """Forget the jobs ``retired`` at ``cutoff``; returns how many."""
        held = self.held_workflows(cutoff)
        doomed = [j.id for j in self.jobs.values() if retired(j, cutoff, held)]
        for job_id in doomed:
            self.forget(job_id)
        return len(doomed)
