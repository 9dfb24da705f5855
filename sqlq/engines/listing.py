"""The SQL engines' listing statements: one per filter shape, built once at import.

A listing filters on any of state, kind and queue, and pages by id. Written as one
statement with ``(? IS NULL OR state = ?)`` terms it plans once for every shape, and
the only plan that serves every shape walks the primary key and filters, reading
every retained job when the filter matches few (SQLite at 200k jobs: 21-37 ms a page;
PostgreSQL's generic plan, which asyncpg's prepared statements reach after five runs:
218-286 ms). A statement per shape holds only the terms the query sets, so each plans
on the index for its filter. The terms live in the engines' ``queries.sql``.

Each shape has two directions (``JobQuery.descending``): the templates' ``{beyond}`` is
the cursor's comparison and ``{order}`` the sort's, so a newest-first page walks the same
index backwards from its cursor.
"""

from __future__ import annotations

from itertools import product

from sqlq.common.models import LIVE, RETRYABLE, State
from sqlq.common.store import JobQuery

# A shape: (which state term, or None), kind set, queue set[, cursor set], descending
SqliteShape = tuple[str | None, bool, bool, bool]
PostgresShape = tuple[bool, bool, bool, bool, bool]

# Ids are lowercase hex digits: "g" sorts after every one of them, so SQLite's statement,
# which always has its cursor term, starts a newest-first listing below it.
PAST_EVERY_ID = "g"


def directed(sql: str, descending: bool) -> str:
    """A listing template (``{beyond}``, ``{order}``) for one direction."""
    beyond, order = ("<", "DESC") if descending else (">", "ASC")
    return sql.replace("{beyond}", beyond).replace("{order}", order)


def sqlite_state_term(state: State | None) -> str | None:
    """The name of the state term: SQLite uses a partial index only when the query
    names the index's states, so a state is listed under its index's set."""
    if state is None:
        return None
    if state in LIVE:
        return "list_by_live_state"
    return "list_by_retryable_state" if state in RETRYABLE else "list_by_state"


def sqlite_shape(query: JobQuery) -> SqliteShape:
    return (
        sqlite_state_term(query.state),
        query.kind is not None,
        query.queue is not None,
        query.descending,
    )


def sqlite_statements(queries: dict[str, str]) -> dict[SqliteShape, str]:
    """Every shape's statement, from the template ``list_jobs`` and its terms."""
    out: dict[SqliteShape, str] = {}
    states = (None, "list_by_live_state", "list_by_retryable_state", "list_by_state")
    two = (False, True)
    for state, kind, queue, descending in product(states, two, two, two):
        names = [state, "list_by_kind" if kind else None, "list_by_queue" if queue else None]
        filters = "".join(f" AND {queries[n]}" for n in names if n is not None)
        sql = directed(queries["list_jobs"], descending)
        out[(state, kind, queue, descending)] = sql.replace("{filters}", filters)
    return out


def sqlite_params(query: JobQuery) -> dict[str, object]:
    """Named parameters for any shape (a shape ignores those it has no term for)."""
    return {
        "after": query.after or (PAST_EVERY_ID if query.descending else ""),
        "state": None if query.state is None else query.state.value,
        "kind": query.kind,
        "queue": query.queue,
        "limit": query.limit,
    }


_PG_TERMS = ("state", "kind", "queue", "after")  # the order of the arguments after $1 (limit)


def postgres_shape(query: JobQuery) -> PostgresShape:
    return (
        query.state is not None,
        query.kind is not None,
        query.queue is not None,
        query.after is not None,
        query.descending,
    )


def postgres_terms(shape: PostgresShape) -> int:
    """How many of the statement's arguments after the limit ``shape`` has."""
    return sum(shape[: len(_PG_TERMS)])


def postgres_statements(queries: dict[str, str]) -> dict[PostgresShape, str]:
    """Every shape's statement: ``list`` with ``{filters}`` the shape's terms, each
    ``$name`` numbered in order after ``$1`` (the limit)."""
    out: dict[PostgresShape, str] = {}
    two = (False, True)
    for terms_on in product(two, two, two, two):  # one flag per _PG_TERMS
        terms = []
        for n, name in enumerate(
            (t for t, on in zip(_PG_TERMS, terms_on, strict=True) if on), start=2
        ):
            terms.append(queries[f"list_by_{name}"].replace(f"${name}", f"${n}"))
        filters = " AND ".join(terms) or "true"
        for descending in two:
            sql = directed(queries["list"].replace("{filters}", filters), descending)
            out[(*terms_on, descending)] = sql
    return out


def postgres_args(query: JobQuery) -> list[object]:
    """The arguments of the query's shape: the limit, then the terms it sets."""
    values = (
        None if query.state is None else query.state.value,
        query.kind,
        query.queue,
        query.after,
    )
    return [query.limit, *(v for v in values if v is not None)]
