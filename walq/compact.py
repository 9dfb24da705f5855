"""Compaction: rewrite the log as a snapshot of what recovery still needs.

It runs in two phases so appends never wait for more than one batch:

1. ``write_snapshot`` (a worker thread, while the writer keeps appending to the
   old log): header + one ``snap`` record per kept job as of sequence ``S``,
   written to ``<log>.tmp`` and fdatasynced.
2. ``switch`` (the writer's I/O thread, between two batches): append the change
   records written after ``S`` (the carry-over), fdatasync, ``replace`` the tmp
   over the log, fsync the directory. Only then does the writer append to the
   new file, so a power cut can never leave acknowledged records in an inode no
   directory entry names.

A crash before the replace leaves the old log plus a stale tmp (removed at
open); after the replace, the new log, complete on its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

import msgspec

from common.models import TERMINAL, Job
from walq import log
from walq.files import FileOps


@dataclass(slots=True)
class Snapshot:
    fd: int
    path: str
    bytes: int
    kept: int
    pruned: int
    next_seq: int
    cutoff: float  # terminal jobs last updated before this were left out


def write_snapshot(
    fs: FileOps, tmp_path: str, jobs: Iterable[Job], next_seq: int, cutoff: float, now: float
) -> Snapshot:
    if fs.exists(tmp_path):  # left by a compaction that failed after creating it
        fs.remove(tmp_path)
    fd = fs.open_new(tmp_path)
    try:
        chunks = [log.header(next_seq, now)]
        kept = pruned = 0
        size = len(chunks[0])
        for job in jobs:
            if job.state in TERMINAL and job.updated_at < cutoff:
                pruned += 1
                continue
            line = log.frame(b'{"snap":%s}' % msgspec.json.encode(job))
            chunks.append(line)
            kept += 1
            size += len(line)
            if len(chunks) >= 4096:
                fs.write(fd, b"".join(chunks))
                chunks.clear()
        fs.write(fd, b"".join(chunks))
        fs.fdatasync(fd)
    except BaseException:
        fs.close(fd)
        _remove_quietly(fs, tmp_path)
        raise
    return Snapshot(
        fd=fd, path=tmp_path, bytes=size, kept=kept, pruned=pruned, next_seq=next_seq, cutoff=cutoff
    )


def switch(fs: FileOps, snap: Snapshot, carry: bytes, log_path: str) -> None:
    """Make the snapshot plus the carry-over the log. Raises on any I/O error."""
    if carry:
        fs.write(snap.fd, carry)
    fs.fdatasync(snap.fd)
    fs.replace(snap.path, log_path)
    fs.fsync_dir(os.path.dirname(log_path) or ".")


def abandon(fs: FileOps, snap: Snapshot) -> None:
    fs.close(snap.fd)
    _remove_quietly(fs, snap.path)


def _remove_quietly(fs: FileOps, path: str) -> None:
    # Only for cleaning up after a failure that is already being raised or logged.
    try:
        fs.remove(path)
    except FileNotFoundError:
        pass
