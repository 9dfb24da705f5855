"""``Census``: what a shared queue holds on every node, as of the last count.

Shared mode keeps no job in the process, so what ``/stats``, ``/metrics``, the
queue listing and ``--max-queued`` read is counted in the database: jobs by
(state, queue), the paused queues and the nodes, one read every
``CENSUS_EVERY_S`` (and before a queue is shown), plus what this node submitted
since, so a burst of submissions between two counts is still bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from sqlq.common.clock import Clock
from sqlq.common.fair import Policy
from sqlq.common.models import State
from sqlq.common.store import SharedStore
from sqlq.runtime.claims import QueueInfo
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.seen import WorkersSeen, warning


@dataclass(frozen=True, slots=True)
class RemoteQueues:
    """What the listing needs to know of remote queues: which are, the ones named, and
    those a worker was seen for lately (``WorkersSeen.served``)."""

    is_remote: Callable[[str], bool]
    named: frozenset[str]
    served: set[str]
    unclaimed: Callable[[str], list[str]] = lambda queue: []  # ``WorkersSeen.unclaimed``


CENSUS_EVERY_S = 1.0  # how often the queue's counts (and pauses, and nodes) are read again
_SCHEDULED, _RUNNING = State.SCHEDULED.value, State.RUNNING.value


class Census:
    def __init__(self, store: SharedStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self.jobs: dict[tuple[str, str], int] = {}  # (state, queue) -> jobs, on every node
        self.nodes: list[dict[str, Any]] = []
        self.since = 0  # jobs this node submitted since the last count
        self.policies: dict[str, Policy] = {}  # every queue's policy, as of the last count

    async def refresh(self) -> set[str]:
        """Count again; returns the paused queues."""
        counts = await self._store.census()
        self.jobs = {(c.state.value, c.queue): c.jobs for c in counts}
        paused = set(await self._store.paused_queues())
        self.policies = await self._store.queue_policies()
        self.nodes = await self._store.nodes(self._clock.time())
        self.since = 0
        return paused

    def of(self, queue: str) -> tuple[int, int]:
        """(scheduled, running) jobs of ``queue``."""
        return self.jobs.get((_SCHEDULED, queue), 0), self.jobs.get((_RUNNING, queue), 0)

    def info(
        self,
        queue: str,
        caps: Mapping[str, int],
        paused: Collection[str],
        remote: RemoteQueues | None = None,
    ) -> QueueInfo:
        """``queue`` as the listing shows it: its counts, its cap and whether it is paused;
        whether remote workers serve it, and a warning if none was seen for it lately."""
        depth, running = self.of(queue)
        if remote is None or not remote.is_remote(queue):
            return QueueInfo(depth, running, limit=caps.get(queue), paused=queue in paused)
        unclaimed = tuple(remote.unclaimed(queue)) if depth else ()
        return QueueInfo(depth, running, limit=caps.get(queue), paused=queue in paused,
                         remote=True, warning=warning(depth, queue in remote.served, unclaimed),
                         unclaimed=unclaimed)  # fmt: skip

    def view(
        self, caps: Mapping[str, int], paused: Collection[str], remote: RemoteQueues | None = None
    ) -> dict[str, QueueInfo]:
        """Every queue with a cap, a pause or a live job (or remote), by name."""
        names = {*caps, *paused, *self.queues(), *(remote.named if remote is not None else ())}
        return {q: self.info(q, caps, paused, remote) for q in sorted(names)}

    def queues(self) -> set[str]:
        return {queue for _, queue in self.jobs}

    def by_state(self) -> dict[str, int]:
        out = {_SCHEDULED: 0, _RUNNING: 0}
        for (state, _), n in self.jobs.items():
            out[state] = out.get(state, 0) + n
        return out

    def backlog(self) -> int:
        """Live jobs on every node, as of the last count, plus what this node added since."""
        return sum(self.jobs.values()) + self.since


class CensusViews:
    """What a shared queue holds on every node, as the claims show it (a mixin of
    ``SharedClaims``, before ``ClaimsBase``): read from its ``Census``."""

    _census: Census
    _caps: dict[str, int]
    _paused: set[str]
    _policies: dict[str, Policy]
    _config: RuntimeConfig
    _seen: WorkersSeen
    _clock: Clock

    def _remote(self) -> RemoteQueues | None:
        config = self._config
        if not config.every_queue_remote and not config.remote_queues:
            return None
        now, seen = self._clock.time(), self._seen
        return RemoteQueues(config.is_remote, config.remote_queues, seen.served(now),
                            lambda queue: seen.unclaimed(queue, now))  # fmt: skip

    async def _refresh(self) -> None:
        self._paused = await self._census.refresh()
        policies = self._census.policies  # (another node may have set or dropped one)
        for gone in set(self._policies) - set(policies):
            del self._policies[gone]
        self._policies.update(policies)

    async def queues(self) -> dict[str, QueueInfo]:
        await self._refresh()
        return self.queues_now()

    def queues_now(self) -> dict[str, QueueInfo]:
        return self._census.view(self._caps, self._paused, self._remote())

    async def queue(self, name: str) -> QueueInfo:
        await self._refresh()
        return self._census.info(name, self._caps, self._paused, self._remote())

    def backlog(self) -> int:
        return self._census.backlog()

    def census(self) -> dict[tuple[str, str], int]:
        return dict(self._census.jobs)

    def live_queues(self) -> Collection[str]:
        return self._census.queues()

    def live_counts(self) -> dict[str, int]:
        counts: dict[str, int] = super().live_counts()  # type: ignore[misc]  # (ClaimsBase's)
        for state, n in self._census.by_state().items():
            counts[state] += n
        return counts
