"""``repair``: keep a damaged log's valid prefix and move the rest aside.

Opening refuses a log with damage before its tail, because silently dropping
acknowledged history is worse than stopping. Repair is the operator's explicit
decision to go on from the last good record; the bytes after it are kept as
``<log>.broken-<n>``, never deleted.

Repair takes the data directory's lock, the one a server holds while it runs: cut
under a live writer, the log would lose the records the writer appends meanwhile,
acknowledged ones among them. A held lock is refused with its reason.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from sqlq.common.engine.datadir import DirLock
from sqlq.common.errors import StoreLockedError
from sqlq.walq import log, tail
from sqlq.walq.files import OS_FILES, FileOps
from sqlq.walq.store import LOCK_NAME, LOG_NAME


@dataclass(frozen=True, slots=True)
class RepairReport:
    path: str
    kept_bytes: int
    moved_bytes: int
    moved_to: str | None
    reason: str | None


def repair(data_dir: str | os.PathLike[str], fs: FileOps = OS_FILES) -> RepairReport:
    """Cut the log at its first bad record. A healthy log is left as it is.

    ``StoreLockedError`` while a server (or another repair) has the directory open.
    """
    directory = os.fspath(data_dir)
    path = os.path.join(directory, LOG_NAME)
    if not fs.exists(path):
        raise FileNotFoundError(errno.ENOENT, "no walq log", path)
    lock = DirLock(directory, LOCK_NAME)
    try:
        lock.acquire()
    except StoreLockedError as exc:
        raise StoreLockedError(
            f"refusing to repair: {exc}; stop the server that uses {directory} first"
        ) from None
    try:
        data = fs.read(path)
        sc = log.scan(data)
        if sc.bad_offset is None:
            return RepairReport(path, len(data), 0, None, None)
        moved_to = tail.cut_tail(fs, path, data, sc.bad_offset)
        return RepairReport(path, sc.bad_offset, len(data) - sc.bad_offset, moved_to, sc.bad_reason)
    finally:
        lock.release()
