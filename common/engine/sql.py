"""Load named SQL from an engine package's ``.sql`` files (``-- name: <name>`` blocks).

A block may be used inside the others as ``{name}`` (the jobs column list is
written once this way); ``{rows}`` is left for ``batch_sql``.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources


def load_queries(package: str, filename: str) -> dict[str, str]:
    text = resources.files(package).joinpath(filename).read_text(encoding="utf-8")
    queries: dict[str, str] = {}
    name: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        if line.startswith("-- name:"):
            if name is not None:
                queries[name] = "\n".join(body).strip()
            name = line.removeprefix("-- name:").strip()
            if name in queries:  # a second block would silently replace the first
                raise ValueError(f"{filename}: two blocks are named {name!r}")
            body = []
        elif name is not None and not line.startswith("--"):
            body.append(line)
    if name is not None:
        queries[name] = "\n".join(body).strip()
    for part, text in list(queries.items()):
        marker = "{" + part + "}"
        for other, sql in queries.items():
            if marker in sql:
                queries[other] = sql.replace(marker, text)
    return queries


def load_script(package: str, filename: str) -> str:
    return resources.files(package).joinpath(filename).read_text(encoding="utf-8")


@lru_cache(maxsize=1024)
def batch_sql(template: str, rows: int, width: int) -> str:
    """``template`` with ``{rows}`` replaced by ``rows`` groups of ``width`` placeholders."""
    group = "(" + ", ".join(["?"] * width) + ")"
    return template.replace("{rows}", ", ".join([group] * rows))
