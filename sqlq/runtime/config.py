"""The runtime's settings, one default each, and the states it goes through."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from sqlq.common.backoff import RetryPolicy
from sqlq.common.fair import Policy
from sqlq.common.models import DEFAULT_MAX_ATTEMPTS
from sqlq.common.running import DEFAULT_MAX_SNOOZES

DEFAULT_GRACE_S = 10.0  # seconds running jobs get to finish at a stop (--grace)


class RuntimeState(StrEnum):
    NEW = "new"  # built, not started
    RECOVERING = "recovering"  # the store is replaying; no request is served yet
    READY = "ready"  # accepting work
    STOPPING = "stopping"  # refusing new work; running jobs get their grace period
    STOPPED = "stopped"  # the store is closed


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    workers: int = 16  # in-process worker tasks; 0 starts none (and, unless told, all is remote)
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    hb_timeout_s: float = 0.200  # the built-in kinds' heartbeat timeout (they beat every 10 ms)
    healthcheck: bool = True
    seed: int | None = None  # retry jitter and fault injection; None: from the OS
    cpu_processes: int | None = None  # the cpu kind's process pool; None: one per core
    cpu_beat_while_queued: bool = True
    compact_every_s: float = 300.0  # prune past retention and compact; 0 turns it off
    fault_injection: bool = False  # accept sleep's fail_prob / hang_prob (tests, benchmarks)
    max_queued: int = 1_000_000  # live jobs; a submission past it is refused (429)
    max_queues: int = 1_000  # queue names with live jobs or a schedule; past it a 422
    principals: int = 1  # those that may submit, who share --max-queues (``runtime.names``)
    max_abandoned: int = 100  # cut-off handlers still running; past it, /readyz is 503
    handler_threads: int | None = None  # the sync handlers' pool; None: one per worker
    # Plain (sync) handlers in this many worker processes instead of threads (0: threads),
    # each of which imports ``imports`` (``sqlq serve --processes N --import M``).
    processes: int = 0
    imports: tuple[str, ...] = ()
    queue_caps: dict[str, int] = field(default_factory=dict)  # queue -> jobs running at once
    queue_policies: dict[str, Policy] = field(default_factory=dict)  # --queue-policy
    # A running job: a forced cancel cuts its attempt off this long after the request
    # (--cancel-grace); snoozes past --max-snoozes dead-letter it; its progress is written
    # at most once per progress_every_s (and always with the outcome).
    cancel_grace_s: float = 10.0
    max_snoozes: int = DEFAULT_MAX_SNOOZES
    progress_every_s: float = 1.0
    # Shared mode (a shared store): how long a claim lasts unrenewed, the claimer's
    # backstop poll, and whether to LISTEN for other nodes' submissions at all.
    lease_s: float = 5.0
    poll_s: float = 1.0
    listen: bool = True
    # Remote workers (``sqlq.runtime.remote``): the queues only they serve (--remote-queue),
    # or every queue (``all_remote``; None: when ``workers`` is 0, as ``--workers 0`` says).
    # In-process workers never take a remote queue's job.
    remote_queues: frozenset[str] = frozenset()
    all_remote: bool | None = None

    @property
    def every_queue_remote(self) -> bool:
        """Whether every queue is served remotely (``all_remote``, or no worker here)."""
        return self.workers == 0 if self.all_remote is None else self.all_remote

    def is_remote(self, queue: str) -> bool:
        """Whether remote workers serve ``queue`` (and in-process ones never do)."""
        return self.remote_test()(queue)

    def remote_test(self) -> Callable[[str], bool]:
        """``is_remote`` as one callable, the rule's one home: the hot paths that ask it (a
        submit, a job due again) keep it, and pay a C call (``frozenset.__contains__``), as
        cheap as the test written inline; with every queue remote no worker runs here."""
        if self.every_queue_remote:
            return _every_queue
        return self.remote_queues.__contains__


def _every_queue(_: str) -> bool:
    return True
