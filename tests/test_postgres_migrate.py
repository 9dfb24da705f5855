"""The PostgreSQL schema: `sqlq migrate` on a real PostgreSQL 15, versions checked both ways."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from click.testing import CliRunner

from sqlq.bench.pgcluster import Cluster
from sqlq.cli import main
from sqlq.common.errors import StoreError
from sqlq.engines.postgres.migrate import LATEST, SchemaMismatch, check, connect, migrate, version


async def test_migrate_makes_the_schema_once(pg_dsn: str) -> None:
    assert await migrate(pg_dsn) == (0, LATEST)
    assert await migrate(pg_dsn) == (LATEST, LATEST)  # again: nothing to do
    conn = await asyncpg.connect(pg_dsn)
    try:
        tables = {r[0] for r in await conn.fetch("SELECT tablename FROM pg_tables")}
        assert {"jobs", "queues", "nodes", "sqlq_schema"} <= tables
        assert await version(conn) == LATEST
        await check(conn, pg_dsn)  # a server built for this version accepts it
    finally:
        await conn.close()


async def test_concurrent_migrations_apply_each_file_once(pg_dsn: str) -> None:
    results = await asyncio.gather(*(migrate(pg_dsn) for _ in range(4)))
    assert sorted(results) == [(0, LATEST)] + [(LATEST, LATEST)] * 3


async def test_a_server_refuses_an_older_or_newer_schema(pg_dsn: str) -> None:
    conn = await asyncpg.connect(pg_dsn)
    try:
        with pytest.raises(SchemaMismatch, match="run `sqlq migrate` first"):
            await check(conn, pg_dsn)
        await migrate(pg_dsn)
        await conn.execute("UPDATE sqlq_schema SET version = $1", LATEST + 1)
        with pytest.raises(SchemaMismatch, match="upgrade sqlq"):
            await check(conn, pg_dsn)
        with pytest.raises(SchemaMismatch, match="newer than this sqlq"):
            await migrate(pg_dsn)
    finally:
        await conn.close()


async def test_a_connection_error_names_host_and_database_never_the_password(
    pg_cluster: Cluster,
) -> None:
    bad = f"postgresql://sqlq:hunter2@127.0.0.1:{pg_cluster.port}/no_such_db"
    with pytest.raises(StoreError) as err:
        await connect(bad)
    text = str(err.value)
    assert f"127.0.0.1:{pg_cluster.port}/no_such_db" in text
    assert "hunter2" not in text
    assert "\n" not in text


def test_the_migrate_command(pg_cluster: Cluster) -> None:
    dsn = pg_cluster.dsn()
    r = CliRunner().invoke(main, ["migrate", "--dsn", dsn])
    assert r.exit_code == 0, r.output
    assert "migrated from version 0" in r.output or "already at version" in r.output
    r = CliRunner().invoke(main, ["migrate"], env={"SQLQ_DSN": dsn})
    assert (r.exit_code, "already at version" in r.output) == (0, True)
    r = CliRunner().invoke(main, ["migrate", "--dsn", "postgresql://u:s3cr3t@127.0.0.1:9/x"])
    assert r.exit_code == 1
    assert "127.0.0.1:9/x" in r.output
    assert "s3cr3t" not in r.output
    assert "Traceback" not in r.output


def test_serve_refuses_an_unmigrated_database_and_a_bad_dsn_in_one_line(
    pg_dsn: str, pg_cluster: Cluster
) -> None:
    from click.testing import CliRunner

    from sqlq.cli import main

    runner = CliRunner()
    r = runner.invoke(main, ["serve", "--store", "postgres", "--dsn", pg_dsn])
    assert r.exit_code == 1, r.output
    assert "run `sqlq migrate` first" in r.output
    assert "Traceback" not in r.output
    bad = f"postgresql://sqlq:hunter2@127.0.0.1:{pg_cluster.port}/no_such_db"
    r = runner.invoke(main, ["serve", "--store", "postgres"], env={"SQLQ_DSN": bad})
    assert r.exit_code == 1, r.output
    assert f"127.0.0.1:{pg_cluster.port}/no_such_db" in r.output
    assert "hunter2" not in r.output
    assert "Traceback" not in r.output
    r = runner.invoke(main, ["serve", "--store", "sqlite", "--dsn", bad])
    assert r.exit_code == 2
    assert "--dsn" in r.output


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://sqlq:hunter2@db.internal:5433/jobs", "db.internal:5433/jobs"),
        ("postgres://sqlq:hunter2@db.internal/jobs?sslmode=require", "db.internal/jobs"),
        ("postgresql://sqlq:hun%2Fter2@[::1]:5432/jobs", "[::1]:5432/jobs"),
        (
            "host=db.internal port=5433 dbname=jobs user=sqlq password=hunter2",
            "db.internal:5433/jobs",
        ),
        ("password='hunter2 x' host = db.internal  dbname=jobs", "db.internal/jobs"),
        ("dbname=jobs password=hunter2", "localhost/jobs"),
        # A '/' in the password (not percent-encoded) makes the rest unparsable as a URI.
        ("postgresql://sqlq:hun/ter2@db.internal:5432/jobs", "the DSN (not shown)"),
        ("postgresql://sqlq:hunter2/x@db.internal/jobs", "the DSN (not shown)"),
        ("postgresql://sqlq:5432/hunter2@db.internal/jobs", "the DSN (not shown)"),
        ("host=db password='hunter2", "the DSN (not shown)"),
        ("hunter2", "the DSN (not shown)"),
        ("", "the DSN (not shown)"),
    ],
)
def test_where_shows_host_port_and_database_only(dsn: str, shown: str) -> None:
    from sqlq.engines.postgres.migrate import where

    assert where(dsn) == shown
    assert "ter2" not in where(dsn)


SECRET_DSNS = [
    "host=127.0.0.1 port=9 dbname=x user=sqlq password=hunter2",
    "postgresql://sqlq:5432/hunter2@127.0.0.1:9/x",
]


@pytest.mark.parametrize("dsn", SECRET_DSNS, ids=["keywords", "slash-in-password"])
def test_no_password_from_migrate_or_serve(dsn: str) -> None:
    for args in (["migrate", "--dsn", dsn], ["serve", "--store", "postgres", "--dsn", dsn]):
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 1, r.output
        assert "ter2" not in r.output, r.output
        assert "Traceback" not in r.output
        assert "cannot connect to PostgreSQL at" in r.output
