"""One ``make_store`` factory, parametrized over every engine.

It can build a second store on the same path, so durability (close, reopen,
compare) is part of the contract. The memory engine runs the contract too, so
the fake the runtime tests use cannot drift from the real engines.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from sqlq.bench.pgcluster import Cluster, make_cluster
from sqlq.common.clock import SYSTEM_CLOCK, AutojumpLoop, Clock, FakeClock
from sqlq.common.engine.memory import MemoryStore
from sqlq.common.store import JobStore
from sqlq.engines.registry import ALL, DURABLE, SHARED, make_store
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.kinds import Registry
from sqlq.runtime.service import Service
from tests.helpers import NOW, ServiceFactory, StoreFactory, unavailable
from tests.pgdb import fresh_database


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock that moves only when the test says so (``advance``)."""
    return FakeClock(NOW)


def _autojump_loop() -> asyncio.AbstractEventLoop:
    return FakeClock(NOW, autojump=True).new_event_loop()


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """A test that asks for ``fake_clock`` runs on a loop that autojumps it; every other
    one on asyncio's own loop (one factory each, so test names are unchanged)."""
    if "fake_clock" in getattr(item, "fixturenames", ()):
        return {"autojump": _autojump_loop}
    return {"asyncio": asyncio.new_event_loop}


@pytest.fixture
async def fake_clock() -> FakeClock:
    """The autojumping clock of this test's loop: whenever nothing is ready to run (and
    nothing runs in the loop's executor), it jumps to its next deadline, so a test of a
    60 s delay, a lease or a heartbeat timeout finishes at once and never waits in real time.

    For the memory engine and engines whose I/O goes through ``run_in_executor`` or their
    ``IoThread`` (walq). A reply awaited on a socket (PostgreSQL) or from a thread the loop
    does not see (aiosqlite's) looks like idleness: the clock may jump while it is in
    flight. A test that needs time to stand still while a thread works stuck on purpose
    moves the clock by hand (``advance``)."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, AutojumpLoop), "fake_clock runs only on the autojump loop"
    return loop.clock


@pytest.fixture(params=ALL)
def engine(request: pytest.FixtureRequest) -> str:
    """Every engine, PostgreSQL included: the contract suite runs over these."""
    return str(request.param)


def _factory(
    engine: str, tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> StoreFactory:
    """Stores of ``engine`` on ``tmp_path`` (or one fresh database); a second one reopens
    the first's files (or database)."""
    dsn = None
    if engine in SHARED:
        dsn = fresh_database(request)

    def make(**options: Any) -> JobStore:
        options.setdefault("clock", clock)
        if dsn is not None:
            options.setdefault("dsn", dsn)
        return make_store(engine, tmp_path, **options)

    return make


@pytest.fixture
def factory(
    engine: str, tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> StoreFactory:
    return _factory(engine, tmp_path, clock, request)


@pytest.fixture(params=DURABLE)
def durable_engine(request: pytest.FixtureRequest) -> str:
    """For what only a single-node durable engine promises (recovery into memory, the data
    directory's lock, kill -9 of the one process): no skips."""
    return str(request.param)


@pytest.fixture
def durable_factory(
    durable_engine: str, tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> StoreFactory:
    return _factory(durable_engine, tmp_path, clock, request)


@pytest.fixture(params=(*DURABLE, *SHARED))
def reopen_engine(request: pytest.FixtureRequest) -> str:
    """Every engine that keeps what it committed across a close and reopen."""
    return str(request.param)


@pytest.fixture
def reopen_factory(
    reopen_engine: str, tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> StoreFactory:
    return _factory(reopen_engine, tmp_path, clock, request)


@pytest.fixture
async def store(factory: StoreFactory) -> AsyncIterator[JobStore]:
    s = factory()
    await s.open()
    yield s
    await s.close()


@pytest.fixture
async def services() -> AsyncIterator[ServiceFactory]:
    """Build ``Service``s, stopped at teardown.

    On the memory engine unless given a store: runtime behaviour does not depend
    on the engine, and the contract suite is where every engine is covered.
    """
    made: list[Service] = []

    def make(
        store: JobStore | None = None,
        *,
        kinds: Registry | None = None,
        clock: Clock = SYSTEM_CLOCK,
        **config: Any,
    ) -> Service:
        config.setdefault("workers", 4)
        config.setdefault("seed", 1)
        config.setdefault("fault_injection", True)
        rt = Service(
            store or MemoryStore(clock=clock), RuntimeConfig(**config), kinds=kinds, clock=clock
        )
        made.append(rt)
        return rt

    yield make
    for rt in made:
        await rt.stop(0)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """One real PostgreSQL 15 for the session; each test gets its own database."""
    try:
        cluster = make_cluster()
    except (FileNotFoundError, RuntimeError) as exc:
        unavailable(f"PostgreSQL: {exc}")
        raise
    yield cluster
    cluster.discard()


@pytest.fixture
def pg_dsn(request: pytest.FixtureRequest) -> str:
    """A fresh, empty database in the session's cluster."""
    return fresh_database(request, migrated=False)


@pytest.fixture
def pg_db(request: pytest.FixtureRequest) -> str:
    """A fresh database in the session's cluster, migrated to the latest schema."""
    return fresh_database(request)
