"""The development commands (docs/internals.md) pass on this checkout, exactly as written there.

``ruff check .``, ``ruff format --check .`` and ``mypy`` (strict, over ``sqlq`` and
``tests``) after ``pip install -e '.[dev]'``: the tools are in ``[dev]``, so on a
fresh clone the README's test command runs them too, and a lint or type error fails
CI like any other test.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.slow  # mypy over the whole tree takes a minute or two here

COMMANDS = {
    "ruff check .": ["ruff", "check", "."],
    "ruff format --check .": ["ruff", "format", "--check", "."],
    "mypy": ["mypy"],
}


def test_the_docs_name_these_commands() -> None:
    page = (ROOT / "docs" / "internals.md").read_text()
    assert "ruff check . && ruff format --check . && mypy" in page


@pytest.mark.parametrize("name", list(COMMANDS))
def test_the_development_command_passes(name: str) -> None:
    argv = [sys.executable, "-m", *COMMANDS[name]]
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{name} failed:\n{r.stdout[-4000:]}\n{r.stderr[-2000:]}"
