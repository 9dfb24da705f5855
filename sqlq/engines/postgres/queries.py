"""The engine's statements, loaded once from ``queries.sql`` (and ``schedules.sql``) with
their column lists put in.

The column lists are written once, in Python: a job's in ``sqlq.engines.rows``, a
guarded transition's here (``MOVE_COLUMNS``), and the encoder builds its rows in
those orders, so a statement, a row and the code that reads it can't disagree.

``Job.holder`` is the ``node`` column. Version 1 made ``node`` and ``lease_until`` for
claims, and the claim, renewal, release, rescue and fence statements own them; a remote
worker's claim stores ``worker:<name>`` there, so all of those hold for it unchanged.
Renaming the column would have changed every one of those statements, and the SQL that
tools and tests outside the engine run on ``node`` (the crash checks read a killed
node's jobs by it), for a name only: the column stays, and the job's select list reads
it ``AS holder`` (``TABLE_COLUMNS`` are the table's names, for an INSERT).
"""

from __future__ import annotations

from sqlq.common.engine.sql import load_queries
from sqlq.engines.listing import PostgresShape, postgres_statements, postgres_terms
from sqlq.engines.rows import JOB_COLUMNS, LEASE_COLUMNS, TRANSITION_COLUMNS

COLUMN_OF = {"holder": "node"}  # a job field stored under another name: the table's
TABLE_COLUMNS = tuple(COLUMN_OF.get(c, c) for c in JOB_COLUMNS)
# A job's select list: its columns, then a workflow member's flow and its parents in the
# order named (NULL for a job outside every workflow: no edge is read for it). ``job_of``
# (flows.py) reads a row of it.
SELECT_LIST = ", ".join(
    [
        *(c if c not in COLUMN_OF else f"{COLUMN_OF[c]} AS {c}" for c in JOB_COLUMNS),
        "flow",
        "CASE WHEN flow IS NULL THEN NULL ELSE ARRAY("
        "SELECT e.parent FROM edges e WHERE e.child = id ORDER BY e.n) END AS parents",
    ]
)
# A guarded transition (write_batch's ``u``): the transition's row with the states it may
# come from after its expected epoch, without its holder and lease (the claim's and the
# renewals', never a transition's: write_batch), and the fence it must also pass at the
# end (``holder`` there is the fence's: the node, or worker, an outcome must find).
MOVE_COLUMNS = (
    *TRANSITION_COLUMNS[:2],
    "allowed",
    *TRANSITION_COLUMNS[2 : -len(LEASE_COLUMNS)],
    "holder",
    "lease_from",
    "lease_before",
)


def _load(filename: str) -> dict[str, str]:
    lists = {
        "{job_columns}": SELECT_LIST,
        "{table_columns}": ", ".join(TABLE_COLUMNS),
        "{move_columns}": ", ".join(MOVE_COLUMNS),
    }
    queries = load_queries("sqlq.engines.postgres", filename)
    for marker, columns in lists.items():
        queries = {name: sql.replace(marker, columns) for name, sql in queries.items()}
    return queries


def _schedule_listings(queries: dict[str, str]) -> dict[PostgresShape, str]:
    """A schedule's listing per filter shape: the listings' terms, numbered from ``$2``
    as ``postgres_statements`` numbers them, then the key range's two arguments."""
    out = {}
    for shape, sql in postgres_statements({**Q, "list": queries["list_schedule"]}).items():
        n = 2 + postgres_terms(shape)
        out[shape] = sql.replace("{low}", f"${n}::text").replace("{high}", f"${n + 1}::text")
    return out


Q = _load("queries.sql")
Q["fair_read"] = Q["fair_read"].replace("{due_by_key}", Q.pop("due_walked"))
LIST_STATEMENTS = postgres_statements(Q)
SQ = _load("schedules.sql")
SCHEDULE_LIST_STATEMENTS = _schedule_listings(SQ)
