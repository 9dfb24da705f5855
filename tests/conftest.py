"""One ``make_store`` factory, parametrized over every engine.

It can build a second store on the same path, so durability (close, reopen,
compare) is part of the contract. The memory engine runs the contract too, so
the fake the runtime tests use cannot drift from the real engines.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from common.clock import FakeClock
from common.store import JobStore
from sqlq.engines import DURABLE, NAMES, make_store

StoreFactory = Callable[..., JobStore]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_700_000_000.0)


@pytest.fixture(params=NAMES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _factory(engine: str, tmp_path: Path, clock: FakeClock) -> StoreFactory:
    """Stores of ``engine`` on ``tmp_path``; a second one reopens the first's files."""

    def make(**options: Any) -> JobStore:
        options.setdefault("clock", clock)
        return make_store(engine, tmp_path, **options)

    return make


@pytest.fixture
def factory(engine: str, tmp_path: Path, clock: FakeClock) -> StoreFactory:
    return _factory(engine, tmp_path, clock)


@pytest.fixture(params=DURABLE)
def durable_engine(request: pytest.FixtureRequest) -> str:
    """For what only a durable engine promises (reopen, locks, kill -9): no skips."""
    return str(request.param)


@pytest.fixture
def durable_factory(durable_engine: str, tmp_path: Path, clock: FakeClock) -> StoreFactory:
    return _factory(durable_engine, tmp_path, clock)


@pytest.fixture
async def store(factory: StoreFactory) -> AsyncIterator[JobStore]:
    s = factory()
    await s.open()
    yield s
    await s.close()


def unavailable(reason: str) -> None:
    """A test's prerequisite is missing: fail under CI (whose own files install it), else skip.

    A test that is skipped in CI is a missing test, so CI never skips quietly.
    """
    if os.environ.get("CI"):
        pytest.fail(f"CI must provide this: {reason}")
    pytest.skip(reason)


async def wait_for(
    predicate: Callable[[], bool | Awaitable[bool]], within: float = 10.0, what: str = ""
) -> None:
    """Wait until ``predicate`` holds, or fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what or predicate}")
        await asyncio.sleep(0.005)
