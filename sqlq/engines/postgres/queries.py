"""The engine's statements, loaded once from ``queries.sql`` (and ``schedules.sql``) with
their column lists put in.

The column lists are written once, in Python: a job's in ``sqlq.engines.rows``, a
guarded transition's here (``MOVE_COLUMNS``), and the encoder builds its rows in
those orders, so a statement, a row and the code that reads it can't disagree.
"""

from __future__ import annotations

from sqlq.common.engine.sql import load_queries
from sqlq.engines.listing import PostgresShape, postgres_statements
from sqlq.engines.rows import JOB_COLUMN_LIST, TRANSITION_COLUMNS

# A guarded transition (write_batch's ``u``): the transition's row with the states it may
# come from after its expected epoch, and the fence it must also pass at the end.
MOVE_COLUMNS = (
    *TRANSITION_COLUMNS[:2],
    "allowed",
    *TRANSITION_COLUMNS[2:],
    "holder",
    "lease_from",
    "lease_before",
)


def _load(filename: str) -> dict[str, str]:
    lists = {"{job_columns}": JOB_COLUMN_LIST, "{move_columns}": ", ".join(MOVE_COLUMNS)}
    queries = load_queries("sqlq.engines.postgres", filename)
    for marker, columns in lists.items():
        queries = {name: sql.replace(marker, columns) for name, sql in queries.items()}
    return queries


def _schedule_listings(queries: dict[str, str]) -> dict[PostgresShape, str]:
    """A schedule's listing per filter shape: the listings' terms, numbered from ``$2``
    as ``postgres_statements`` numbers them, then the key range's two arguments."""
    out = {}
    for shape, sql in postgres_statements({**Q, "list": queries["list_schedule"]}).items():
        n = 2 + sum(shape)
        out[shape] = sql.replace("{low}", f"${n}::text").replace("{high}", f"${n + 1}::text")
    return out


Q = _load("queries.sql")
LIST_STATEMENTS = postgres_statements(Q)
SQ = _load("schedules.sql")
SCHEDULE_LIST_STATEMENTS = _schedule_listings(SQ)
