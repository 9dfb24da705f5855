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
from urllib.parse import unquote

import asyncpg

from sqlq.common.engine.sql import load_queries
from sqlq.common.errors import StoreError

MIGRATE_LOCK = 0x5371_6C71  # "Sqlq": one advisory lock id for every sqlq migration
_FILE = re.compile(r"^(\d{3})_[a-z0-9_]+\.sql$")
Q = load_queries("sqlq.engines.postgres", "migrate.sql")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    files = resources.files("sqlq.engines.postgres").joinpath("schema")
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


# A URI as libpq reads it, strictly: a '/', '?' or '@' where none may be (a password
# holding an unencoded '/', say) makes it unparsable, so no part of it is ever shown.
_URI = re.compile(
    r"postgres(?:ql)?://(?:(?P<user>[^@/?#:]*)(?::[^@/?#]*)?@)?"
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._%-]*)(?::(?P<port>[0-9]{1,5}))?"
    r"(?:/(?P<db>[^/?#@]*))?(?:\?[^#]*)?",
    re.ASCII,
)
# One ``key = value`` pair of a libpq keyword DSN; a value is bare or single-quoted
# with backslash escapes.
_PAIR = re.compile(r"\s*([A-Za-z_]+)\s*=\s*('(?:[^'\\]|\\.)*'|[^\s']+)\s*", re.ASCII)
_SHOWN = frozenset({"host", "port", "dbname", "user"})
NOT_SHOWN = "the DSN (not shown)"
MAX_SHOWN = 200  # characters of a host or database name worth printing


def _keywords(dsn: str) -> dict[str, str] | None:
    """A keyword DSN's host, port, dbname and user; None unless all of it parses."""
    found: dict[str, str] = {}
    at = 0
    while at < len(dsn):
        m = _PAIR.match(dsn, at)
        if m is None or m.end() == at:
            return None
        key, value = m.group(1).lower(), m.group(2)
        if key in _SHOWN:
            found[key] = re.sub(r"\\(.)", r"\1", value[1:-1]) if value[0] == "'" else value
        at = m.end()
    return found if found or dsn.strip() else None


def where(dsn: str) -> str:
    """``host:port/database`` of a DSN, for messages: never any part of its password.

    Only a DSN that parses whole (a ``postgresql://`` URI, or libpq's
    ``key=value`` words) is shown, and only its host, port and database; anything
    else is "the DSN (not shown)", since a half-parsed DSN may show its secret.
    """
    uri = _URI.fullmatch(dsn.strip())
    if uri is not None:
        host, port = unquote(uri["host"]) or "localhost", uri["port"]
        database = unquote(uri["db"] or "") or unquote(uri["user"] or "") or "?"
    elif "://" in dsn or (words := _keywords(dsn)) is None:
        return NOT_SHOWN
    else:
        host, port = words.get("host", "localhost"), words.get("port")
        database = words.get("dbname") or words.get("user") or "?"
    text = f"{host}{f':{port}' if port else ''}/{database}"
    return text if len(text) <= MAX_SHOWN and text.isprintable() else NOT_SHOWN


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
    exists = await conn.fetchval(Q["has_version"])
    if not exists:
        return 0
    return int(await conn.fetchval(Q["version"]))


async def migrate(dsn: str) -> tuple[int, int]:
    """Apply every pending migration; returns (version before, version after)."""
    conn = await connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute(Q["lock"], MIGRATE_LOCK)
            before = await version(conn)
            if before > LATEST:
                raise SchemaMismatch(
                    f"{where(dsn)} is at schema version {before}, newer than this sqlq "
                    f"({LATEST}): upgrade sqlq"
                )
            if before == 0:
                await conn.execute(Q["create_version"])
                await conn.execute(Q["first_version"])
            for mg in migrations()[before:]:
                await conn.execute(mg.sql)
                await conn.execute(Q["set_version"], mg.version)
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
