"""``WorkersSeen``: the remote workers this process has heard from, bounded.

A worker is remembered by the name it gives (``ClaimRequest.worker``, stored in its
claims' holder), with the principal it came as, when it was last heard of (any
claim, heartbeat or outcome), the jobs it holds, and the queues it claimed from
lately. At most ``MAX_WORKERS_SEEN`` workers are kept (the one heard of longest ago
is forgotten first, its count of jobs held with it), each with at most
``MAX_CLAIM_QUEUES`` queues, and at most ``MAX_QUEUES_SEEN`` queues remember when a
worker last claimed from them: whatever names clients send, the memory is bounded.
``GET /workers`` shows it; ``GET /queues`` warns of a remote queue with jobs waiting
that no worker claimed from in the last ``WORKER_SEEN_S``.

A name belongs to the principal first seen with it: a claim under it by another
principal's token is refused (``WorkerNameTaken``, a 409 naming ``worker``), so one
token's worker cannot take over another's entry, its jobs held and its queues (a
name is also the stored holder of its claims, ``worker:<name>``). A heartbeat or an
outcome under another principal (a token is a job's capability, whoever bears it)
leaves the entry as it is. The name is held while it is remembered: forgotten (after
``MAX_WORKERS_SEEN`` others were heard of since, or a restart), it is free again, and in
shared mode each node remembers the names it heard.

Jobs held are counted only where this process writes every end of a remote job (local
mode: its claims less its outcomes, expiries and cancels; ``counts_held``). In shared
mode a job claimed through one node may end through another, which this node never
hears of, so each worker shows ``held`` 0 rather than a count that only grows (the
database knows: each running job's record names its holder).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlq.common import protocol
from sqlq.common.errors import WorkerNameTaken
from sqlq.common.protocol import (
    MAX_CLAIM_QUEUES,
    MAX_WORKERS_SEEN,
    WORKER_SEEN_S,
    WorkerList,
    WorkerView,
)
from sqlq.common.roles import Principal

MAX_QUEUES_SEEN = 10_000  # queues that remember their latest claim
MAX_KINDS_WAITING = 10_000  # (queue, kind) pairs sent with no claim of them since
MAX_KINDS_PER_QUEUE = 100  # of them, in one queue
MAX_KINDS_SHOWN = 10  # named in one warning


@dataclass(slots=True)
class _Worker:
    principal: str
    role: str
    last_seen: float
    queues: OrderedDict[str, None] = field(default_factory=OrderedDict)
    kinds: tuple[str, ...] | None = None  # what its latest claim named (None: any kind)


class WorkersSeen:
    def __init__(self, limit: int = MAX_WORKERS_SEEN) -> None:
        self.limit = limit
        self._workers: OrderedDict[str, _Worker] = OrderedDict()  # least recently seen first
        self.held: Counter[str] = Counter()  # worker -> jobs it holds (``counts_held``)
        self.counts_held = True  # False in shared mode: another node may end a job
        self._claimed_from: OrderedDict[str, float] = OrderedDict()  # queue -> latest claim
        # Remote queue -> kind -> since when a job of it was sent there with no claim of
        # that kind since (``waiting_kind``): at most ``MAX_KINDS_WAITING`` in all.
        self._unclaimed: dict[str, dict[str, float]] = {}
        self._unclaimed_count = 0

    def saw(self, worker: str, who: Principal, now: float, queues: Sequence[str] = ()) -> None:
        """``worker`` was heard of at ``now`` (a claim names the ``queues`` it asked for);
        ``WorkerNameTaken`` if the name is another principal's (the module's docstring)."""
        self.check(worker, who)
        w = self._workers.get(worker)
        if w is None:
            w = self._workers[worker] = _Worker(who.name, who.role.value, now)
            if len(self._workers) > self.limit:
                gone, _ = self._workers.popitem(last=False)
                self.held.pop(gone, None)
        else:
            w.role, w.last_seen = who.role.value, max(w.last_seen, now)
            self._workers.move_to_end(worker)
        for queue in queues:
            w.queues[queue] = None
            w.queues.move_to_end(queue)
            if len(w.queues) > MAX_CLAIM_QUEUES:
                w.queues.popitem(last=False)
            self._claimed_from[queue] = now
            self._claimed_from.move_to_end(queue)
        while len(self._claimed_from) > MAX_QUEUES_SEEN:
            self._claimed_from.popitem(last=False)

    def runs(self, worker: str, kinds: Sequence[str] | None) -> None:
        """``worker``'s claim named the ``kinds`` it runs (None: any)."""
        w = self._workers.get(worker)
        if w is not None:
            w.kinds = None if kinds is None else tuple(kinds)

    def waiting_kind(self, queue: str, kind: str, now: float) -> None:
        """A job of ``kind`` was sent to the remote ``queue`` at ``now``. Bounded: at most
        ``MAX_KINDS_PER_QUEUE`` a queue and ``MAX_KINDS_WAITING`` in all, the oldest
        forgotten first (a flag is a hint; a flood of made-up kinds in one queue can push
        out only that queue's own)."""
        kinds = self._unclaimed.get(queue)
        if kinds is None:
            kinds = self._unclaimed[queue] = {}
        elif kind in kinds:
            return
        if len(kinds) >= MAX_KINDS_PER_QUEUE:
            del kinds[next(iter(kinds))]
            self._unclaimed_count -= 1
        kinds[kind] = now
        self._unclaimed_count += 1
        while self._unclaimed_count > MAX_KINDS_WAITING:
            oldest_queue = next(iter(self._unclaimed))
            oldest = self._unclaimed[oldest_queue]
            del oldest[next(iter(oldest))]
            self._unclaimed_count -= 1
            if not oldest:
                del self._unclaimed[oldest_queue]

    def claimed_kind(self, queue: str, kind: str) -> None:
        """A job of ``kind`` in ``queue`` was claimed: some worker runs that kind."""
        kinds = self._unclaimed.get(queue)
        if kinds is not None and kinds.pop(kind, None) is not None:
            self._unclaimed_count -= 1
            if not kinds:
                del self._unclaimed[queue]

    def unclaimed(self, queue: str, now: float) -> list[str]:
        """Kinds sent to ``queue`` more than ``WORKER_SEEN_S`` ago with no claim of them
        since, that no worker heard of lately says it runs: a misspelled kind, or a task
        no worker imports. Its jobs wait for ever, so ``GET /queues`` says so."""
        kinds = self._unclaimed.get(queue)
        if not kinds:
            return []
        since = now - WORKER_SEEN_S
        runs: set[str] = set()
        for w in reversed(self._workers.values()):  # most recent first
            if w.last_seen < since:
                break
            if queue in w.queues:
                if w.kinds is None:
                    return []  # a worker that runs any kind serves this queue
                runs.update(w.kinds)
        return sorted(k for k, at in kinds.items() if at <= since and k not in runs)

    def check(self, worker: str, who: Principal) -> None:
        """``WorkerNameTaken`` if ``worker`` is a name another principal's worker goes by."""
        w = self._workers.get(worker)
        if w is not None and w.principal != who.name:
            raise WorkerNameTaken(worker)

    def saw_holder(self, holder: str | None, who: Principal, now: float) -> None:
        """The worker behind ``holder`` (a remote claim's) was heard of: a heartbeat or an
        outcome, which name no worker but their token's job's holder."""
        worker = protocol.remote_worker(holder)
        if worker is None:
            return
        w = self._workers.get(worker)
        if w is None or w.principal == who.name:  # (another's report leaves the entry be)
            self.saw(worker, who, now)

    def took(self, worker: str, n: int) -> None:
        """``worker`` holds ``n`` more jobs."""
        if n and self.counts_held:
            self.held[worker] += n

    def let_go(self, worker: str | None) -> None:
        """A job ``worker`` held left it (an outcome, an expiry, or moved on elsewhere)."""
        if worker is None:
            return
        n = self.held.pop(worker, 0)
        if n > 1:
            self.held[worker] = n - 1

    def view(self) -> WorkerList:
        """Every worker remembered, most recently seen first."""
        return WorkerList(
            workers=[
                WorkerView(
                    name=name,
                    principal=w.principal,
                    role=w.role,
                    last_seen=w.last_seen,
                    held=self.held.get(name, 0),
                    queues=sorted(w.queues),
                    kinds=None if w.kinds is None else sorted(w.kinds),
                )
                for name, w in reversed(self._workers.items())
            ]
        )

    def active(self, now: float) -> int:
        """Workers heard of within ``WORKER_SEEN_S`` of ``now``."""
        since = now - WORKER_SEEN_S
        n = 0
        for w in reversed(self._workers.values()):  # most recent first: stop at the first old one
            if w.last_seen < since:
                break
            n += 1
        return n

    def __len__(self) -> int:
        return len(self._workers)

    def served(self, now: float) -> set[str]:
        """The queues some worker claimed from, or that a worker heard of within
        ``WORKER_SEEN_S`` claimed from lately (one busy with long jobs claims seldom)."""
        since = now - WORKER_SEEN_S
        out: set[str] = set()
        for queue, at in reversed(self._claimed_from.items()):
            if at < since:
                break
            out.add(queue)
        for w in reversed(self._workers.values()):
            if w.last_seen < since:
                break
            out.update(w.queues)
        return out


def warning(waiting: int, served: bool, unclaimed: Sequence[str] = ()) -> str | None:
    """What ``GET /queues`` says of a remote queue with ``waiting`` jobs, if anything: no
    worker for it lately, or kinds that none of its workers runs."""
    if waiting <= 0:
        return None
    if not served:
        return f"{waiting} jobs waiting and no worker seen for this queue in the last " + (
            f"{WORKER_SEEN_S:.0f} s"
        )
    if unclaimed:
        shown = ", ".join(unclaimed[:MAX_KINDS_SHOWN])
        more = (
            f" and {len(unclaimed) - MAX_KINDS_SHOWN} more"
            if len(unclaimed) > MAX_KINDS_SHOWN
            else ""
        )
        return (f"jobs of kinds no worker has claimed in the last {WORKER_SEEN_S:.0f} s: "
                f"{shown}{more} (is the kind misspelled, or its task not imported?)")  # fmt: skip
    return None
