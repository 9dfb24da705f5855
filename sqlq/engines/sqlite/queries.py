"""The SQLite engine's named statements (queries.sql, loaded once as ``Q``) and the unit
a batch is written in (``Statement``): a leaf module, so that batch.py and schedules.py
share both without importing each other."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sqlq.common.engine.sql import load_queries
from sqlq.engines.rows import JOB_COLUMNS, TRANSITION_COLUMNS

_T = {f"{{t:{c}}}": f"t.column{i}" for i, c in enumerate(TRANSITION_COLUMNS, 1)}


def _filled(sql: str) -> str:
    """``{new_job_columns}``: the trigger's NEW row; ``{t:NAME}``: a VALUES table's column
    of a transition's ``NAME`` (SQLite names them column1, ...)."""
    sql = sql.replace("{new_job_columns}", ", ".join(f"NEW.{c}" for c in JOB_COLUMNS))
    return re.sub(r"\{t:\w+\}", lambda m: _T[m.group(0)], sql)


Q = {name: _filled(sql) for name, sql in load_queries("sqlq.engines.sqlite", "queries.sql").items()}


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement of a batch, built on the event loop's thread. ``expect``: the rows it
    must change, else a guard in its WHERE clause refused one (a schedule change: 1; a
    batch's moves: one each); None: it fails whole or applies whole (an INSERT)."""

    sql: str
    params: Any
    expect: int | None = None
