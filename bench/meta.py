"""What every result file says about where and how it was measured (after pyperf)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shlex
import subprocess
import sys
from typing import Any

PACKAGES = ("aiosqlite", "starlette", "uvicorn", "uvloop", "httptools", "msgspec", "matplotlib")


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


def versions() -> dict[str, str]:
    found: dict[str, str] = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    import sqlite3

    found["sqlite"] = sqlite3.sqlite_version
    return found


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
        "command": " ".join(shlex.quote(a) for a in sys.argv),
    }
