"""``ctx.parents``: what a workflow member's handler reads of its parents, and the one
place a page of them is made.

Every holder serves the same page (``Holding.parents``): the server's own claims read it
from the store (``page``), a remote worker asks ``POST /claims/parents``, whose answer is
the same ``page`` of the same job, fenced on its claim's token. The worker pool loads the
first page before the handler starts (``Parents``), so a handler with up to
``PAGE_PARENTS`` parents has them all at hand, as a mapping by ref; past that, it reads
the rest a page at a time (``Parents.rest`` in an async handler, ``Parents.pages`` in a
plain one, in a thread or a worker process, which asks the server's loop or its parent
process for each page), so no fan-in of 10,000 results is held whole. A page also stops
short at ``PAGE_BYTES`` of results (never before its first parent), so a page of large
results stays bounded too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence

import msgspec

from sqlq.common.models import Job, State
from sqlq.common.protocol import ParentsPage, ParentView

PAGE_PARENTS = 1000  # parents a page holds at most
PAGE_BYTES = 8 << 20  # ... and results, encoded, past which a page stops (one at least)
PAGE_WAIT_S = 300.0  # a plain handler's wait for a page, at most (``TimeoutError`` past it)

GetMany = Callable[[Sequence[str]], Awaitable[list[Job | None]]]
Loader = Callable[[int], Awaitable[ParentsPage]]  # a page from the ``start``-th parent
Fetch = Callable[[int], ParentsPage]  # the same, waited for (off the event loop)

_encode = msgspec.json.encode


def view(job_id: str, parent: Job | None) -> ParentView:
    """A parent as its child reads it."""
    if parent is None:
        return ParentView(job_id=job_id)
    ref = None if parent.flow is None else parent.flow.ref
    if parent.state is State.COMPLETED:
        return ParentView(job_id=job_id, ref=ref, state=parent.state, result=parent.result)
    return ParentView(job_id=job_id, ref=ref, state=parent.state, error=parent.last_error)


async def page(get_many: GetMany, job: Job, start: int) -> ParentsPage:
    """The page of ``job``'s parents from the ``start``-th (in the order named), read
    through ``get_many`` (the store's)."""
    ids = () if job.flow is None else job.flow.parents
    out: list[ParentView] = []
    size = 0
    at = start
    for parent in await get_many(ids[start : start + PAGE_PARENTS]):
        seen = view(ids[at], parent)
        size += len(_encode(seen.result)) if seen.result is not None else 0
        if out and size > PAGE_BYTES:
            break
        out.append(seen)
        at += 1
    return ParentsPage(parents=out, next=at if at < len(ids) else None, total=len(ids))


class Parents(Mapping[str, ParentView]):
    """A member's parents by ref (a parent without one: by job id), as ``ctx.parents``:
    the first page, loaded before the handler started. ``complete`` says whether that
    is all of them; ``rest`` reads the pages after it (async handlers), ``pages`` too
    (plain ones: ``fetch``, or ``load`` run on ``loop`` from the handler's thread)."""

    __slots__ = ("_by_key", "_fetch", "_load", "_loop", "_next", "first", "total")

    def __init__(
        self,
        first: ParentsPage | None = None,
        load: Loader | None = None,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
        fetch: Fetch | None = None,
    ) -> None:
        self.first = first  # as it came (a worker process is sent it)
        self._by_key = {} if first is None else _keyed(first.parents)
        self._next = None if first is None else first.next
        self._load, self._loop, self._fetch = load, loop, fetch
        self.total = 0 if first is None else first.total

    @property
    def complete(self) -> bool:
        return self._next is None

    def __getitem__(self, key: str) -> ParentView:
        return self._by_key[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_key)

    def __len__(self) -> int:
        return len(self._by_key)

    async def rest(self) -> AsyncIterator[Mapping[str, ParentView]]:
        """Each page after the first, by ref, in the order the parents were named."""
        start = self._next
        while start is not None and self._load is not None:
            got = await self.load(start)
            yield _keyed(got.parents)
            start = got.next

    async def load(self, start: int) -> ParentsPage:
        """The page from the ``start``-th parent, as the holder serves it (``AttemptFenced``
        once the attempt is over)."""
        if self._load is None:
            raise RuntimeError("ctx.parents: no page is read from here")
        return await self._load(start)

    def pages(self) -> Iterator[Mapping[str, ParentView]]:
        """``rest`` for a plain handler: each page after the first, by ref, read as it is
        asked for. It waits for each, so never on the event loop (an async handler
        iterates ``rest``)."""
        start = self._next
        while start is not None:
            got = self._fetched(start)
            yield _keyed(got.parents)
            start = got.next

    def _fetched(self, start: int) -> ParentsPage:
        if self._fetch is not None:
            return self._fetch(start)
        loop = self._loop
        if loop is None or self._load is None:
            raise RuntimeError("ctx.parents: no page is read from here")
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            raise RuntimeError("ctx.parents.pages() waits: an async handler iterates rest()")
        # (bounded: a loop that stopped meanwhile never runs it, and the thread must end)
        return asyncio.run_coroutine_threadsafe(self.load(start), loop).result(PAGE_WAIT_S)


def _keyed(parents: list[ParentView]) -> dict[str, ParentView]:
    return {p.ref or p.job_id: p for p in parents}


NO_PARENTS = Parents()
