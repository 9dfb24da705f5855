"""Engines by name: the one place the command line and benchmarks pick an engine."""

from __future__ import annotations

import os
from typing import Any

from common.engine.datadir import prepare_dir
from common.engine.memory import MemoryStore
from common.store import JobStore, SyncLevel
from sqlq.sqlite.store import SQLiteStore
from walq.store import WalStore

ENGINES = ("memory", "walq", "sqlite")
ALIASES = {"wal": "walq", "walq": "walq", "sqlite": "sqlite", "memory": "memory"}


def make_store(
    name: str, data_dir: str | os.PathLike[str], *, sync: SyncLevel = "full", **options: Any
) -> JobStore:
    engine = ALIASES.get(name)
    if engine in ("walq", "sqlite"):
        prepare_dir(os.fspath(data_dir))  # the top of --data is checked like the engine's own
    if engine == "memory":
        return MemoryStore(
            sync=sync, **{k: v for k, v in options.items() if k in ("retention", "clock")}
        )
    if engine == "walq":
        return WalStore(os.path.join(os.fspath(data_dir), "walq"), sync=sync, **options)
    if engine == "sqlite":
        return SQLiteStore(os.path.join(os.fspath(data_dir), "sqlite"), sync=sync, **options)
    raise ValueError(f"unknown store {name!r}; choose one of wal, walq, sqlite, memory")
