"""``IoThread``: an engine's blocking calls run off the loop, in order, each answered once."""

from __future__ import annotations

import asyncio
import gc
import threading

import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.engine.iothread import IoThread


async def test_calls_run_on_one_thread_in_the_order_asked() -> None:
    io = IoThread("t-io")
    seen: list[tuple[int, str]] = []

    def note(i: int) -> int:
        seen.append((i, threading.current_thread().name))
        return i * 2

    try:
        results = await asyncio.gather(*(io.run(note, i) for i in range(50)))
    finally:
        io.shutdown()
    assert results == [i * 2 for i in range(50)]
    assert [i for i, _ in seen] == list(range(50))
    assert {name for _, name in seen} == {"t-io"}
    assert threading.current_thread().name != "t-io"


async def test_an_error_reaches_its_caller_alone() -> None:
    io = IoThread("t-io")

    def boom() -> None:
        raise OSError(5, "EIO")

    try:
        with pytest.raises(OSError, match="EIO"):
            await io.run(boom)
        assert await io.run(lambda: "after") == "after"  # the thread goes on
    finally:
        io.shutdown()


async def test_a_queued_call_whose_caller_was_cancelled_still_runs_in_its_place() -> None:
    io = IoThread("t-io")
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def slow() -> str:
        started.set()
        release.wait(10)
        ran.append("slow")
        return "first"

    try:
        first = io.run(slow)
        queued = asyncio.ensure_future(io.run(ran.append, "queued"))
        last = io.run(ran.append, "last")
        await asyncio.to_thread(started.wait, 10)
        queued.cancel()  # (still in the queue: the thread is held in ``slow``)
        await asyncio.sleep(0)
        release.set()
        assert await first == "first"
        await last
        assert ran == ["slow", "queued", "last"]  # never skipped, never reordered
        assert queued.cancelled()
    finally:
        io.shutdown()


def test_an_io_thread_dropped_unclosed_ends_its_thread() -> None:
    async def use() -> threading.Thread:
        io = IoThread("t-io-dropped")
        assert await io.run(lambda: 1) == 1
        thread = io._thread
        assert thread is not None
        assert thread.is_alive()
        del io
        return thread

    thread = asyncio.run(use())
    gc.collect()
    thread.join(10)
    assert not thread.is_alive()


async def test_the_autojump_clock_stands_still_while_a_call_is_on_the_thread(
    fake_clock: FakeClock,
) -> None:
    io = IoThread("t-io-clock")
    release = threading.Event()
    try:
        call = io.run(release.wait, 10)
        sleeper = asyncio.ensure_future(fake_clock.sleep(60))  # a deadline to jump to
        before = fake_clock.monotonic()
        loop = asyncio.get_running_loop()
        for _ in range(20):  # idle waits of the loop: each would jump, were nothing held
            woken = loop.create_future()
            threading.Timer(0.002, loop.call_soon_threadsafe, (woken.set_result, None)).start()
            await woken
        assert fake_clock.monotonic() == before
        release.set()
        await call
        await sleeper  # only now may it jump
        assert fake_clock.monotonic() - before >= 60.0
    finally:
        io.shutdown()


async def test_after_shutdown_a_call_fails_and_shutdown_waits_for_what_was_asked() -> None:
    io = IoThread("t-io")
    done: list[int] = []
    pending = [io.run(done.append, i) for i in range(5)]
    io.shutdown()  # (the calls before it run first)
    assert done == [0, 1, 2, 3, 4]
    await asyncio.gather(*pending)
    with pytest.raises(RuntimeError, match="shut down"):
        await io.run(done.append, 9)
    io.shutdown()  # twice: nothing more
