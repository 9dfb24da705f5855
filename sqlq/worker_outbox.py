"""The outcomes a remote worker owes the server, delivered in batches until answered.

Every decided outcome waits here until the server answers it: accepted (its new state),
``fenced`` (stale: dropped, with a warning) or refused. One ``/claims/outcomes`` call at
a time carries everything decided so far (at most ``MAX_ITEMS`` items and
``BATCH_BYTES`` of body), so outcomes that finish while a call is out ride the next
one. A call that fails (the server unreachable, a 5xx, a 429) changes nothing: the
same items go again after a backoff (``Backoff``: exponential, jittered, capped), for
as long as it takes. So a finished attempt's outcome survives a server restart, as
long as the lease it holds does (the worker keeps renewing it meanwhile).

Progress reported since the last heartbeat goes first, in a heartbeat of those items,
so an outcome never lands before the attempt's latest progress (the server writes it
with the outcome in process); a checkpoint being written goes first too.

A claim going out while outcomes wait may carry them instead (``carry``, then
``settle``): a busy worker then reports each round on the call that takes the next.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import msgspec

from sqlq.calls import Invalid, RateLimited, Unauthorized, Unavailable
from sqlq.common.clock import Clock, wait_event
from sqlq.common.protocol import FENCED, MAX_ITEMS, UNAVAILABLE, CompleteIn, Outcome, Reported
from sqlq.common.specs import MAX_JOB_BYTES
from sqlq.worker_attempt import Attempt, failure

log = logging.getLogger("sqlq.worker")

MAX_SENDS = 2  # calls out at once: one is being answered while the next is built
BATCH_BYTES = 4 * MAX_JOB_BYTES  # a batch's body (the server takes 16 MiB); one past it goes alone
RETRYABLE = (Unavailable, RateLimited, Unauthorized)  # may pass: a restart, a token file fixed


@dataclass(frozen=True, slots=True)
class Backoff:
    """How long to wait after the ``n``th failure in a row (from 1): ``base_s * 2^(n-1)``,
    capped at ``cap_s``, then between half and all of it at random, so workers that lost
    the server together do not all come back in the same instant."""

    base_s: float = 0.1
    cap_s: float = 10.0

    def delay(self, n: int, rng: random.Random) -> float:
        d = min(self.cap_s, self.base_s * 2.0 ** max(0, n - 1))
        return d * (0.5 + 0.5 * rng.random())


class Reporting(Protocol):
    async def outcomes(self, items: Sequence[Outcome | msgspec.Raw]) -> list[Reported]: ...


class Outbox:
    def __init__(
        self,
        client: Reporting,
        *,
        clock: Clock,
        rng: random.Random,
        backoff: Backoff,
        answered: Callable[[Attempt, Reported | None], None],
        before: Callable[[list[Attempt]], Awaitable[None]],
        linger_s: float = 0.0,
        counts: dict[str, int] | None = None,
    ) -> None:
        self._linger = linger_s  # a lone outcome waits this long for others to share its call
        self._client = client
        self._clock = clock
        self._rng = rng
        self._backoff = backoff
        self._answered = answered  # (attempt, its answer; None: given up on)
        self._before = before  # progress first (a heartbeat of those items)
        self._owed: dict[str, Attempt] = {}  # by token, in the order decided
        self._more = asyncio.Event()
        self._hurry = asyncio.Event()
        self._changed = asyncio.Event()  # an item was answered, or a hurry came
        self.failures = 0  # calls failed in a row
        self.batches = 0
        self.counts = counts if counts is not None else {"outcome_calls": 0}  # its own calls
        self.rounds = 0  # calls made, answered or failed
        self._out: set[str] = set()  # tokens in a call now
        self._resume_at = 0.0  # monotonic: after a failed call, no new one before this

    def __len__(self) -> int:
        return len(self._owed)

    def owed(self) -> list[Attempt]:
        return list(self._owed.values())

    def put(self, attempt: Attempt) -> None:
        self._owed[attempt.token] = attempt
        self._more.set()

    def hurry(self) -> None:
        """Stop waiting out a backoff (the worker is giving up at a second signal)."""
        self._hurry.set()
        self._changed.set()

    async def run(self) -> None:
        """Send what is owed, ``MAX_SENDS`` calls at most at once (a call that fails
        pauses every new one for the backoff)."""
        sending: set[asyncio.Task[None]] = set()
        while True:
            now = self._clock.monotonic()
            if now < self._resume_at and not self._hurry.is_set():
                await wait_event(self._clock, self._hurry, self._resume_at - now)
                continue
            if len(sending) >= MAX_SENDS or len(self._out) >= len(self._owed):
                self._more.clear()
                await self._more.wait()
                continue
            if self._linger > 0 and not sending:  # a lone outcome waits a moment for others
                await wait_event(self._clock, self._hurry, self._linger)
            batch = self._batch()
            if not batch:
                continue
            self._out.update(a.token for a in batch)
            task = asyncio.create_task(self._round(batch))
            sending.add(task)
            task.add_done_callback(sending.discard)

    async def _round(self, batch: list[Attempt]) -> None:
        try:
            await self._send(batch)
        except Exception as exc:  # unreachable, 5xx, 429, 401; or a bug: kept, sent again
            self.failures += 1
            delay = self._backoff.delay(self.failures, self._rng)
            self._resume_at = self._clock.monotonic() + delay
            if isinstance(exc, RETRYABLE):
                log.warning("could not report %d outcomes (%s); again in %.1f s",
                            len(batch), exc, delay)  # fmt: skip
            else:
                log.exception("reporting %d outcomes failed; again in %.1f s", len(batch),
                              delay)  # fmt: skip
        finally:  # (an answered call sets ``failures``: ``_apply``)
            self.rounds += 1
            self._out.difference_update(a.token for a in batch)
            self._more.set()
            self._changed.set()

    def _batch(self) -> list[Attempt]:
        batch: list[Attempt] = []
        size = 0
        for a in self._owed.values():
            if a.token in self._out:
                continue
            if batch and (len(batch) >= MAX_ITEMS or size + len(a.body) > BATCH_BYTES):
                break
            batch.append(a)
            size += len(a.body) + 1
        return batch

    async def _send(self, batch: list[Attempt]) -> None:
        await self._before(batch)
        saving = [a.saving for a in batch if a.saving is not None and not a.saving.done()]
        if saving:
            await asyncio.gather(*saving, return_exceptions=True)
        self.counts["outcome_calls"] += 1  # (the claims that carry outcomes are not its)
        try:
            answers = await self._client.outcomes([msgspec.Raw(a.body) for a in batch])
        except Invalid as exc:  # the body as a whole refused (too large, say): one by one
            if len(batch) > 1:
                for a in batch:
                    await self._send([a])
                return
            self.failures = 0  # (answered, if with a refusal)
            self._refused(batch[0], f"{exc.status} {exc.code}: {exc.message}")
            return
        self._apply(batch, answers)

    def _apply(self, batch: list[Attempt], answers: Sequence[Reported]) -> None:
        """A call's answers: each item answered is done with; one ``unavailable`` (the
        store took others but not it) or with no answer at all (a short list, from a
        server with a bug) stays owed, and goes again after a backoff."""
        self.batches += 1
        again = max(0, len(batch) - len(answers))
        for a, answer in zip(batch, answers, strict=False):
            if answer.error == UNAVAILABLE:
                again += 1
                continue
            if answer.error is not None and answer.error not in (FENCED, "forbidden"):
                self._refused(a, answer.detail or answer.error)
                continue
            self._owed.pop(a.token, None)
            self._answered(a, answer)
        if not again:
            self.failures = 0
        else:
            self.failures += 1
            delay = self._backoff.delay(self.failures, self._rng)
            self._resume_at = self._clock.monotonic() + delay
            log.warning("the server could not write %d outcomes; again in %.1f s", again,
                        delay)  # fmt: skip
        self._changed.set()

    def carry(self) -> list[Attempt]:
        """Outcomes a claim going out now may carry (``Requests.report_and_claim``): those
        owed and in no call, as one batch, less any whose attempt has progress or a
        checkpoint to land first, or that a refused claim carried (those wait for this
        outbox's own call). None while a failed call's backoff runs. They are this
        caller's until it ``settle``s them."""
        if self._clock.monotonic() < self._resume_at:
            return []
        batch = [a for a in self._batch() if a.new_progress() is None and not a.alone
                 and (a.saving is None or a.saving.done())]  # fmt: skip
        self._out.update(a.token for a in batch)
        return batch

    def settle(self, batch: list[Attempt], answers: Sequence[Reported] | None) -> None:
        """The answers to what a claim carried (``carry``), or None if the call failed or
        was given up on: then they go again, in this outbox's next call."""
        self._out.difference_update(a.token for a in batch)
        if answers is not None:
            self._apply(batch, answers)
        self._more.set()
        self._changed.set()

    def _refused(self, a: Attempt, why: str) -> None:
        """The server refused this outcome as a value: a result it cannot take fails the
        attempt instead (as in process); anything else is a bug of this worker's, logged
        and given up on."""
        if isinstance(a.what, CompleteIn):
            a.decide(failure(f"the server refused the result: {why}"))
            log.warning("job %s: the server refused its result (%s): reporting a failure",
                        a.job.id, why)  # fmt: skip
            return
        log.error("job %s: the server refused its outcome (%s); given up", a.job.id, why)
        self._owed.pop(a.token, None)
        self._answered(a, None)
        self._changed.set()

    async def drained(self, within: float) -> bool:
        """Wait until nothing is owed, ``within`` seconds at most; after a hurry, only
        until one more call has been tried (no backoff waited out). True if drained."""
        deadline = self._clock.monotonic() + within
        first = self.rounds
        while self._owed:
            left = deadline - self._clock.monotonic()
            if left <= 0 or (self._hurry.is_set() and self.rounds > first):
                return False
            self._changed.clear()
            await wait_event(self._clock, self._changed, left)
        return True
