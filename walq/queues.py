"""walq's paused queues: one small JSON file, replaced atomically.

Pausing is rare and its state is tiny, so it lives beside the log rather than
in it: the log's format and compaction stay as they are. The file is written
to a temporary name, synced, renamed over the old one and the directory synced,
so a crash leaves the old state or the new one, never a torn file.
"""

from __future__ import annotations

import os

import msgspec

from sqlq.walq.files import FileOps

QUEUES_NAME = "queues.json"


class QueueFile(msgspec.Struct):
    paused: list[str] = msgspec.field(default_factory=list)


def read_paused(fs: FileOps, path: str) -> list[str]:
    if not fs.exists(path):
        return []
    return sorted(msgspec.json.decode(fs.read(path), type=QueueFile).paused)


def write_paused(fs: FileOps, path: str, paused: list[str]) -> None:
    """Replace the file with ``paused``; durable on return. Runs on the I/O thread."""
    tmp = path + ".tmp"
    if fs.exists(tmp):
        fs.remove(tmp)
    fd = fs.open_new(tmp)
    try:
        fs.write(fd, msgspec.json.encode(QueueFile(sorted(paused))))
        fs.fdatasync(fd)
    finally:
        fs.close(fd)
    fs.replace(tmp, path)
    fs.fsync_dir(os.path.dirname(path) or ".")
