"""A node's connections to PostgreSQL (``sqlq.engines.postgres.connections``): an ``open``
that fails part way leaves nothing open, a listener cut off without a word is found and
listens again, and what a client hears of an unreachable database names no host."""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest

from sqlq.bench.client.server import free_port
from sqlq.common.errors import StoreError
from sqlq.engines.postgres.connections import Connections
from sqlq.engines.postgres.store import PostgresStore
from sqlq.http.app import create_app
from tests import shared_helpers
from tests.helpers import wait_for
from tests.proxy import proxy_to
from tests.shared_helpers import Node

nodes = shared_helpers.nodes  # the fixture, by its name


def through(dsn: str, port: int) -> str:
    """``dsn`` with its port replaced (a proxy's)."""
    parts = urlsplit(dsn)
    host = parts.netloc.rsplit(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{host}:{port}"))


async def backends(dsn: str) -> int:
    """The other connections to ``dsn``'s database, as PostgreSQL counts them."""
    conn = await asyncpg.connect(dsn)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        )
    finally:
        await conn.close()


@pytest.mark.parametrize("error", [OSError("refused"), RuntimeError("a bug")])
async def test_an_open_that_fails_part_way_closes_what_it_opened(
    pg_db: str, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    real = asyncpg.create_pool
    made: list[asyncpg.Pool] = []

    async def second_fails(*args: Any, **kwargs: Any) -> asyncpg.Pool:
        if made:
            raise error
        made.append(await real(*args, **kwargs))
        return made[0]

    monkeypatch.setattr(asyncpg, "create_pool", second_fails)
    conns = Connections(pg_db, name="postgres", settings={}, pool_size=2)
    with pytest.raises(StoreError if isinstance(error, OSError) else RuntimeError):
        await conns.open()
    assert made  # the first pool was made, then the second failed
    assert made[0].is_closing()

    async def none_left() -> bool:
        return await backends(pg_db) == 0

    await wait_for(none_left, 10, "the writer's and the first pool's connections to end")


async def test_a_listener_cut_off_silently_is_found_and_listens_again(pg_db: str) -> None:
    host, port = urlsplit(pg_db).hostname or "127.0.0.1", urlsplit(pg_db).port or 5432
    async with proxy_to(host, port) as proxy:
        conns = Connections(
            through(pg_db, proxy.port), name="postgres", settings={}, pool_size=1,
            deadline_s=0.5,
        )  # fmt: skip
        conns.ping_s = 0.2
        wakes: list[int] = []
        conns.listen(lambda: wakes.append(1))
        try:
            await wait_for(lambda: conns.listener is not None, 10, "the listener to listen")
            first = conns.listener
            proxy.cut()  # no error, no close: the link only goes silent
            await wait_for(lambda: conns.listener is None, 5, "the silent listener to be dropped")
            proxy.heal()
            await wait_for(
                lambda: conns.listener not in (None, first), 10, "a new listener to listen"
            )
            heard = len(wakes)
            notifier = await asyncpg.connect(pg_db)
            try:
                await notifier.execute("NOTIFY sqlq_jobs")
            finally:
                await notifier.close()
            await wait_for(lambda: len(wakes) > heard, 10, "the new listener to hear a NOTIFY")
        finally:
            await conns.close()


def test_an_unreachable_databases_message_names_no_host_and_its_log_line_does(
    caplog: pytest.LogCaptureFixture,
) -> None:
    dsn = "postgresql://sqlq:s3cret@db.internal:45189/t_orders"
    conns = Connections(dsn, name="postgres", settings={}, pool_size=1)
    refused = OSError("Multiple exceptions: Connect call failed ('10.1.2.3', 45189)")
    with caplog.at_level(logging.WARNING, "sqlq.engines.postgres.connections"):
        message = conns.unreachable(refused)
        conns.unreachable(refused)  # the same error again: logged once
    for secret in ("db.internal", "45189", "t_orders", "10.1.2.3", "s3cret", "sqlq:"):
        assert secret not in message
    assert message == "PostgreSQL is unavailable: OSError"
    [line] = [r.getMessage() for r in caplog.records]
    assert "db.internal:45189/t_orders" in line
    assert "Connect call failed ('10.1.2.3', 45189)" in line
    assert "s3cret" not in line


async def test_a_503_of_an_unreachable_database_names_no_host(
    nodes: Node, pg_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    node = nodes(workers=1)
    await node.start()
    store = node.store
    assert isinstance(store, PostgresStore)
    parts = urlsplit(pg_db)
    dead = free_port()
    (await store._db.writer()).terminate()  # lost: the next batch connects again
    store._db.dsn = through(pg_db, dead)  # and cannot
    api = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(node, start_runtime=False)),
        base_url="http://localhost",
    )
    try:
        async with api:
            with caplog.at_level(logging.WARNING, "sqlq.engines.postgres.connections"):
                refused = await api.post("/jobs", json={"kind": "work", "args": {}})
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"] == "unavailable"
        assert "PostgreSQL is unavailable" in refused.json()["message"]
        for secret in (parts.hostname, str(parts.port), str(dead), parts.path.strip("/")):
            assert secret
            assert secret not in refused.text
        assert any(str(parts.port) in r.getMessage() for r in caplog.records)  # the log says
    finally:
        store._db.dsn = pg_db


async def test_a_nodes_connections_carry_its_name_in_pg_stat_activity(pg_db: str) -> None:
    """Each connection is named for its node (``application_name``): an operator sees who
    holds what, and the crash test waits there for a killed node's last commit. A name
    past PostgreSQL's 63 bytes keeps its start and a hash of the whole, never a clash."""
    from sqlq.engines.postgres.connections import application_name

    store = PostgresStore(pg_db)
    await store.open()
    try:
        await store.next_due(0.0)  # (a read: a pooled connection is in use)
        conn = await asyncpg.connect(pg_db)
        try:
            names = {r[0] for r in await conn.fetch("SELECT application_name "
                                                    "FROM pg_stat_activity")}  # fmt: skip
        finally:
            await conn.close()
    finally:
        await store.close()
    assert application_name(store.node) == store.node
    assert store.node in names
    long_a, long_b = "node:" + "h" * 80 + ":1", "node:" + "h" * 80 + ":2"
    assert len(application_name(long_a)) <= 63
    assert application_name(long_a) != application_name(long_b)
    assert application_name("node:hôte:1").isascii()
