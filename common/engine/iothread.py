"""``IoThread``: an engine's one I/O thread, and the event loop's way onto it.

Every blocking call of an engine (a write and its fdatasync, opening its files) runs here,
in the order it was asked for, so the event loop never blocks on one. A commit crosses to
this thread and back once per batch, so the crossing is on every durable commit's path:
``run_in_executor`` on a ``ThreadPoolExecutor`` took ~71 us of CPU a round trip on this
machine (a ``concurrent.futures.Future`` with its condition, a semaphore, ``wrap_future``'s
callbacks on both sides), this ~42 us (a ``SimpleQueue`` and one ``call_soon_threadsafe``),
most of that the two wake-ups' system calls. aiosqlite's connection thread is made the
same way.

The thread is a daemon: a store that is never closed must not hold the interpreter's exit.
A call cut short by that exit was never answered, so nothing it wrote was acknowledged,
and recovery reads a torn tail as walq reads any kill -9's. The thread holds only the
queue, never the ``IoThread``: one dropped unclosed is collected, and its finalizer ends
the thread after the calls already asked for.

The autojump test loop (``sqlq.common.clock``) holds its clock still while a call is on
this thread, as it does for its executor's work: a commit in flight never sees a lease or
a timeout expire under it.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from sqlq.common.clock import AutojumpLoop

T = TypeVar("T")

Call = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


class IoThread:
    """One thread, started at the first call; ``run`` is a future the loop awaits."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._calls: queue.SimpleQueue[Call | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stopped = False

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` on the thread, after every call asked for before it. It runs even if
        the awaiting task is cancelled meanwhile (a write asked for is never skipped, and
        never reordered behind a later one); its result is then dropped."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._stopped:
            future.set_exception(RuntimeError(f"{self._name} is shut down"))
            return future
        if self._thread is None:
            self._start()
        if type(loop) is AutojumpLoop:
            loop.hold(future)
        self._calls.put((loop, future, fn, args))
        return future

    def shutdown(self) -> None:
        """Run what was asked for, then stop the thread and wait for it."""
        with self._lock:
            self._stopped = True
            thread = self._thread
        if thread is not None:
            self._calls.put(None)
            thread.join()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                calls = self._calls
                self._thread = threading.Thread(
                    target=_work, args=(calls,), name=self._name, daemon=True
                )
                self._thread.start()
                weakref.finalize(self, calls.put, None)


def _work(calls: queue.SimpleQueue[Call | None]) -> None:
    """The thread's loop: it sees the queue alone, so it keeps no ``IoThread`` alive."""
    while (call := calls.get()) is not None:
        loop, future, fn, args = call
        try:
            result, error = fn(*args), None
        except BaseException as exc:  # (the awaiting task gets it, as an executor's would)
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(_settle, future, result, error)
        except RuntimeError:  # the loop is closed: nobody waits for this answer
            pass
        del call, loop, future, fn, args, result, error  # (nothing kept alive)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # cancelled while it ran
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)
