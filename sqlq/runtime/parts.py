"""What the claims share with the service they serve, made once by the composition root."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from sqlq.common.clock import Clock
from sqlq.common.store import JobStore
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.events import Events
from sqlq.runtime.live import LiveJobs
from sqlq.runtime.metrics import Metrics
from sqlq.runtime.seen import WorkersSeen


@dataclass(frozen=True, slots=True, kw_only=True)
class Parts:
    """What the claims share with the service they serve: one live view, one events
    sink (``live.events``, which the metrics read too), one clock, one random source; the
    remote workers seen and what their calls counted (``sqlq.runtime.remote``)."""

    store: JobStore
    config: RuntimeConfig
    clock: Clock
    rng: random.Random
    live: LiveJobs
    metrics: Metrics
    seen: WorkersSeen = field(default_factory=WorkersSeen)  # remote workers heard of
    remote_counts: Counter[str] = field(default_factory=Counter)  # ``remote.COUNTED``

    @classmethod
    def of(
        cls, store: JobStore, config: RuntimeConfig, *, clock: Clock, rng: random.Random
    ) -> Parts:
        """New parts around ``store``: a live view and metrics over one new events sink."""
        events = Events(limit=2 * config.max_queues)
        return cls(store=store, config=config, clock=clock, rng=rng, live=LiveJobs(events),
                   metrics=Metrics(events))  # fmt: skip
