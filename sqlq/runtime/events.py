"""``Events``: the one sink every job event goes to, feeding both ``/stats`` and ``/metrics``.

Each event is written once, here, as an ``Event``, and counted once, by
``Events.record``: into ``totals`` (what ``/stats`` reports, since this process
started) and, for the events ``/metrics`` shows, into the per-queue series of
``sqlq_jobs_total{event, kind, queue}`` under the label ``LABEL`` gives it. So the
two views can't disagree on what an event means, nor know of events the other
lacks: an event without a label is one that has no job to label it by, or that
``/metrics`` shows under another name (``requeued``, for the three ways a job is
put back).

"Requeued" means one thing: the runtime took an attempt away from its worker (a
hang, the server stopping, an expired lease) and put the job back, scheduled. An
attempt taken away on the job's last attempt is not requeued: it is dead, and
counted so.

Counting sits on the hot path (every submit, every outcome), so a record is a
plain ``Counter`` increment; the series are turned into metric families only when
Prometheus scrapes. A queue's series stay while fewer than ``limit`` queues have
series (2 x ``--max-queues``), so a queue that empties between jobs keeps its
counters from scrape to scrape. Past the limit, the series of queues with no
live job are dropped, as Prometheus expects of a series whose subject is gone (a
name used again starts from zero, which ``rate`` and ``increase`` read as a
reset). So the number of series is bounded whatever names clients send.

Kinds are bounded too. A kind the server runs (its registry, ``known_kinds``) is its
own label; a remote queue accepts any kind name, so the first ``MAX_OTHER_KINDS``
names the registry lacks keep their own label (a remote worker's few kinds stay
visible) and every later one is counted as ``OTHER_KIND``: a client sending a new
kind name per job adds no series.

Schedules count here too: ticks enqueued and skipped per schedule
(``sqlq_schedule_ticks_{enqueued,skipped}_total{schedule}``), and each enqueued
tick's lateness (tick to durable enqueue) goes to ``on_lateness`` (the metrics'
histogram). Their labels are bounded by ``MAX_SCHEDULES``, and a deleted
schedule's series go with it (``schedule_gone``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterator
from enum import StrEnum

from sqlq.common.models import Job, State


class Event(StrEnum):
    SUBMITTED = "submitted"
    COMPLETED = "completed"  # the terminal events: a job left the live view so
    DEAD = "dead"
    CANCELLED = "cancelled"
    RETRIED = "retried"  # an attempt failed (or was taken away) and the job is due again
    REQUEUED_HUNG = "requeued_hung"  # its worker was declared hung (or timed out)
    REQUEUED_AT_RECOVERY = "requeued_at_recovery"  # it was running when the server stopped
    DEAD_AT_RECOVERY = "dead_at_recovery"  # so, and on its last attempt
    REQUEUED_EXPIRED_LEASE = (
        "requeued_expired_lease"  # a lease ran out: a node's, a remote worker's
    )
    FENCED = "fenced"  # an outcome refused: the attempt no longer held the job
    LEASE_LOST = "lease_lost"  # its holder could not renew in time: cut off, nothing reported
    CLAIM_FAILED = "claim_failed"  # the store failed to write a claim: nothing recorded
    UNENCODABLE = "unencodable"  # a result JSON cannot hold: the attempt failed
    SPAWN_REFUSED = "spawn_refused"  # jobs a handler spawned could not be: the attempt failed
    REFUSED_FULL = "refused_full"  # a submission past --max-queued
    OPERATOR_RETRIED = "operator_retried"  # a dead or cancelled job put back by a client
    COMPACTED = "compactions"  # a periodic compaction (no job)
    TICK_ENQUEUED = "schedule_ticks_enqueued"  # a schedule's tick made its job
    TICK_SKIPPED = "schedule_ticks_skipped"  # passed over: catch-up, overlap, paused
    CANCEL_REQUESTED = "cancel_requested"  # a cancel of a running job was asked for, durably
    CANCELLED_RUNNING = "cancelled_running"  # a running job ended cancelled (a cancel asked for)
    SNOOZED = "snoozed"  # a handler snoozed: due again later, its attempt given back
    REMOTE_CLAIMED = "remote_claimed"  # a remote worker claimed it (``sqlq.runtime.remote``)


# What /metrics calls each event it shows (``sqlq_jobs_total{event=...}``).
LABEL: dict[Event, str] = {
    Event.SUBMITTED: "submitted",
    Event.COMPLETED: "completed",
    Event.DEAD: "dead",
    Event.RETRIED: "retried",
    Event.FENCED: "fenced",
    Event.LEASE_LOST: "lease_lost",
    Event.REQUEUED_HUNG: "requeued",
    Event.REQUEUED_AT_RECOVERY: "requeued",
    Event.REQUEUED_EXPIRED_LEASE: "requeued",
    Event.CANCEL_REQUESTED: "cancel_requested",
    Event.SNOOZED: "snoozed",
    Event.REMOTE_CLAIMED: "remote_claimed",
}
ENDED = {State.COMPLETED: Event.COMPLETED, State.DEAD: Event.DEAD, State.CANCELLED: Event.CANCELLED}


MAX_OTHER_KINDS = 100  # kind names outside the registry that get a label of their own
OTHER_KIND = "other"  # the label of every kind name past those


def _none() -> Collection[str]:
    return ()


def _drop(seconds: float) -> None:
    pass


class Events:
    def __init__(self, limit: int = 2_000) -> None:
        self.totals: Counter[Event] = Counter()  # every event since this process started
        self._series: dict[str, Counter[tuple[str, str]]] = {}  # queue -> (label, kind) -> n
        self.live_queues: Callable[[], Collection[str]] = _none  # set by the service
        self.limit = limit  # queues with series, past which those without live jobs go
        self.ticks: dict[str, list[int]] = {}  # schedule -> [enqueued, skipped]
        self.on_lateness: Callable[[float], None] = _drop  # set by the metrics
        self.known_kinds: Collection[str] | None = None  # the registry (set by the service)
        self._other_kinds: set[str] = set()  # labelled kinds outside it (MAX_OTHER_KINDS)

    def record(self, event: Event, job: Job | None = None, n: int = 1) -> None:
        """``n`` times ``event`` (of ``job``, for the series; ``None``: /stats only)."""
        self.totals[event] += n
        label = LABEL.get(event)
        if label is None or job is None:
            return
        queue = job.queue
        counts = self._series.get(queue)
        if counts is None:
            if len(self._series) >= self.limit:
                self.prune()
                self.limit = max(self.limit, 2 * len(self._series))  # all live: amortised
            counts = self._series[queue] = Counter()
        kind = job.kind
        known = self.known_kinds
        if known is not None and kind not in known:
            kind = self._other(kind)
        counts[label, kind] += n

    def _other(self, kind: str) -> str:
        """The label of a kind outside the registry (a remote queue's): its own name while
        few such names were seen, else ``OTHER_KIND``."""
        others = self._other_kinds
        if kind in others:
            return kind
        if len(others) < MAX_OTHER_KINDS and kind != OTHER_KIND:
            others.add(kind)
            return kind
        return OTHER_KIND

    def schedule_enqueued(self, schedule: str, lateness_s: float) -> None:
        """A tick of ``schedule`` made its job, durably, ``lateness_s`` after the tick."""
        self.totals[Event.TICK_ENQUEUED] += 1
        self.ticks.setdefault(schedule, [0, 0])[0] += 1
        self.on_lateness(max(0.0, lateness_s))

    def schedule_skipped(self, schedule: str, n: int) -> None:
        """``n`` due ticks of ``schedule`` were passed over without a job."""
        if n > 0:
            self.totals[Event.TICK_SKIPPED] += n
            self.ticks.setdefault(schedule, [0, 0])[1] += n

    def schedule_gone(self, schedule: str) -> None:
        """``schedule`` was deleted: its series go, as a gone queue's do."""
        self.ticks.pop(schedule, None)

    def prune(self) -> None:
        """Drop the series of queues with no live job."""
        live = self.live_queues()
        for queue in [q for q in self._series if q not in live]:
            del self._series[queue]

    def queues(self) -> Collection[str]:
        """The queues that have series now (bounded, see the module's docstring)."""
        return self._series.keys()

    def series(self) -> Iterator[tuple[str, str, str, int]]:
        """(label, kind, queue, n) of every series, in order."""
        for queue in sorted(self._series):
            for (label, kind), n in sorted(self._series[queue].items()):
                yield label, kind, queue, n
