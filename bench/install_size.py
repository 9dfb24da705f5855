"""What a plain ``pip install sqlq`` (no extras) puts on disk, for one or more source trees.

For each project path: a fresh virtual environment in a temporary directory, ``pip install
PATH`` from this machine's configured package index, then the distributions installed
(``pip list``, less pip and setuptools, which the environment starts with; sqlq itself
counted) and the size of site-packages, less what it held before the install. Given the
trees before and after a change to the dependencies (``git worktree add --detach DIR REV``),
it shows what the change saves:

    python -m sqlq.bench.install_size /tmp/before /tmp/after --out results/install-size.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import stat
import subprocess
import sys
import tempfile
import venv
from pathlib import Path
from typing import Any

from sqlq.bench import meta

SEEDED = {"pip", "setuptools"}  # what a new environment holds before the install
MiB = 1 << 20


def tree_commit(path: Path) -> str:
    """The tree's HEAD, with "-dirty" if tracked files differ from it (results/ aside)."""
    try:
        head = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no",
             "--", ".", ":!results"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def tree_size(root: Path) -> int:
    """Bytes of the regular files under ``root`` (links not followed)."""
    total = 0
    for folder, _, files in os.walk(root):
        for name in files:
            st = os.lstat(os.path.join(folder, name))
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def site_packages(env: Path) -> Path:
    python = env / "bin" / "python"
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    return Path(out)


def measure(project: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sqlq-install-size-") as tmp:
        env = Path(tmp) / "venv"
        venv.create(env, with_pip=True)
        pip = [str(env / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
        site = site_packages(env)
        empty = tree_size(site)
        subprocess.run([*pip, "install", "-q", str(project)], check=True)
        listed = json.loads(
            subprocess.run(
                [*pip, "list", "--format", "json"], capture_output=True, text=True, check=True
            ).stdout
        )
        dists = sorted((d["name"], d["version"]) for d in listed if d["name"].lower() not in SEEDED)
        size = tree_size(site) - empty
    return {
        "path": str(project),
        "commit": tree_commit(project),
        "distributions": dists,
        "count": len(dists),
        "mib": size / MiB,
    }


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "# The base install's size (`python -m sqlq.bench.install_size`)",
        "",
        "Produced by the script; do not edit by hand. Each row: a fresh virtual environment, "
        "`pip install PATH` (no extras) from the machine's configured index, then the "
        "distributions `pip list` shows less pip and setuptools (sqlq itself counted) and "
        "the growth of site-packages.",
        "",
        f"- Python {platform.python_version()} ({platform.python_implementation()}) on "
        f"{platform.platform()}; CPU: {meta.cpu_model()}, {os.cpu_count()} cores",
        "",
        "| tree | commit | distributions | site-packages, MiB |",
        "|---|---|---:|---:|",
    ]
    lines += [f"| `{r['path']}` | {r['commit']} | {r['count']} | {r['mib']:.1f} |" for r in rows]
    first = {n: v for n, v in rows[0]["distributions"]}
    for r in rows[1:]:
        now = {n: v for n, v in r["distributions"]}
        gone = sorted(set(first) - set(now), key=str.lower)
        new = sorted(set(now) - set(first), key=str.lower)
        lines += [
            "",
            f"From `{rows[0]['path']}` to `{r['path']}`: "
            f"{r['count'] - rows[0]['count']:+d} distributions, "
            f"{r['mib'] - rows[0]['mib']:+.1f} MiB.",
            "",
            f"- no longer installed: {', '.join(gone) or 'none'}",
            f"- newly installed: {', '.join(new) or 'none'}",
        ]
    for r in rows:
        names = ", ".join(f"{n} {v}" for n, v in r["distributions"])
        lines += ["", f"`{r['path']}` ({r['commit']}) installs: {names}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("paths", nargs="+", type=Path, help="source trees to install, in order")
    ap.add_argument("--out", type=Path, help="write the markdown here (results/install-size.md)")
    a = ap.parse_args(argv)
    rows = [measure(p.resolve()) for p in a.paths]
    text = render(rows)
    sys.stdout.write(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)


if __name__ == "__main__":
    main()
