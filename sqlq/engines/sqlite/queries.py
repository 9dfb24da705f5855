"""The SQLite engine's named statements (queries.sql, loaded once as ``Q``) and the unit
a batch is written in (``Statement``): a leaf module, so that batch.py and schedules.py
share both without importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlq.common.engine.sql import load_queries
from sqlq.engines.rows import JOB_COLUMNS

Q = {
    name: sql.replace("{new_job_columns}", ", ".join(f"NEW.{c}" for c in JOB_COLUMNS))
    for name, sql in load_queries("sqlq.engines.sqlite", "queries.sql").items()
}


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement of a batch, built on the event loop's thread. ``guarded``: a schedule
    change whose guard is its WHERE clause, so it applied only if it changed one row."""

    sql: str
    params: Any
    guarded: bool = False
