"""``repair``: keep a damaged log's valid prefix and move the rest aside.

Opening refuses a log with damage before its tail, because silently dropping
acknowledged history is worse than stopping. Repair is the operator's explicit
decision to go on from the last good record; the bytes after it are kept as
``<log>.broken-<n>``, never deleted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from walq import log
from walq.files import OS_FILES, FileOps
from walq.store import LOG_NAME


@dataclass(frozen=True, slots=True)
class RepairReport:
    path: str
    kept_bytes: int
    moved_bytes: int
    moved_to: str | None
    reason: str | None


def repair(data_dir: str | os.PathLike[str], fs: FileOps = OS_FILES) -> RepairReport:
    """Cut the log at its first bad record. A healthy log is left as it is.

    Must not run while a server has the directory open.
    """
    path = os.path.join(os.fspath(data_dir), LOG_NAME)
    data = fs.read(path)
    sc = log.scan(data)
    if sc.bad_offset is None:
        return RepairReport(path, len(data), 0, None, None)
    moved_to = log.cut_tail(fs, path, data, sc.bad_offset)
    return RepairReport(path, sc.bad_offset, len(data) - sc.bad_offset, moved_to, sc.bad_reason)
