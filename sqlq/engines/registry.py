"""Engines by name: the one place that knows each engine's name, aliases, directory and options.

The command line, the benchmarks and the tests pick an engine here. Each
engine declares what it takes beyond what every engine takes (``sync``,
``retention``, ``clock``), so a new engine is one entry in ``ENGINES``.

An engine whose driver is an extra (postgres: asyncpg, ``sqlq[postgres]``) is imported
here only when it is first asked for, so the others run on an install without it, and
asking for it there is one line naming the extra (``MissingExtra``), not a traceback.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import click

from sqlq.common.engine.datadir import prepare_dir
from sqlq.common.engine.memory import MemoryStore
from sqlq.common.store import JobStore, SyncLevel
from sqlq.engines.sqlite import SQLiteStore
from sqlq.walq.store import COMPACT_FLOOR_BYTES, COMPACT_RATIO, WalStore

MiB = 1 << 20
DURABLE_OPTIONS = ("group_commit", "sync_delay_s")
# walq's compaction thresholds as ``sqlq serve`` shows them (the defaults live in walq)
COMPACT_FLOOR_MB = COMPACT_FLOOR_BYTES / MiB
DEFAULT_COMPACT_RATIO = COMPACT_RATIO
# The postgres engine's deadline of each database call (``connections.DEADLINE_S``, here
# without importing asyncpg; tests/test_install_extras.py holds the two equal).
DB_DEADLINE_S = 2.0


class MissingExtra(click.ClickException, ImportError):
    """An engine whose driver is not installed: one line naming the extra, exit code 2 (a
    command's ``--store`` that this install cannot serve). An ``ImportError`` too, for code
    that asks for the engine without the command line."""

    exit_code = 2


def _postgres() -> Callable[..., JobStore]:
    try:
        from sqlq.engines.postgres.store import PostgresStore
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] != "asyncpg":
            raise
        raise MissingExtra("--store postgres needs asyncpg: pip install 'sqlq[postgres]'") from None
    return PostgresStore


@dataclass(frozen=True)
class Engine:
    name: str
    # The store's class (imported on first use: ``build``), which declares what it is.
    load: Callable[[], Callable[..., JobStore]]
    durable: bool
    # Many nodes share its queue (a database): it needs a dsn, not --data. The store's class
    # declares it (``JobStore.shared``, which the runtime reads); repeated here so listing the
    # engines imports none (tests/test_install_extras.py holds the two equal).
    shared: bool = False
    subdir: str | None = None  # where under --data its files live; None: it keeps none
    aliases: tuple[str, ...] = ()
    options: tuple[str, ...] = ()  # constructor options beyond sync, retention and clock
    # From the serve settings (a plain mapping) to this engine's own options.
    from_settings: Callable[[Mapping[str, Any]], dict[str, Any]] = field(default=lambda _: {})

    @property
    def build(self) -> Callable[..., JobStore]:
        """The store's class; ``MissingExtra`` if its driver is not installed."""
        return self.load()


ENGINES: dict[str, Engine] = {
    e.name: e
    for e in (
        Engine("memory", lambda: MemoryStore, durable=False),
        Engine(
            "walq",
            lambda: WalStore,
            durable=True,
            subdir="walq",
            aliases=("wal",),
            options=(*DURABLE_OPTIONS, "fs", "compact_floor_bytes", "compact_ratio"),
            from_settings=lambda s: {
                "compact_floor_bytes": int(s["compact_floor_mb"] * MiB),
                "compact_ratio": s["compact_ratio"],
            },
        ),
        Engine(
            "sqlite", lambda: SQLiteStore, durable=True, subdir="sqlite", options=DURABLE_OPTIONS
        ),
        Engine(
            "postgres",
            functools.cache(_postgres),
            durable=True,
            shared=True,
            aliases=("pg",),
            options=("dsn", "group_commit", "pool_size", "node", "deadline_s"),
            from_settings=lambda s: {"deadline_s": s["db_timeout"]},
        ),
    )
}
ALL = tuple(ENGINES)  # every engine: the contract suite runs over these
NAMES = tuple(n for n, e in ENGINES.items() if not e.shared)  # single-node: memory, walq, sqlite
DURABLE = tuple(n for n in NAMES if ENGINES[n].durable)  # single-node and durable
SHARED = tuple(n for n, e in ENGINES.items() if e.shared)
_BY_NAME = {alias: e for e in ENGINES.values() for alias in (e.name, *e.aliases)}
CHOICES = tuple(_BY_NAME)  # what --store accepts
DURABLE_CHOICES = tuple(a for a, e in _BY_NAME.items() if e.durable)


def engine(name: str) -> Engine:
    """The engine called ``name`` or one of its aliases (``wal`` is ``walq``), its store's
    class imported: an engine whose driver is not installed is ``MissingExtra`` here, where a
    command first names it (``sqlq serve``, ``sqlq crashcheck``)."""
    try:
        e = _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown store {name!r}; choose one of {', '.join(CHOICES)}") from None
    e.load()
    return e


def make_store(
    name: str, data_dir: str | os.PathLike[str], *, sync: SyncLevel = "full", **options: Any
) -> JobStore:
    """An engine on ``data_dir`` (a shared engine on ``dsn=`` instead); options it does not
    take (a durable knob for memory) are dropped, so one call site can serve every engine."""
    e = engine(name)
    allowed = {"retention", "clock", *e.options}
    kwargs = {k: v for k, v in options.items() if k in allowed}
    if e.shared:
        dsn = kwargs.pop("dsn", None)
        if not dsn:
            raise ValueError(f"the {e.name} store needs a database: give --dsn or SQLQ_DSN")
        return e.build(dsn, sync=sync, **kwargs)
    if e.subdir is None:
        return e.build(sync=sync, **kwargs)
    prepare_dir(os.fspath(data_dir))  # the top of --data is checked like the engine's own
    return e.build(os.path.join(os.fspath(data_dir), e.subdir), sync=sync, **kwargs)
