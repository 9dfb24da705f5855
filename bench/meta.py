"""What every result file says about where and how it was measured (after pyperf).

The packages are read from the code that ran, never kept by hand: a hand-kept list went on
naming aiosqlite while the SQLite engine ran on plain sqlite3 (6a00aba until 29469ed), and
then had to be put back. ``imported`` follows ``import`` statements (lazy ones in
functions too) from a module of sqlq through sqlq's own modules, and names the installed
distributions of what it reaches outside sqlq and the standard library: from ``sqlq.cli``
for what ``sqlq serve`` runs on, and from each engine's store class for that engine.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

SERVER = "sqlq.cli"  # the ``sqlq`` command, ``sqlq serve`` among its commands
BENCH_PACKAGES = ("matplotlib", "tqdm", "huey", "pgqueuer", "procrastinate")  # bench and peers
# A distribution that one of sqlq's imports loads in turn, which no import statement names:
# uvicorn's httptools protocol, which ``sqlq.http.head`` subclasses, runs on httptools.
THROUGH = {"uvicorn.protocols.http.httptools_impl": "httptools"}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def git_commit() -> str:
    """HEAD, with "-dirty" if tracked code differs from it.

    Changes under results/ do not count: a suite writing its own output there
    (or a crashcheck run before it) would otherwise mark every later line dirty.
    """
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!results"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return out + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def disk_of(path: str) -> str:
    try:
        out = subprocess.run(
            ["df", "-T", path], capture_output=True, text=True, check=True
        ).stdout.splitlines()[-1]
        fields = out.split()
        return f"{fields[0]} ({fields[1]})"
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown"


def _source(module: str) -> Path | None:
    """The file of one of sqlq's modules (``sqlq.a.b``), or None if it is not a module."""
    import sqlq

    path = Path(sqlq.__file__).parent.joinpath(*module.split(".")[1:])
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _imported_names(module: str) -> Iterable[str]:
    """Every dotted name an import statement of ``module`` names (``from a import b``: a and
    a.b, since b may be a module), anywhere in the file."""
    path = _source(module)
    if path is None:
        return
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{a.name}" for a in node.names)


@cache
def imported(start: str) -> tuple[str, ...]:
    """The distributions (sorted, by their installed names) that ``start`` reaches."""
    dists = importlib.metadata.packages_distributions()
    seen: set[str] = set()
    found: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for name in _imported_names(module):
            top = name.split(".", 1)[0]
            if top == "sqlq":
                todo.append(name)
            elif top not in sys.stdlib_module_names:
                found.update(dists.get(top, ()))
                if name in THROUGH:
                    found.add(THROUGH[name])
    return tuple(sorted(found, key=str.lower))


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str]:
    """What ``sqlq serve`` imports, each with its version, and the SQLite library's."""
    found = {name: v for name in imported(SERVER) if (v := _version(name)) is not None}
    import sqlite3

    found["sqlite"] = sqlite3.sqlite_version
    return found


def engine_packages() -> dict[str, list[str]]:
    """Each engine's third-party imports, from its store class's module."""
    from sqlq.engines.registry import ENGINES

    return {name: list(imported(e.build.__module__)) for name, e in ENGINES.items()}


def bench_packages() -> dict[str, str]:
    """The benchmark's own and the peers' packages that are installed."""
    return {name: v for name in BENCH_PACKAGES if (v := _version(name)) is not None}


def collect(data_path: str = ".") -> dict[str, Any]:
    return {
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "disk": disk_of(data_path),
        "packages": versions(),
        "engines": engine_packages(),
        "bench_packages": bench_packages(),
        "command": " ".join(shlex.quote(a) for a in sys.argv),
    }
