"""sqlq: the SQLite engine and the command line that wires engines into the runtime."""

from sqlq.store import SQLiteStore

__all__ = ["SQLiteStore"]
