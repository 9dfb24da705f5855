"""Cutting a torn or damaged tail off a log, for recovery and ``sqlq repair``: the cut
bytes are kept beside the log as ``<log>.broken-<n>``, never deleted."""

from __future__ import annotations

import logging
import os

from sqlq.walq.files import FileOps, write_new

logger = logging.getLogger(__name__)


def broken_path(fs: FileOps, log_path: str) -> str:
    n = 1
    while fs.exists(f"{log_path}.broken-{n}"):
        n += 1
    return f"{log_path}.broken-{n}"


def cut_tail(fs: FileOps, log_path: str, data: bytes, offset: int) -> str:
    """Keep ``data[offset:]`` as ``<log>.broken-<n>``, then truncate the log at ``offset``.

    The aside copy is synced before the truncation, so the cut bytes are never
    only in memory.
    """
    aside = broken_path(fs, log_path)
    write_new(fs, aside, data[offset:])
    fs.fsync_dir(os.path.dirname(log_path) or ".")
    fd = fs.open_append(log_path)
    try:
        fs.truncate(fd, offset)
        fs.fdatasync(fd)
    finally:
        fs.close(fd)
    return aside


def cut_torn(fs: FileOps, log_path: str, data: bytes, offset: int, reason: str | None) -> str:
    """Recovery's cut of a torn tail (``cut_tail``), logged; returns the note for /stats and
    the dashboard, which names the kept copy by its base name (the log has the path)."""
    kept_as = cut_tail(fs, log_path, data, offset)
    note = f"torn tail of {len(data) - offset} bytes at offset {offset} ({reason}); kept as "
    logger.warning("walq: %s%s", note, kept_as)
    return note + os.path.basename(kept_as)
