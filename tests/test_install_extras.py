"""Install what is used (issue 34, item 9): the base install is the server and the single-node
engines; the PostgreSQL driver is the ``postgres`` extra, which the test and benchmark extras
pull, and ``--store postgres`` without it is one line naming that extra.

The metadata is the installed one: after editing pyproject.toml, ``pip install -e '.[dev]'``.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from sqlq.cli import brings
from sqlq.engines import registry
from tests.helpers import ROOT, without_module


def requirements() -> list[Requirement]:
    return [Requirement(r) for r in importlib.metadata.requires("sqlq") or []]


def pulls(extra: str) -> set[str]:
    """The distributions ``sqlq[extra]`` adds, through the extras it names in turn: the
    CLI's own walk (``sqlq.cli.brings``), which names the extra a command lacks."""
    return {canonicalize_name(n) for n in brings(extra)}


def test_the_base_install_has_no_driver_and_no_uvicorn_standard() -> None:
    base = [r for r in requirements() if r.marker is None or "extra" not in str(r.marker)]
    names = {canonicalize_name(r.name) for r in base}
    assert {"uvicorn", "uvloop", "httptools"} <= names  # what sqlq runs on, named
    assert names.isdisjoint({"asyncpg", "websockets", "watchfiles", "python-dotenv", "pyyaml"})
    (uvicorn,) = (r for r in base if canonicalize_name(r.name) == "uvicorn")
    assert uvicorn.extras == set()


@pytest.mark.parametrize("extra", ["postgres", "bench", "test", "dev", "peers"])
def test_the_extras_that_run_postgres_pull_asyncpg(extra: str) -> None:
    # .ci/run and the README's test command install [dev]; the benchmark imports asyncpg
    assert "asyncpg" in pulls(extra)


def test_what_the_registry_repeats_matches_the_engines() -> None:
    from sqlq.engines.postgres.connections import DEADLINE_S

    assert registry.DB_DEADLINE_S == DEADLINE_S
    for e in registry.ENGINES.values():
        assert (inspect.getattr_static(e.build, "shared", False) is True) is e.shared, e.name


@pytest.fixture
def no_asyncpg(tmp_path: Path) -> dict[str, str]:
    """An environment in which ``import asyncpg`` fails, as on an install without the extra."""
    return without_module(tmp_path, "asyncpg")


def run(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_serve_postgres_without_asyncpg_is_one_line_naming_the_extra(
    no_asyncpg: dict[str, str], tmp_path: Path
) -> None:
    done = run(
        no_asyncpg, tmp_path, "-m", "sqlq", "serve", "--store", "postgres",
        "--dsn", "postgresql://sqlq@127.0.0.1:1/sqlq", "--port", "0",
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert "--store postgres needs asyncpg" in line
    assert "pip install 'sqlq[postgres]'" in line


def test_the_other_engines_need_no_asyncpg(no_asyncpg: dict[str, str], tmp_path: Path) -> None:
    code = (
        "import sqlq.cli\n"
        "from sqlq.engines.registry import NAMES, make_store\n"
        "import sys\n"
        "for name in NAMES:\n"
        "    make_store(name, sys.argv[1])\n"
        "assert sys.modules.get('asyncpg') is None\n"
    )
    done = run(no_asyncpg, ROOT, "-c", code, str(tmp_path / "data"))
    assert done.returncode == 0, done.stderr


def test_migrate_and_the_bench_commands_without_asyncpg_say_what_to_install(
    no_asyncpg: dict[str, str], tmp_path: Path
) -> None:
    """``sqlq migrate`` names the postgres extra; a command that another extra brings
    (``sqlq bench``, whose modules import asyncpg) names that extra: one line, no
    traceback."""
    migrate = run(no_asyncpg, tmp_path, "-m", "sqlq", "migrate", "--dsn", "postgresql://x/y")
    assert migrate.returncode == 2, migrate.stderr
    assert "sqlq[postgres]" in migrate.stderr
    bench = run(no_asyncpg, tmp_path, "-m", "sqlq", "bench", "--help")
    assert bench.returncode == 1, bench.stderr
    assert "pip install 'sqlq[bench]'" in bench.stderr
    assert "Traceback" not in migrate.stderr + bench.stderr
