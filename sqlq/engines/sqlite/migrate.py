"""The SQLite schema at open: a new database made at the latest version, an older one
brought up to it in place, and the connection's own objects (the batch view, the copy of
the transition table).

A version is what the file holds, not what ``meta`` says: each migration adds columns,
and runs when the jobs table lacks its first one. Each is one transaction that also sets
``schema_version``, so a crash leaves the file at the version before or the one after,
and the next open finishes what that one did not. ``meta``'s version is for operators and
plain-SQL readers; it is rewritten at every open, so a file an older release opened
again (which writes its own number) still says what it holds after the next open.
"""

from __future__ import annotations

import aiosqlite

from sqlq.common.engine.sql import load_script
from sqlq.common.models import TRANSITIONS
from sqlq.engines.sqlite.batch import BATCH_OBJECTS
from sqlq.engines.sqlite.queries import Q

# 3: the schedules table; 4: the running columns (migrate_v4.sql); 5: a running job's
# holder and lease (migrate_v5.sql) and the secrets table (schema.sql); 6: whether a forced
# cancel holds that lease (migrate_v6.sql); 7: the flows and edges tables of workflows
# (schema.sql: new tables only, so no script); 8: a job's fairness key and weight
# (migrate_v8.sql) and the policies table (schema.sql).
SCHEMA_VERSION = "8"
SCHEMA = load_script("sqlq.engines.sqlite", "schema.sql")
INDEXES = load_script("sqlq.engines.sqlite", "indexes.sql")
# (the column whose absence says the migration is due, its script), oldest first.
MIGRATIONS = (
    ("queue", load_script("sqlq.engines.sqlite", "migrate_v2.sql")),
    ("cancel_requested_at", load_script("sqlq.engines.sqlite", "migrate_v4.sql")),
    ("holder", load_script("sqlq.engines.sqlite", "migrate_v5.sql")),
    ("cancel_forced", load_script("sqlq.engines.sqlite", "migrate_v6.sql")),
    ("key", load_script("sqlq.engines.sqlite", "migrate_v8.sql")),
)


async def prepare(db: aiosqlite.Connection) -> None:
    """Tables, migrations, indexes, then this connection's TEMP objects and the
    transition table copied from ``sqlq.common.models.TRANSITIONS`` (never written by
    hand: the guard must refuse exactly what the Python fold refuses)."""
    await db.executescript(SCHEMA)  # IF NOT EXISTS throughout: a no-op on a current file
    for column, script in MIGRATIONS:
        if column not in {r[0] for r in await db.execute_fetchall(Q["table_columns"])}:
            await migrate(db, script)
    await db.executescript(INDEXES)
    for statement in BATCH_OBJECTS:
        await db.execute(statement)
    await db.execute("BEGIN IMMEDIATE")
    try:
        await db.execute(Q["clear_transitions"])
        await db.executemany(
            Q["insert_transition"],
            [(a.value, b.value) for a, nxt in TRANSITIONS.items() for b in nxt],
        )
        await db.execute(Q["set_meta"], ("schema_version", SCHEMA_VERSION))
    except BaseException:
        await db.rollback()
        raise
    await db.commit()


async def migrate(db: aiosqlite.Connection, script: str) -> None:
    """Run one migration script (its own BEGIN ... COMMIT). If a statement of it fails,
    ``executescript`` stops there with the transaction open: roll it back, so nothing of
    it stays and the error fails the open."""
    try:
        await db.executescript(script)
    except BaseException:
        if db.in_transaction:
            await db.rollback()
        raise
