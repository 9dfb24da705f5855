"""The layering, read from the code: every import statement, anywhere in a module.

The kernel (``common``) is what the engines and the server share, so it can't
know about either, nor about a web framework; only the engine registry (and the
CLI's repair and migrate commands) names an engine; the dashboard sits on the
runtime, never under it; and the product never needs the benchmarks. A module
that breaks one of these fails here with the edge that did it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import ROOT

# The repository's folders and the names they install under (sqlq/common, sqlq/walq
# and sqlq/bench are links to the first three).
FOLDERS = {"common": "sqlq.common", "walq": "sqlq.walq", "bench": "sqlq.bench", "sqlq": "sqlq"}
LINKS = {"common", "walq", "bench"}  # inside sqlq/: links, walked as their own folder

ENGINES = ("sqlq.walq", "sqlq.engines.sqlite", "sqlq.engines.postgres", "sqlq.common.engine.memory")
# the registry, the CLI's repair and migrate commands, and the benchmarks (which measure
# engines directly); an engine may import itself, never another
MAY_NAME_AN_ENGINE = ("sqlq.engines.registry", "sqlq.bench", "sqlq.cli")
# what serves or speaks HTTP: the kernel takes plain values (a query is a Mapping), so a
# worker, an engine or another front end can use it without any of these
WEB = ("starlette", "uvicorn", "httpx", "h11", "httptools", "jinja2")


def modules() -> Iterator[tuple[str, Path]]:
    for folder, name in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder)
            if folder == "sqlq" and rel.parts[0] in LINKS:
                continue
            parts = [name, *rel.with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            yield ".".join(parts), path


def imports(module: str, path: Path) -> Iterator[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base]) if base else ".".join(up)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


EDGES = [(module, target) for module, path in modules() for target in imports(module, path)]


def within(name: str, *prefixes: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def broken(rule: str) -> list[str]:
    return [f"{m} -> {t}" for m, t in EDGES if RULES[rule](m, t)]


RULES = {
    # one identity per module: `common.models` and `sqlq.common.models` would be two
    "only the installed names are imported": lambda m, t: within(t, "common", "walq", "bench"),
    "common imports nothing of walq, sqlq or bench": lambda m, t: (
        within(m, "sqlq.common") and within(t, "sqlq") and not within(t, "sqlq.common")
    ),
    "common imports no web framework": lambda m, t: within(m, "sqlq.common") and within(t, *WEB),
    "only sqlq.engines (and the CLI wiring) imports an engine": lambda m, t: (
        within(t, *ENGINES)
        and not within(m, *MAY_NAME_AN_ENGINE)
        and not within(m, *(e for e in ENGINES if within(t, e)))
    ),
    "ui depends on runtime and the kernel": lambda m, t: (
        within(m, "sqlq.ui") and within(t, "sqlq.http", "sqlq.engines", "sqlq.serve", "sqlq.cli")
    ),
    "runtime never imports ui, http or an engine's wiring": lambda m, t: (
        within(m, "sqlq.runtime") and within(t, "sqlq.ui", "sqlq.http", "sqlq.engines")
    ),
    "sqlq never imports bench": lambda m, t: (
        within(m, "sqlq") and not within(m, "sqlq.bench") and within(t, "sqlq.bench")
    ),
}


def test_the_walk_sees_the_whole_tree() -> None:
    names = {m for m, _ in modules()}
    assert {"sqlq.common.models", "sqlq.walq.store", "sqlq.runtime.service", "sqlq.ui.app"} <= names
    assert {"sqlq.engines.registry", "sqlq.engines.postgres.store", "sqlq.bench.cli"} <= names
    assert ("sqlq.engines.registry", "sqlq.walq.store") in EDGES or any(
        m == "sqlq.engines.registry" and within(t, "sqlq.walq") for m, t in EDGES
    )


@pytest.mark.parametrize("rule", list(RULES))
def test_the_layers_hold(rule: str) -> None:
    assert broken(rule) == []


def test_each_rule_can_fail() -> None:
    """Every rule names at least one edge that would break it, so none is vacuous."""
    bad = {
        "only the installed names are imported": ("sqlq.runtime.service", "common.models"),
        "common imports nothing of walq, sqlq or bench": ("sqlq.common.store", "sqlq.runtime"),
        "common imports no web framework": ("sqlq.common.query", "starlette.datastructures"),
        "only sqlq.engines (and the CLI wiring) imports an engine": (
            "sqlq.engines.postgres.store",  # one engine reaching into another (issue 20)
            "sqlq.engines.sqlite.sql",
        ),
        "ui depends on runtime and the kernel": ("sqlq.ui.app", "sqlq.http.app"),
        "runtime never imports ui, http or an engine's wiring": ("sqlq.runtime.x", "sqlq.ui"),
        "sqlq never imports bench": ("sqlq.serve", "sqlq.bench.cli"),
    }
    assert set(bad) == set(RULES)
    for rule, (module, target) in bad.items():
        assert RULES[rule](module, target), rule
