"""The threads plain (sync) handlers run in, and the count of the abandoned ones."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class HandlerThreads:
    """The thread pool plain (sync) handlers run in, sized for the worker pool.

    asyncio's default executor has ``min(32, cores + 4)`` threads: six here, so
    sixteen workers running sync handlers would queue behind six threads and be
    judged hung while they waited. A thread cannot be cancelled: when its
    attempt is cut off, it is *abandoned* (counted in ``abandoned`` until it
    returns; its result is dropped).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._executor = ThreadPoolExecutor(size, thread_name_prefix="sqlq-handler")
        self.abandoned = 0
        self.abandoned_total = 0

    async def run(self, fn: Callable[[], Any]) -> Any:
        # Through the loop's own run_in_executor, so a loop that watches its executor
        # work (the fake clock's autojump loop) sees a handler running in a thread.
        loop = asyncio.get_running_loop()
        call = _Call(
            fn, lambda: _call_soon(loop, self._late), lambda: _call_soon(loop, self._returned)
        )
        try:
            return await loop.run_in_executor(self._executor, call)
        except asyncio.CancelledError:
            if call.abandon():  # running: it goes on without us, and says when it returns
                self.abandoned += 1
                self.abandoned_total += 1
            raise

    def _late(self) -> None:
        """A call cut off while it waited for a thread got one after all: count it now."""
        self.abandoned += 1
        self.abandoned_total += 1

    def _returned(self) -> None:
        self.abandoned -= 1

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class _Call:
    """A handler's call in a thread that knows, under a lock, whether it is running, so an
    attempt cut off mid-call is counted abandoned until the call returns (and one cut off
    while it waited for a thread, from when it gets one)."""

    __slots__ = ("_abandoned", "_done", "_fn", "_late", "_lock", "_returned", "_running")

    def __init__(
        self, fn: Callable[[], Any], late: Callable[[], None], returned: Callable[[], None]
    ) -> None:
        self._fn, self._late, self._returned = fn, late, returned
        self._lock = threading.Lock()
        self._running = self._done = False
        self._abandoned = False  # cut off before it returned: its return is to be reported

    def __call__(self) -> Any:
        with self._lock:
            self._running = True
            late = self._abandoned
        if late:
            self._late()
        try:
            return self._fn()
        finally:
            with self._lock:
                self._running, self._done = False, True
                report = self._abandoned
            if report:
                self._returned()

    def abandon(self) -> bool:
        """Cut off: True if running now (``late`` is called if it starts later)."""
        with self._lock:
            if self._done:
                return False
            self._abandoned = True
            return self._running


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[[], None]) -> None:
    try:
        loop.call_soon_threadsafe(fn)
    except RuntimeError:  # the loop is closed: the server is gone, nobody counts
        pass
