"""A consistent copy of a walq directory, taken while a server appends and compacts.

The log is one file, and a compaction never changes it in place: it writes a new
file (the snapshot, then the records appended meanwhile) and renames it over the old
one between two batches (``walq.compact``). So a descriptor opened on the log names
one inode for as long as it is open, and that inode only ever grows:

- opened before a compaction's rename, it is the old log, which held every record the
  server had acknowledged by then, and it is complete up to the rename (the writer
  appends to the new file only after it);
- opened after it, it is the new log, which holds the snapshot and everything carried
  over, so again every acknowledged record.

Either way, what is read from that descriptor is a prefix of one log's history that
holds everything acknowledged before the copy began: nothing needs to notice a
compaction and start again. The prefix may end inside a record the server was still
writing; ``log.scan`` finds where the valid prefix ends, and only that is copied, so
the copy opens without a torn tail to cut (recovery would cut one anyway: the test
holds it to that too). Damage before the end (a whole record after a bad one) is
refused, as opening the log would refuse it.

It holds the log in memory, as recovery does (``walq.store``), once unless its tail is
torn: a backup costs about what a restart costs.

The paused queues and the signing key are small files replaced atomically, read
whole. Every file is written 0600 (``files.open_new``), synced, and the directory
synced, before this returns.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sqlq.common.errors import CorruptLogError
from sqlq.walq import log
from sqlq.walq.files import OS_FILES, FileOps, write_new
from sqlq.walq.queues import QUEUES_NAME
from sqlq.walq.signing import KEY_NAME
from sqlq.walq.store import LOG_NAME

SIDE_FILES = (QUEUES_NAME, KEY_NAME)  # beside the log, copied when present


@dataclass(frozen=True, slots=True)
class Copied:
    """What a backup holds: the log's bytes and records, and which other files."""

    log_bytes: int
    records: int
    files: tuple[str, ...]


def copy_store(src: str, dst: str, fs: FileOps = OS_FILES) -> Copied:
    """Copy the walq directory ``src`` (a server may be running on it) into ``dst``, a new
    empty directory. ``FileNotFoundError`` if ``src`` holds no log; ``CorruptLogError`` if
    the log is damaged before its end; ``OSError`` otherwise."""
    src_log = os.path.join(src, LOG_NAME)
    data = fs.read(src_log)  # one open, then read to its end: one inode (the docstring)
    found = log.scan(data, lambda _offset, _snap, _record: None)  # checked, not kept
    if found.corrupt and found.bad_offset is not None:
        raise CorruptLogError(src_log, found.bad_offset, found.bad_reason or "bad record")
    files = []
    for name in SIDE_FILES:  # after the log: nothing in them depends on its records
        try:
            side = fs.read(os.path.join(src, name))
        except FileNotFoundError:
            continue
        write_new(fs, os.path.join(dst, name), side)
        files.append(name)
    whole = found.valid_end == len(data)  # (a torn tail is the only reason to copy it)
    write_new(fs, os.path.join(dst, LOG_NAME), data if whole else data[: found.valid_end])
    fs.fsync_dir(dst)
    return Copied(log_bytes=found.valid_end, records=found.records, files=(LOG_NAME, *files))
