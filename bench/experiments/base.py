"""What the experiments share: the run protocol, a load run, and the off-then-on pattern.

A run is anything with ``experiment``, ``store``, ``label``, ``params`` and
``execute() -> dict``. Load runs share ``LoadRun``; the crash (E), recovery (G),
latency (H) and ceiling runs have their own procedures in their modules.
"""

from __future__ import annotations

import asyncio
import compileall
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from sqlq.bench.client.loadgen import run
from sqlq.bench.client.server import ServerProcess
from sqlq.bench.experiments.rows import LoadRow, Row
from sqlq.bench.report import Report, cell, group
from sqlq.engines.registry import ALL, DURABLE, NAMES

__all__ = [
    "DURABLE", "NAMES", "BenchRun", "LoadRun", "Run", "by_store", "off_on_table", "off_then_on",
]  # fmt: skip


def compiled() -> None:
    """sqlq's bytecode written beside its sources, as pip writes it at an install: a
    machine that sets ``PYTHONDONTWRITEBYTECODE`` (this one does) would have every server
    and worker start compile sqlq from source, ~0.1 s of each start that no deployment
    pays. Its linked packages (``common``, ``walq``, ``bench``) too: ``compile_dir`` does
    not follow a link."""
    import sqlq

    root = Path(sqlq.__file__).parent
    for package in (root, *(p for p in root.iterdir() if p.is_symlink() and p.is_dir())):
        compileall.compile_dir(str(package), quiet=1)


class BenchRun(Protocol):
    @property
    def experiment(self) -> str: ...
    @property
    def store(self) -> str: ...
    @property
    def label(self) -> str: ...
    @property
    def params(self) -> dict[str, Any]: ...

    def execute(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=Row)


def by_store(rows: list[R]) -> dict[str, list[R]]:
    """``rows`` by their engine (``store``), the engines in the one order every table
    shows them (``ALL``)."""
    out = group(rows, lambda r: r.store)
    return {store: out[store] for store in sorted(out, key=ALL.index)}


@dataclass(frozen=True, kw_only=True)
class Run:
    """The fields every ``BenchRun`` has: where its row goes, and what it is called."""

    experiment: str
    store: str
    label: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ServedRun(Run):
    """A run that measures over HTTP against a fresh ``sqlq serve`` on its engine (16
    workers, ``--sync full``): its ``measure`` is given the server's URL."""

    def execute(self) -> dict[str, Any]:
        with ServerProcess.engine(store=self.store, sync="full", workers=16) as srv:
            return asyncio.run(self.measure(srv.url))

    async def measure(self, url: str) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class LoadRun(Run):
    """A fresh server, one load from ``sqlq loadgen``'s engine, then stop."""

    sync: str = "full"
    workers: int = 16
    jobs: int = 2000
    work_ms: int = 20
    fail_prob: float = 0.0
    hang_prob: float = 0.0
    kind: str = "sleep"
    rounds: int = 500_000
    concurrency: int = 32
    batch: int = 1
    rate: float = 0.0
    flags: tuple[str, ...] = ()
    drain_timeout: float = 120.0

    def server(self, extra: tuple[str, ...] = ()) -> ServerProcess:
        """This run's fresh server (its flags, then ``extra``)."""
        return ServerProcess.engine(
            store=self.store, sync=self.sync, workers=self.workers, flags=self.flags + extra
        )

    def config(self, extra: tuple[str, ...] = ()) -> dict[str, Any]:
        """What the row records of how the run was made."""
        return {
            "workers": self.workers,
            "sync": self.sync,
            "jobs": self.jobs,
            "work_ms": self.work_ms,
            "kind": self.kind,
            "rounds": self.rounds,
            "concurrency": self.concurrency,
            "batch": self.batch,
            "rate": self.rate,
            "flags": [*self.flags, *extra],
        }

    def execute(self) -> dict[str, Any]:
        with self.server() as srv:
            result = run(
                srv.url,
                jobs=self.jobs,
                kind=self.kind,
                work_ms=self.work_ms,
                fail_prob=self.fail_prob,
                hang_prob=self.hang_prob,
                rounds=self.rounds,
                concurrency=self.concurrency,
                batch=self.batch,
                rate=self.rate,
                label=self.label,
                drain_timeout=self.drain_timeout,
            )
            result["ready_s"] = round(srv.ready_s, 4)
        result["config"] = self.config()
        return result


def off_then_on(
    experiment: str, word: str, param: str, off_flag: str, stores: tuple[str, ...],
    *, flags: tuple[str, ...] = (), off_drain: float = 120.0, **load: Any,
) -> Iterator[BenchRun]:  # fmt: skip
    """Each store with a feature off (``off_flag``), then each with it on (B, C)."""
    for on in (False, True):
        for store in stores:
            yield LoadRun(
                experiment=experiment,
                store=store,
                label=f"{experiment}/{store}/{word}-{'on' if on else 'off'}",
                flags=flags + (() if on else (off_flag,)),
                drain_timeout=120.0 if on else off_drain,
                params={param: on},
                **load,
            )


def off_on_table(
    rep: Report, rows: list[LoadRow], param: str, columns: list[tuple[str, str]]
) -> None:
    """Table rows for a feature off vs on (B, C): store, on/off, then ``columns``."""
    g = group(rows, lambda r: (r.store, bool(r.params[param])))
    for (s, on), rs in sorted(g.items(), key=lambda kv: (NAMES.index(kv[0][0]), kv[0][1])):
        cells = [cell([getattr(r, key) for r in rs], fmt) for key, fmt in columns]
        rep.add(f"| {s} | {'on' if on else 'off'} | " + " | ".join(cells) + " |")
