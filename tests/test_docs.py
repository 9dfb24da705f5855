"""The documentation: the site builds strict, and the README's links land.

``mkdocs build --strict`` fails on a broken link between pages, a page left out of the
navigation or a missing anchor (``mkdocs.yml``), so CI catches a link a move broke. The
README is read on GitHub, not built: its relative links are checked here, each to a file
or folder of the repository. The pages name repository files outside ``docs/`` by path
(the site holds ``docs/`` only), and those paths are checked here too, so a renamed
result or example cannot leave a page pointing at nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")
# A path a page names in code: results/..., examples/..., ARCHITECTURE.md (not a glob)
REPO_PATH = re.compile(r"`((?:results|examples)/[\w./-]+|ARCHITECTURE\.md)`")


def test_the_site_builds_strict(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)]
    env = {"NO_MKDOCS_2_WARNING": "1"}  # Material's notice about MkDocs 2, not ours
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, **env})  # fmt: skip
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert (tmp_path / "index.html").is_file()
    assert (tmp_path / "deploying" / "index.html").is_file()


def _relative_links(text: str) -> list[str]:
    """The links that point into the repository: no scheme, no bare anchor."""
    links = [m.group(1) for m in LINK.finditer(text)]
    return [u for u in links if not re.match(r"[a-z]+:", u) and not u.startswith("#")]


def test_every_relative_link_in_the_readme_resolves() -> None:
    links = _relative_links((ROOT / "README.md").read_text())
    assert links, "the README links to its docs pages"
    missing = [u for u in links if not (ROOT / u.split("#")[0]).exists()]
    assert missing == [], missing


def test_the_readme_links_every_docs_page() -> None:
    linked = {u.split("#")[0] for u in _relative_links((ROOT / "README.md").read_text())}
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md") if p.name != "index.md"}
    assert pages - linked == set()


@pytest.mark.parametrize("page", sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_the_repository_files_a_page_names_exist(page: str) -> None:
    text = (ROOT / "docs" / page).read_text()
    missing = [p for p in REPO_PATH.findall(text) if not (ROOT / p.rstrip("/")).exists()]
    assert missing == [], missing
