"""Injected time: reading it, and waiting on it.

Job timestamps (``ready_at``, ``created_at``) are wall-clock seconds because they
must survive a restart; only code that owns a loop reads a clock, and always
through this protocol so tests can drive time by hand. Every wait whose length is
a policy (a delay, a poll interval, a lease, a heartbeat, a grace period) goes
through ``sleep`` or ``call_later`` too, so a test of a 60 s delayed job drives
the clock instead of waiting a minute.

``FakeClock`` keeps its own heap of deadlines and fires them when told to
(``advance``) or, with ``autojump`` on and the loop from ``new_event_loop``, by
itself whenever the loop has nothing else to do: trio's
``MockClock(autojump_threshold=0)``, built on asyncio's public selector seam.
Work in the loop's executor holds the jump back; I/O it cannot see (a socket
awaiting a reply, a thread of a library's own) does not.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import selectors
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Timer(Protocol):
    def cancel(self) -> None:
        """Never fire (a no-op once fired or cancelled)."""
        ...


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds since the epoch: timestamps that must survive a restart."""
        ...

    def monotonic(self) -> float:
        """Seconds that only go forward: heartbeats and timeouts."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time (cancellable, as ``asyncio.sleep``)."""
        ...

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        """Call ``callback`` on the running loop once ``delay`` seconds have passed."""
        ...


class SystemClock:
    # The C functions themselves, not methods that call them: a job reads the clock about
    # ten times on its way through, and a Python frame around each cost more than the read.
    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)  # (after: from here on ``time`` in this body is this)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        return asyncio.get_running_loop().call_later(delay, callback)


class _FakeTimer:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], object]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _run(callback: Callable[[], object]) -> None:
    """Call a fired timer's callback as the event loop calls a ``call_later`` one: an
    exception goes to the running loop's exception handler (logged), and neither stops
    the loop nor keeps the timers due after it from firing."""
    try:
        callback()
    except Exception as exc:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise exc from None  # advanced by hand outside a loop: the caller sees it
        loop.call_exception_handler({"message": "FakeClock timer callback failed",
                                     "exception": exc})  # fmt: skip


class FakeClock:
    """A clock that moves only when told to, or (``autojump``) when the loop is idle.

    Deadlines are on the monotonic axis; ``time()`` moves with it. Callbacks fire
    synchronously, in deadline order (ties in the order they were armed), each with
    the clock standing at its own deadline, so a callback that arms another timer
    arms it from the right instant.
    """

    def __init__(self, start: float = 1_000_000.0, *, autojump: bool = False) -> None:
        self.now = start
        self.mono = 0.0
        self.autojump = autojump
        self._heap: list[tuple[float, int, _FakeTimer]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.mono

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        timer = _FakeTimer(callback)
        heapq.heappush(self._heap, (self.mono + max(0.0, delay), next(self._seq), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)  # a yield, as asyncio.sleep(0) is
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        timer = self.call_later(seconds, lambda: _wake(fut))
        try:
            await fut
        finally:
            timer.cancel()

    def next_deadline(self) -> float | None:
        """The monotonic instant the earliest live timer fires at, if any."""
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def advance(self, seconds: float) -> None:
        """Move both clocks ``seconds`` forward, firing every timer now due."""
        target = self.mono + seconds
        while (due := self.next_deadline()) is not None and due <= target:
            _, _, timer = heapq.heappop(self._heap)
            self._move_to(max(due, self.mono))
            timer.cancelled = True
            _run(timer.callback)
        self._move_to(max(target, self.mono))

    def jump(self) -> bool:
        """Jump to the earliest deadline and fire what is due there; False if none."""
        due = self.next_deadline()
        if due is None:
            return False
        self.advance(max(0.0, due - self.mono))
        return True

    def _move_to(self, mono: float) -> None:
        self.now += mono - self.mono
        self.mono = mono

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        """A loop that, with ``autojump`` on, jumps this clock whenever it would block."""
        return AutojumpLoop(self)


class _JumpingSelector(selectors.BaseSelector):
    """The default selector, except that a wait which finds nothing ready jumps the clock.

    ``select(0)`` first: real I/O (a socket, a thread's wake-up) always wins. Work
    in the loop's executor holds the jump back, so a job or a commit running in a
    thread never sees its heartbeat, lease or timeout expire under it."""

    def __init__(self, clock: FakeClock, busy: Callable[[], bool]) -> None:
        self._inner = selectors.DefaultSelector()
        self._clock = clock
        self._busy = busy

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is not None and timeout <= 0:
            return self._inner.select(timeout)
        ready = self._inner.select(0)
        if ready:
            return ready
        if self._clock.autojump and not self._busy() and self._clock.jump():
            return []  # the fired timers scheduled their callbacks: the loop runs them now
        return self._inner.select(timeout)

    def close(self) -> None:
        self._inner.close()

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._inner.get_map()


class AutojumpLoop(asyncio.SelectorEventLoop):
    """A selector loop that jumps ``clock`` when idle, counting work on threads for that."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self._in_threads = 0
        super().__init__(_JumpingSelector(clock, lambda: self._in_threads > 0))

    def run_in_executor(  # type: ignore[override]
        self, executor: Executor | None, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        fut = super().run_in_executor(executor, func, *args)
        self.hold(fut)
        return fut

    def hold(self, fut: asyncio.Future[Any]) -> None:
        """Hold the clock still until ``fut``, a call on some thread, is answered: an
        engine's own I/O thread (``IoThread``) counts as the executor does."""
        self._in_threads += 1
        fut.add_done_callback(self._thread_done)

    def _thread_done(self, _: object) -> None:
        self._in_threads -= 1


SYSTEM_CLOCK = SystemClock()


async def wait_event(clock: Clock, event: asyncio.Event, within: float) -> bool:
    """Wait until ``event`` is set or ``within`` of ``clock``'s seconds pass; True if set.

    ``asyncio.wait_for(event.wait(), within)`` on the injected clock: a policy's
    timeout (a grace period, a poll) that a fake clock can drive. ``within`` of 0 or
    less only looks, as ``wait_for`` does."""
    if event.is_set() or within <= 0:
        return event.is_set()
    over: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiter = asyncio.ensure_future(event.wait())
    waiter.add_done_callback(lambda _: _wake(over))
    timer = clock.call_later(within, lambda: _wake(over))
    try:
        await over
    finally:
        timer.cancel()
        waiter.cancel()
    return event.is_set()
