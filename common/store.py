"""The ``JobStore`` protocol: what the runtime may ask of any storage engine.

A *change* is a ``Job`` (a submission, state ``scheduled``), a ``Transition``,
or a change to a schedule (``sqlq.common.schedule``: put, drop, advance its
cursor). Every write goes through ``commit``: the changes of one call are
atomic (all or none), and when ``commit`` returns they are durable at the
engine's sync level. Engines batch concurrent ``commit`` calls into one write
(group commit) but keep each call atomic on its own.

Reads (``get``) only ever see committed changes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

import msgspec

from sqlq.common.fair import Policy
from sqlq.common.models import Job, State, Transition
from sqlq.common.running import Progress
from sqlq.common.schedule import (
    AdvanceSchedule,
    DropSchedule,
    PutSchedule,
    Schedule,
    key_range,
)

SyncLevel = Literal["full", "os"]
DEFAULT_RETENTION_S = 3600.0  # how long finished jobs stay readable

Change = Job | Transition | PutSchedule | DropSchedule | AdvanceSchedule


class Cascaded(NamedTuple):
    """A change a commit made on its own (a workflow member's end moving a child): the job
    before it, the job after it, the transition, which the engine writes, and the index of
    the caller's change it followed from (the engine writes it right after that one, so a
    later change of the same call replays on top of it, as it was staged)."""

    before: Job
    after: Job
    change: Transition
    cause: Change  # the caller's change it followed from (the very object)


# Told, once durable, of what a commit moved on its own (``JobStore.observe_cascade``).
CascadeObserver = Callable[[Sequence[Cascaded]], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovery:
    """What ``open`` found."""

    jobs: list[Job]  # live (non-terminal) jobs, in no particular order
    running: list[str]  # ids of jobs found ``running``: their worker died with the process
    records: int  # records (walq lines, SQLite rows) read
    torn_bytes: int = 0  # bytes of a torn tail that were cut off (kept beside the log)
    seconds: float = 0.0  # wall time the recovery took
    notes: list[str] = field(default_factory=list)  # what else recovery had to say
    paused_queues: list[str] = field(default_factory=list)  # paused, durably, before the stop
    queue_policies: dict[str, Policy] = field(default_factory=dict)  # (``sqlq.common.fair``)
    # ``jobs`` by id, where the engine holds them so (walq: its index, copied whole at C
    # speed): the live view takes it as its own. Built from ``jobs`` a job at a time, a
    # million ids cost 0.36 s of the start; copied, 0.05.
    by_id: dict[str, Job] | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "live_jobs": len(self.jobs),
            "found_running": len(self.running),
            "records": self.records,
            "torn_bytes": self.torn_bytes,
            "seconds": round(self.seconds, 6),
            "notes": list(self.notes),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactionReport:
    bytes_before: int
    bytes_after: int
    jobs_kept: int
    jobs_pruned: int
    seconds: float


MAX_PAGE = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class JobQuery:
    """A page of jobs in id order (ids are time-ordered): filters, then keyset paging.

    ``descending``: newest first, so an operator sees the running job without paging past
    every retained one; ``after`` is then still the last id of the previous page, and the
    page holds the ids below it."""

    state: State | None = None
    kind: str | None = None
    queue: str | None = None
    schedule: str | None = None  # the jobs this schedule made (by their idempotency keys)
    after: str | None = None  # the last id of the previous page
    limit: int = 100
    descending: bool = False

    def beyond(self, job_id: str) -> bool:
        """Whether ``job_id`` comes after the cursor in this query's order."""
        if self.after is None:
            return True
        return job_id < self.after if self.descending else job_id > self.after

    def matches(self, job: Job) -> bool:
        return (
            (self.state is None or job.state is self.state)
            and (self.kind is None or job.kind == self.kind)
            and (self.queue is None or job.queue == self.queue)
            and (self.schedule is None or self._made_by_schedule(job))
        )

    def _made_by_schedule(self, job: Job) -> bool:
        low, high = key_range(self.schedule or "")
        return job.idempotency_key is not None and low <= job.idempotency_key < high


IN_DETAIL = ("disk_bytes", "last_compaction")  # in /stats under each engine's own names


class StoreStats(msgspec.Struct, kw_only=True):
    """What an engine reports for ``/stats``: cheap to build, no I/O.

    The fields every engine has are attributes, so the runtime, the dashboard and
    the benchmark read them by name; what only one engine has goes in ``detail`` and
    is flattened beside them in the JSON. ``disk_bytes`` and ``last_compaction`` are
    for readers in this process: ``/stats`` keeps the names each engine gave them
    (walq's ``log_bytes`` and ``last_compaction``, SQLite's ``disk_bytes``), in its
    ``detail``.
    """

    engine: str
    sync: str  # "full", "os", or "none" (memory)
    durable: bool
    group_commit: bool = False
    emulated_sync_delay_ms: float = 0.0  # benchmark knob; always shown when set
    batches: int = 0  # group-commit batches written
    committed_calls: int = 0  # commit() calls those batches held
    mean_batch: float = 0.0
    max_batch: int = 0
    syncs: int = 0  # points where data was made durable: fdatasyncs, SQLite commits
    failed: str | None = None  # why the engine refuses writes; None while healthy
    disk_bytes: int | None = None  # what its files take now; None: no files (memory, postgres)
    # The last compaction this engine made, whoever asked for it: (wall time it began, report)
    last_compaction: tuple[float, CompactionReport] | None = None
    detail: dict[str, Any] = msgspec.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = msgspec.structs.asdict(self)
        for name in IN_DETAIL:
            del d[name]
        detail = d.pop("detail")
        return {**d, **detail}


class JobStore(Protocol):
    """A durable (or, for ``memory``, deliberately not durable) home for jobs."""

    name: str  # "memory", "walq", "sqlite", "postgres"
    durable: bool  # False only for the memory baseline
    shared: bool  # True: other processes use the same jobs (PostgreSQL); see SharedStore
    sync: SyncLevel  # what "durable" means when commit returns

    async def open(self) -> Recovery:
        """Recover state from disk and start the writer.

        Returns what recovery found. Jobs found ``running`` are reported, not
        changed: requeueing them is the runtime's decision and goes through
        ``commit`` like any other change. Raises ``CorruptLogError`` on damage
        that is not a torn tail, ``StoreLockedError`` if another process holds
        the data. Calling ``open`` twice raises ``StoreError``.
        """
        ...

    def commit(self, changes: Sequence[Change]) -> Awaitable[None]:
        """Apply ``changes`` atomically; the awaitable is done once durable at ``sync``.

        An awaitable, not necessarily a coroutine: a group-committed engine hands back the
        batch's future itself (the call joins the batch at once; no frames wrap the wait),
        which is a commit on every transition of every job. Either way nothing is raised
        by the call itself: every error below comes out of the await.

        A ``Job`` is inserted (``DuplicateJobError`` if its id exists). A
        ``Transition`` is applied only if the job exists (``JobNotFoundError``),
        its epoch equals ``expect_epoch`` (``StaleEpochError``) and the move is in
        ``TRANSITIONS`` (``IllegalTransitionError``). A schedule change is applied
        as its docstring says (``sqlq.common.schedule``), or refused with a
        ``ScheduleError``; changes of one call apply in order, so a call that
        advances a cursor and inserts the tick's job is one tick, whole or not at
        all. A call's new workflow members are counted against their parents after
        its transitions (``cascade.check_member``: a completion and the jobs it spawned,
        ``sqlq.runtime.spawn``), and such a call never moves a job it makes (PostgreSQL
        inserts its members after its moves). On any such error nothing of this call is
        applied; other callers
        batched with it are unaffected. A value that cannot be encoded raises
        ``UnencodableError`` for this call alone. An I/O failure raises
        ``StoreFailedError`` for every caller in the batch and every later call
        until the engine is reopened. On a store that is not open,
        ``StoreClosedError``, even for an empty sequence; on an open one an empty
        sequence is a no-op.
        """
        ...

    async def get(self, job_id: str) -> Job | None:
        """The committed job, or ``None`` if there is none (or it was pruned)."""
        ...

    async def get_many(self, ids: Sequence[str]) -> list[Job | None]:
        """The committed jobs of ``ids``, in their order (None where there is none), in one
        read: a workflow member's parents (``ctx.parents``); on a shared store, what a
        remote worker's heartbeat or outcomes are fenced against."""
        ...

    async def list_jobs(self, query: JobQuery) -> list[Job]:
        """Committed jobs matching ``query`` with ids after ``query.after``, in id order, at
        most ``query.limit``: live jobs and finished ones still within retention."""
        ...

    async def find_key(self, key: str) -> Job | None:
        """The retained job submitted with idempotency key ``key``, or ``None``. A second
        job with a key another retained job holds is refused (``DuplicateKeyError``)."""
        ...

    async def list_schedules(self) -> list[Schedule]:
        """Every committed schedule, in name order (at most ``MAX_SCHEDULES``)."""
        ...

    async def get_schedule(self, name: str) -> Schedule | None:
        """The committed schedule ``name``, or ``None``."""
        ...

    async def set_queue_paused(self, queue: str, paused: bool) -> None:
        """Record that ``queue`` is paused (or not); durable on return, reported by the next
        ``open`` in ``Recovery.paused_queues``. Idempotent."""
        ...

    async def set_queue_policy(self, queue: str, policy: Policy | None) -> None:
        """Record ``queue``'s policy (``sqlq.common.fair``; None: none), as a pause is:
        durable on return, reported by the next ``open`` in ``Recovery.queue_policies``."""
        ...

    def observe_batches(self, observer: Callable[[int, float], None]) -> None:
        """Call ``observer(commit calls, seconds)`` for every batch written (metrics).
        An engine that writes no batches (memory) never calls it."""
        ...

    async def workflow(self, workflow_id: str) -> list[Job]:
        """A workflow's members still kept (none: no such workflow), in submission order.
        An engine that stores no flow (``workflows`` False) has none."""
        ...

    def observe_cascade(self, observer: CascadeObserver) -> None:
        """Call ``observer(moves)`` once a commit is durable with what it moved on its own: a
        workflow member's end moving its waiting children, or a revival its cancelled ones
        (``JobIndex.stage``), in the same commit. The caller's own changes are never among
        them."""
        ...

    async def compact(self) -> CompactionReport:
        """Drop what recovery no longer needs and prune terminal jobs past retention.

        Atomic: a crash at any point leaves a complete, valid store. Concurrent
        ``commit`` calls continue while it runs.
        """
        ...

    async def signing_key(self) -> bytes:
        """The key remote claims' tokens are signed with (``sqlq.common.tokens``): made
        once, at random, and kept durably beside the data (walq: a 0600 file in its
        directory; SQLite: a row in its database; PostgreSQL: a row every node reads),
        so tokens outlive a restart. ``memory`` makes one per process. Never logged."""
        ...

    async def close(self) -> None:
        """Finish queued commits, release files and locks. Idempotent."""
        ...

    def stats(self) -> StoreStats:
        """Counters for ``/stats``: batches, syncs, bytes; cheap, no I/O."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Fence:
    """What a change out of ``running`` must also find in a shared store, beyond the epoch.

    A node's outcome names the node and the time: it applies only while that
    node still holds an unexpired lease. A rescuer's requeue names the time: it
    applies only if the lease is still expired (a late renewal wins).
    """

    holder: str | None = None  # the row's node must be this one
    lease_from: float | None = None  # the lease must run until at least this time
    lease_before: float | None = None  # the lease must have run out before this time


@dataclass(frozen=True, slots=True)
class Lease:
    """A remote worker's lease to renew (``SharedStore.extend``)."""

    job_id: str
    epoch: int
    holder: str
    lease_until: float
    progress: Progress | None = None


@dataclass(frozen=True, slots=True)
class Extended:
    job_id: str
    lease_until: float
    cancel_asked: bool


@dataclass(frozen=True, slots=True)
class Renewal:
    renewed: int  # leases extended
    cancel_asked: frozenset[str] = frozenset()  # of the held jobs, those whose cancel was asked
    # Of the held jobs, those whose lease was not extended (run out, or no longer this
    # node's): their attempts stop now, as a holder that could not renew in time does.
    lost: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class QueueCount:
    queue: str
    state: State
    jobs: int


class SharedStore(JobStore, Protocol):
    """A store many nodes use at once: claims and leases live in it, not in a process.

    ``open`` recovers nothing into memory (``Recovery.jobs`` is empty): the
    queue is the database's. The claim, lease and rescue calls below are what
    ``SharedClaims`` builds the shared mode from.
    """

    node: str  # this process's name among the nodes; unique per start

    async def commit_fenced(self, changes: Sequence[Change], fence: Fence) -> None:
        """``commit``, with every transition also held to ``fence`` (group-committed)."""
        ...

    async def claim(
        self,
        n: int,
        now: float,
        lease_until: float,
        caps: Mapping[str, int],
        *,
        only: Sequence[str] | None = None,
        besides: Sequence[str] = (),
        kinds: Sequence[str] | None = None,
        holder: str | None = None,
        policies: Mapping[str, Policy] | None = None,
    ) -> list[Job]:
        """Up to ``n`` due jobs of unpaused queues, marked running for this node with a new
        epoch, one more attempt and a lease until ``lease_until``; never to two nodes.
        A queue in ``caps`` never has more running jobs than its cap, counted on every node;
        a queue in ``policies`` (``sqlq.common.fair``, one that sets a limit) is claimed by
        its rules, across every node.

        A remote worker's claim names its ``holder`` (``remote_holder``: stored instead of
        this node), the queues it serves (``only``) and perhaps its ``kinds``; this node's
        own claims leave out the remote queues (``besides``)."""
        ...

    async def extend(self, now: float, leases: Sequence[Lease]) -> list[Extended]:
        """Renew remote workers' leases, each fenced like an outcome (still running at its
        epoch, held by its holder, the lease unexpired at ``now``), with its progress if
        any: one statement for all. Those that held come back, with whether a cancel was
        asked for; a lease missing from the answer is fenced."""
        ...

    async def next_due(self, now: float, *, remote: bool = False) -> float | None:
        """When the earliest job that is not yet due becomes due, or the earliest that a
        fair queue's bucket held back in this store's last claim of it may start (by this
        node's claims, or with ``remote`` by remote workers'); None if none waits. A
        claimer sleeps until then, never polls for a token."""
        ...

    async def renew(
        self,
        now: float,
        lease_until: float,
        held: Sequence[str],
        progress: Mapping[str, Progress] | None = None,
    ) -> Renewal:
        """Extend the unexpired leases of ``held`` (jobs this node's workers hold), store the
        ``progress`` of those of them it names (fenced like the lease: only where this node
        still holds the job), and record that the node is alive. The answer names the jobs
        among ``held`` whose cancel was asked for: the fallback when a NOTIFY was lost."""
        ...

    async def request_cancel(
        self, job_id: str, now: float, *, forced_until: float | None = None
    ) -> Job | None:
        """Record durably that a cancel of the running job ``job_id`` is asked for, and tell
        the node that holds it (``listen``'s ``cancel``); the job as it now stands (None: no
        such job). A job that is not running is returned as it is, unchanged. Once asked
        for, a cancel holds while the job runs: a transition out of ``running`` to
        ``scheduled`` or ``dead`` becomes ``cancelled`` (the holder may not have heard yet;
        ``sqlq.common.backoff.after_failure`` is the rule, restated in the statement).

        ``forced_until``: a forced cancel. If a remote worker holds the job, its lease is cut
        to that time at the latest and held there (``Job.force_cancel``: ``cancel_forced``,
        which ``extend`` obeys), even if the cancel was asked for before; so it runs out then
        for every node, after any restart, and the rescue ends the attempt. A job a node
        holds is only asked (its node cuts the attempt off: ``cancel_grace_s``)."""
        ...

    async def expired(self, now: float, limit: int) -> list[Job]:
        """Running jobs whose lease ran out before ``now``: a dead or cut-off node's."""
        ...

    async def release(self, now: float) -> int:
        """End this node's leases now (a clean stop), so other nodes rescue its jobs at once."""
        ...

    async def census(self) -> list[QueueCount]:
        """Scheduled and running jobs by queue, on every node."""
        ...

    async def paused_queues(self) -> list[str]: ...

    async def queue_policies(self) -> dict[str, Policy]:
        """Every queue's policy as stored now (another node may have set one)."""
        ...

    async def push_back(self, queue: str, key: str | None, hold_s: float) -> None:
        """``key`` of the fair queue ``queue`` may start nothing for ``hold_s`` from now, on
        the store's clock, by any node's claim (a handler's ``RateLimited``: its bucket
        moves, ``sqlq.common.fair.push_back``)."""
        ...

    async def finished(self, ids: Sequence[str]) -> list[Job]:
        """The jobs among ``ids`` that are finished (completed, dead or cancelled), in one
        statement: how a node's waiters (``GET /jobs/{id}?wait=``) hear of other nodes'."""
        ...

    async def nodes(self, now: float) -> list[dict[str, Any]]:
        """The nodes seen lately, and how many jobs each holds."""
        ...

    def listen(self, wake: Callable[[], None], cancel: Callable[[str], None]) -> None:
        """Call ``wake`` whenever another node submits or requeues work, and ``cancel(job_id)``
        when a cancel of a job this node holds is asked for (hints only: a lost one is
        made up for by ``renew``'s answer)."""
        ...
