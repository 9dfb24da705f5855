"""The model of ``tests/model_machine.py``: what its clients were told, job by job.

An ``Expected`` is one acknowledged job as the model knows it; its ``move`` must
be a transition ``TRANSITIONS`` allows. Here too: the bounds of one example, the
one kind the machine plays, the strategy that draws submissions, and emptying
the PostgreSQL database between examples.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from sqlq.common.backoff import RetryPolicy
from sqlq.common.models import TERMINAL, TRANSITIONS, State
from sqlq.common.specs import JobSpec
from sqlq.runtime.kinds import JobContext, Kind, Registry

LIVE = frozenset(State) - TERMINAL

KIND = "modelled"  # the one kind: the machine decides every outcome, nothing runs it
QUEUES = ("default", "mail", "video")
KEYS = ("k1", "k2", "k3", "k4")
MAX_JOBS = 40  # acknowledged jobs in one example, so that a run stays quick
MAX_STARTS = 4  # restarts and crashes in one example: each start costs an engine's recovery
RETENTION_S = 1e9  # nothing is pruned while the model holds it
LEASE_S = 1000.0  # shared mode: longer than any advance, so a lease runs out only on a crash
DEFAULT_ATTEMPTS = 2
RETRY = RetryPolicy(base_s=0.01, cap_s=1.0, jitter=0.5)
CLAIM_WITHIN_S = 10.0  # a due job is claimed at once; this only bounds a hang
OUTCOMES = ("complete", "fail", "hang", "unencodable")
# Checks to waive while exploring past a known bug (``SQLQ_MODEL_WAIVE=lanes``): "lanes" is
# queue depth and the lanes' contents (issue 19, item 11). Empty unless set by hand: the
# suite asserts everything.
WAIVE = frozenset(filter(None, os.environ.get("SQLQ_MODEL_WAIVE", "").split(",")))


async def _never(args: Any, ctx: JobContext) -> Any:
    raise AssertionError("the model test plays the workers; nothing runs a job")


def registry() -> Registry:
    kinds = Registry()
    kinds.register(Kind(KIND, lambda a: a, _never))
    return kinds


@dataclass
class Expected:
    """One acknowledged job as the model knows it."""

    id: str
    queue: str
    priority: int
    max_attempts: int
    key: str | None
    request_hash: str
    state: State = State.SCHEDULED
    epoch: int = 0
    attempts: int = 0
    attempts_total: int = 0
    ready_at: float = 0.0
    cancel_asked: bool = False  # a cancel was asked for while it ran: a failure cancels it
    history: list[State] = field(default_factory=lambda: [State.SCHEDULED])

    def move(self, state: State) -> None:
        """The model's own transition: it must be one ``TRANSITIONS`` allows."""
        assert state in TRANSITIONS[self.state], (
            f"{self.id}: the model moved {self.state.value} -> {state.value}"
        )
        self.state = state
        self.history.append(state)


specs = st.builds(
    lambda queue, priority, delay_ms, attempts, key, n: JobSpec(
        kind=KIND,
        args={"n": n},
        queue=queue,
        priority=priority,
        delay_ms=delay_ms,
        max_attempts=attempts,
        idempotency_key=key,
    ),
    queue=st.sampled_from(QUEUES),
    priority=st.sampled_from((0, 0, 5, -1)),
    delay_ms=st.sampled_from((None, None, 0, 500, 60_000)),
    attempts=st.sampled_from((None, 1, 1, 2, 3)),  # 1 often: a restart lands on a last attempt
    key=st.one_of(st.none(), st.none(), st.sampled_from(KEYS)),
    n=st.integers(0, 2),
)


async def _empty(dsn: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("TRUNCATE jobs, queues, nodes")
    finally:
        await conn.close()
