"""``Waiters``: the requests that wait for a job to finish (``GET /jobs/{id}?wait=``).

Woken by this process's own outcomes (``finished``, which the live view calls
for every job that ends). Where a job may finish in another process (shared
mode: the claims say so with a ``finish_poll_s``), one poll per process, every
``finish_poll_s`` while anyone waits, asks the claims which of every job waited
on here are finished, in one look; not one look per waiting request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from sqlq.common.clock import Clock
from sqlq.common.errors import StoreError
from sqlq.common.models import Job
from sqlq.common.wire import MAX_WAIT_S
from sqlq.runtime.claims import Claims

log = logging.getLogger(__name__)


class Waiters:
    def __init__(
        self, claims: Claims, get: Callable[[str], Awaitable[Job | None]], clock: Clock
    ) -> None:
        self._claims = claims
        self._get = get
        self._clock = clock
        self._waiting: dict[str, list[asyncio.Future[Job | None]]] = {}  # by job id
        self._poll: asyncio.Task[None] | None = None

    def waited_on(self) -> set[str]:
        """The ids of the jobs somebody waits on now."""
        return set(self._waiting)

    async def wait(self, job_id: str, timeout_s: float) -> Job | None:
        """The job once it is finished, or as it stands after ``timeout_s`` (at most
        ``MAX_WAIT_S``)."""
        if timeout_s <= 0:
            return await self._get(job_id)
        waiter: asyncio.Future[Job | None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(job_id, []).append(waiter)  # before the look: no wake lost
        timer = self._clock.call_later(min(timeout_s, MAX_WAIT_S), lambda: _expire(waiter))
        try:
            job = await self._get(job_id)
            if job is None or job.terminal:
                return job
            every = self._claims.finish_poll_s
            if every is not None and (self._poll is None or self._poll.done()):
                self._poll = asyncio.create_task(self._polling(every), name="sqlq-wait-poll")
            found = await waiter
            if found is not None:
                return found
        finally:
            timer.cancel()
            waiting = self._waiting.get(job_id)
            if waiting is not None and waiter in waiting:
                waiting.remove(waiter)
                if not waiting:
                    del self._waiting[job_id]
        return await self._get(job_id)

    async def _polling(self, every: float) -> None:
        while self._waiting:
            await self._clock.sleep(every)
            try:
                finished = await self._claims.finished(list(self._waiting))
            except StoreError as exc:
                log.warning("could not look at the jobs waited on: %s", exc)
                continue
            except Exception:  # a bug must not leave every waiter to its timeout
                log.exception("the poll for waited-on jobs failed; it goes on")
                continue
            for job in finished:
                self.finished(job)

    def finished(self, job: Job) -> None:
        for waiter in self._waiting.pop(job.id, ()):
            if not waiter.done():
                waiter.set_result(job)

    def stop(self) -> None:
        if self._poll is not None:
            self._poll.cancel()


def _expire(waiter: asyncio.Future[Job | None]) -> None:
    if not waiter.done():
        waiter.set_result(None)  # (the job is looked up again as it stands)
