"""``sqlq backup``: what a backup is, whatever the engine.

A backup is a data directory: ``OUT`` laid out as ``--data`` is (the engine's files in
``OUT/<engine>``), so ``sqlq serve --store X --data OUT`` restores it as it stands.
This module makes ``OUT`` (0700, as a data directory is made), refuses one that already
holds anything (a backup never mixes with other files, nor overwrites an older one),
and hands the engine's own copy (``walq.backup``, ``sqlq.engines.sqlite.backup``: each
knows how to copy its files while a server writes them) the two directories. If the
copy fails, what it wrote is removed: a half backup must not look like a backup.
It names no engine: the command line passes the copy in.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import TypeVar

from sqlq.common.engine.datadir import DIR_MODE, prepare_dir

T = TypeVar("T")


class OutNotEmpty(Exception):
    """``OUT`` exists and holds something; the message names it."""


def take(data_dir: str, out: str, subdir: str, copy: Callable[[str, str], T]) -> T:
    """Copy ``data_dir/subdir`` into a new ``out/subdir`` with ``copy(src, dst)``; its answer.
    ``OutNotEmpty`` if ``out`` holds anything; ``copy``'s errors, with ``out`` left as it
    was found (missing or empty)."""
    existed = os.path.lexists(out)
    if existed and (not os.path.isdir(out) or os.listdir(out)):
        raise OutNotEmpty(f"{out} exists and is not an empty directory")
    prepare_dir(out)  # 0700 (an empty one of ours tightened), refused if unsafe
    dst = os.path.join(out, subdir)
    try:
        os.mkdir(dst, DIR_MODE)
        return copy(os.path.join(data_dir, subdir), dst)
    except BaseException:
        shutil.rmtree(dst, ignore_errors=True)
        if not existed:
            shutil.rmtree(out, ignore_errors=True)
        raise
