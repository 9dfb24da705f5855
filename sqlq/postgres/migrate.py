"""Schema versions: ``sqlq migrate`` applies ``schema/NNN_*.sql`` in order; servers check.

The version a database is at lives in ``sqlq_schema``. Migrating takes a
transaction-level advisory lock, so two nodes that migrate at once apply each
file once; every file runs in the same transaction as the version bump, so a
failed migration leaves the previous version whole. A server built for version
N refuses a database at any other version, with a message that says which way
to go (``sqlq migrate``, or a newer sqlq).

Errors name the DSN's host, port and database, never its password.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from urllib.parse import urlsplit

import asyncpg

from common.errors import StoreError

MIGRATE_LOCK = 0x5371_6C71  # "Sqlq": one advisory lock id for every sqlq migration
_FILE = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    files = resources.files("sqlq.postgres").joinpath("schema")
    found = []
    for entry in files.iterdir():
        m = _FILE.match(entry.name)
        if m:
            found.append(Migration(int(m.group(1)), entry.name, entry.read_text("utf-8")))
    found.sort(key=lambda mg: mg.version)
    if [mg.version for mg in found] != list(range(1, len(found) + 1)):
        raise AssertionError(f"schema files must be numbered 001, 002, ...: {found}")
    return found


LATEST = len(migrations())


def where(dsn: str) -> str:
    """``host:port/database`` of a DSN, for messages: never the user's password."""
    try:
        parts = urlsplit(dsn)
        host = parts.hostname or "localhost"
        port = f":{parts.port}" if parts.port else ""
        database = parts.path.lstrip("/") or parts.username or "?"
    except ValueError:
        return "an unparsable DSN"
    return f"{host}{port}/{database}"


class SchemaMismatch(StoreError):
    """The database's schema is not the version this sqlq was built for."""


async def connect(dsn: str, **options: object) -> asyncpg.Connection:
    """A connection, or one ``StoreError`` line naming the host and database."""
    try:
        return await asyncpg.connect(dsn, **options)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError) as exc:
        reason = type(exc).__name__ if isinstance(exc, ValueError) else str(exc).splitlines()[0]
        raise StoreError(f"cannot connect to PostgreSQL at {where(dsn)}: {reason}") from None


async def version(conn: asyncpg.Connection) -> int:
    """The schema version the database is at; 0 for a database sqlq never touched."""
    exists = await conn.fetchval("SELECT to_regclass('sqlq_schema') IS NOT NULL")
    if not exists:
        return 0
    return int(await conn.fetchval("SELECT version FROM sqlq_schema"))


async def migrate(dsn: str) -> tuple[int, int]:
    """Apply every pending migration; returns (version before, version after)."""
    conn = await connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATE_LOCK)
            before = await version(conn)
            if before > LATEST:
                raise SchemaMismatch(
                    f"{where(dsn)} is at schema version {before}, newer than this sqlq "
                    f"({LATEST}): upgrade sqlq"
                )
            if before == 0:
                await conn.execute("CREATE TABLE sqlq_schema (version integer NOT NULL)")
                await conn.execute("INSERT INTO sqlq_schema VALUES (0)")
            for mg in migrations()[before:]:
                await conn.execute(mg.sql)
                await conn.execute("UPDATE sqlq_schema SET version = $1", mg.version)
        return before, LATEST
    finally:
        await conn.close()


async def check(conn: asyncpg.Connection, dsn: str) -> None:
    """Refuse to serve a schema this sqlq was not built for."""
    at = await version(conn)
    if at < LATEST:
        raise SchemaMismatch(
            f"{where(dsn)} is at schema version {at}; this sqlq needs {LATEST}: "
            "run `sqlq migrate` first"
        )
    if at > LATEST:
        raise SchemaMismatch(
            f"{where(dsn)} is at schema version {at}, newer than this sqlq ({LATEST}): upgrade sqlq"
        )
