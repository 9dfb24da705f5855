"""A claim: a job a worker may run, the claim's fate, and what its attempt reported.

Its own module so that the claims (``sqlq.runtime.claims``), what reaches a running
attempt (``sqlq.runtime.reach``) and the handler's context speak of the same thing
without importing each other.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlq.common.fair import Policy
from sqlq.common.models import Job
from sqlq.common.running import Progress


class ClaimResult(StrEnum):
    CLAIMED = "claimed"  # durable: the attempt counts, and so will its outcome
    REFUSED = "refused"  # a guard refused it (a cancel won): the outcome is fenced
    FAILED = "failed"  # the store failed: nothing of this attempt is recorded


@dataclass(slots=True, eq=False)
class Claim:
    """A job a worker may run: its running version, and the claim's fate; and what its
    attempt reported while it ran (``sqlq.runtime.reach``: only if it reported any)."""

    job: Job  # as running (attempts and started_at updated), and as changed since
    claimed: asyncio.Future[ClaimResult]
    progress: Progress | None = None  # the latest the handler reported (written or not)
    armed: bool = False  # a write of the progress is due
    written_at: float | None = None  # monotonic: the last progress write (or first report)
    over: bool = False  # the outcome is built: nothing more is written for this attempt
    last: asyncio.Task[Any] | None = None  # the latest write of this claim (``Reach._chain``)
    asked: asyncio.Task[Any] | None = None  # the write of its cancel request (``Reach._ask``)
    granted_at: float | None = None  # monotonic: when the claim that leased it was sent (shared)


@dataclass(frozen=True, slots=True)
class QueueInfo:
    depth: int  # jobs waiting (due or delayed)
    running: int
    limit: int | None  # None: no cap beyond the worker pool
    paused: bool
    remote: bool = False  # served by remote workers only (``sqlq.runtime.remote``)
    warning: str | None = None  # remote, jobs waiting, and no worker seen for it lately
    # remote: kinds sent to it lately that no claim took since and no worker says it runs
    unclaimed: tuple[str, ...] = ()
    policy: Policy | None = None  # per-key limits and fair claims (``sqlq.common.fair``)
