"""The SQLite engine: one table in WAL mode; its SQL lives in the .sql files beside it."""

from sqlq.engines.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore"]
