"""What the migration tests share: a committed old file copied into a test's directory,
plain-SQL reads of a SQLite file, and a PostgreSQL database built up to an old version
with the rows an old tree wrote (``tests/data``; each with the script that made it)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import asyncpg

from sqlq.engines.postgres.migrate import Q as MQ
from sqlq.engines.postgres.migrate import migrations

DATA = Path(__file__).parent / "data"


def copy_sqlite(name: str, tmp_path: Path) -> Path:
    """A copy of ``tests/data/<name>`` as ``sqlq.db`` in a data directory of its own."""
    db = tmp_path / "sqlq.db"
    shutil.copyfile(DATA / name, db)
    db.chmod(0o600)
    return db


def raw(db: Path, sql: str) -> list[Any]:
    """``sql``'s rows, read by stdlib sqlite3 (not the engine)."""
    with sqlite3.connect(db) as c:
        rows = c.execute(sql).fetchall()
    c.close()
    return rows


def columns(db: Path) -> list[str]:
    return [r[0] for r in raw(db, "SELECT name FROM pragma_table_info('jobs')")]


def version(db: Path) -> str:
    return str(raw(db, "SELECT value FROM meta WHERE key = 'schema_version'")[0][0])


async def at_version(conn: asyncpg.Connection, upto: int, tables: dict[str, Any]) -> None:
    """Build the database as today's migration files 1 to ``upto`` leave it, then insert
    ``tables`` (an old tree's rows, by table) as they were written."""
    await conn.execute(MQ["create_version"])
    await conn.execute(MQ["first_version"])
    for mg in migrations()[:upto]:
        await conn.execute(mg.sql)
        await conn.execute(MQ["set_version"], mg.version)
    for table, rows in tables.items():
        await conn.execute(
            f"INSERT INTO {table} SELECT * FROM json_populate_recordset(NULL::{table}, $1)",
            json.dumps(rows),
        )
