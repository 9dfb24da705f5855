"""walq's queues: which are paused and their policies, one small JSON file, replaced
atomically.

Pausing and a policy are rare and their state is tiny, so they live beside the log
rather than in it: the log's format and compaction stay as they are. The file is written
to a temporary name, synced, renamed over the old one and the directory synced, so a
crash leaves the old state or the new one, never a torn file. A policy is kept as the
JSON it was encoded to, decoded at recovery by ``sqlq.common.fair.stored_policies``
(which leaves out, logged, one that no longer decodes: it never fails the open).
"""

from __future__ import annotations

import os
from typing import Any

import msgspec

from sqlq.walq.files import FileOps

QUEUES_NAME = "queues.json"


class QueueFile(msgspec.Struct, omit_defaults=True):
    paused: list[str] = msgspec.field(default_factory=list)
    policies: dict[str, Any] = msgspec.field(default_factory=dict)  # queue -> policy JSON


def read_queues(fs: FileOps, path: str) -> QueueFile:
    if not fs.exists(path):
        return QueueFile()
    return msgspec.json.decode(fs.read(path), type=QueueFile)


def write_queues(fs: FileOps, path: str, queues: QueueFile) -> None:
    """Replace the file with ``queues``; durable on return. Runs on the I/O thread."""
    tmp = path + ".tmp"
    if fs.exists(tmp):
        fs.remove(tmp)
    fd = fs.open_new(tmp)
    try:
        fs.write(fd, msgspec.json.encode(queues))
        fs.fdatasync(fd)
    finally:
        fs.close(fd)
    fs.replace(tmp, path)
    fs.fsync_dir(os.path.dirname(path) or ".")
