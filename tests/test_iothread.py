"""``IoThread``: an engine's blocking calls run off the loop, in order, each answered once."""

from __future__ import annotations

import asyncio
import threading

import pytest

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


async def test_a_call_whose_caller_was_cancelled_still_runs_and_later_calls_follow() -> None:
    io = IoThread("t-io")
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def slow() -> str:
        started.set()
        release.wait(10)
        ran.append("slow")
        return "dropped"

    try:
        first = asyncio.ensure_future(io.run(slow))
        second = io.run(ran.append, "next")
        await asyncio.to_thread(started.wait, 10)
        first.cancel()
        release.set()
        await second
        assert ran == ["slow", "next"]  # never skipped, never reordered
        assert first.cancelled()
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
