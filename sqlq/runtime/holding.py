"""``Holding``: what a worker pool asks of the claims it runs attempts for.

Its own module, apart from the server's ``Claims`` and what they import (the store, the
metrics), so that a remote worker, which holds its claims over HTTP, loads only this.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from sqlq.common.backoff import Failure
from sqlq.common.models import JSON
from sqlq.common.protocol import ParentsPage
from sqlq.runtime.claim import Claim


class Holding(Protocol):
    """What a worker pool asks of the claims it runs attempts for: the next claim, every
    way an attempt ends, the lease it holds, and the channel its context writes through.
    The server's ``Claims`` (``sqlq.runtime.claims``) is one; a remote worker's
    ``sqlq.worker_claims.RemoteClaims``, the same verbs over HTTP, is the other: so one
    pool (``sqlq.runtime.workers``) runs every attempt, wherever its job is held."""

    async def next(self) -> Claim:
        """The next due job, claimed for the caller; waits until there is one."""
        ...

    def completed(self, claim: Claim, result: JSON, spawn: Sequence[JSON] | None = None) -> None:
        """The attempt completed with ``result``; ``spawn``: with the jobs its handler
        spawned (``sqlq.runtime.spawn``), stored in its completion's commit."""
        ...

    def failed(self, claim: Claim, failure: Failure) -> None:
        """The attempt failed: retry with backoff (the task's, or the holder's), or
        dead-letter; its traceback goes with its error."""
        ...

    def hung(self, claim: Claim, failure: Failure) -> None:
        """The attempt was cut off (silent or past its timeout): like a failure, by the
        task's rules too (a ``CutOff``, a ``TimeoutError``, is what it raised)."""
        ...

    def snoozed(self, claim: Claim, delay_s: float) -> None:
        """The handler snoozed: due again after ``delay_s``, its attempt not counted."""
        ...

    def rate_limited(self, claim: Claim, after_s: float) -> None:
        """The handler raised ``RateLimited`` (its snooze follows): where a per-key rate is
        kept, the key's bucket moves on ``after_s``; elsewhere nothing."""
        ...

    def given_back(self, claim: Claim) -> None:
        """The claim never started (a cancel was asked for first, or its holder stops): due
        again in its place in line, or cancelled if a cancel was asked for; no attempt is
        counted and no error added (``backoff.released``)."""
        ...

    @property
    def leased(self) -> bool:
        """Whether this holder's attempts run under leases it may lose (``expires``)."""
        ...

    @property
    def lease_s(self) -> float | None:
        """How long this holder's leases last (None: it has none to lose)."""
        ...

    def expires(self, claim: Claim) -> float | None:
        """When (monotonic) this holder stops holding ``claim``'s job unless it renews its
        lease first (``sqlq.common.lease``); None: never, the queue is this process's."""
        ...

    def lost(self, claim: Claim) -> None:
        """The holder's lease on ``claim`` ran out unrenewed: the attempt is over here and
        reports nothing (the job is whoever rescues it's)."""
        ...

    async def parents(self, claim: Claim, start: int) -> ParentsPage:
        """A page of ``claim``'s job's parents from the ``start``-th (``ctx.parents``):
        every holder serves the same ``sqlq.runtime.parents.page``. ``AttemptFenced`` if
        the claim no longer holds."""
        ...

    # What an attempt's context writes through (``sqlq.runtime.context.Channel``).
    def progressed(self, claim: Claim) -> None: ...

    def save(self, claim: Claim, data: JSON) -> asyncio.Future[None]: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None: ...
