"""A consistent copy of a SQLite store's database, taken while a server writes to it.

SQLite's online backup API copies the database page by page inside one read
transaction: in WAL mode a reader never blocks the writer and sees one committed
state throughout, so the copy is the database as of one commit, holding every job
acknowledged before it began (an acknowledgement follows its commit). Copied in one
step (``pages=-1``): stepping in smaller pieces lets a write in between restart the
copy from its first page, which under a steady load might never finish.

The copy is created 0600 before SQLite opens it (SQLite would use the umask; it gives
its journal files the database's mode), checked with ``PRAGMA quick_check``, and
synced with its directory. Nothing else in the directory is needed: the signing key
and the paused queues are tables of the same database.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from urllib.parse import quote

from sqlq.common.engine.datadir import open_private
from sqlq.common.errors import StoreError
from sqlq.engines.sqlite.store import DB_NAME

BUSY_TIMEOUT_S = 30.0  # a checkpoint's brief lock at the start of the read


@dataclass(frozen=True, slots=True)
class Copied:
    """What a backup holds: the database's bytes and jobs."""

    db_bytes: int
    jobs: int


def copy_store(src: str, dst: str) -> Copied:
    """Copy the SQLite store in directory ``src`` (a server may be running on it) into
    ``dst``, a new empty directory. ``FileNotFoundError`` if ``src`` holds no database;
    ``StoreError`` if SQLite refuses it or the copy fails its check; ``OSError``."""
    src_db, dst_db = os.path.join(src, DB_NAME), os.path.join(dst, DB_NAME)
    if not os.path.isfile(src_db):
        raise FileNotFoundError(2, "no SQLite database", src_db)
    os.close(open_private(dst_db, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    try:
        # mode=rw: never create a database where there was none
        source = sqlite3.connect(f"file:{quote(src_db)}?mode=rw", uri=True,
                                 timeout=BUSY_TIMEOUT_S)  # fmt: skip
        try:
            target = sqlite3.connect(dst_db, timeout=BUSY_TIMEOUT_S)
            try:
                source.backup(target, pages=-1)
                (verdict,) = target.execute("PRAGMA quick_check").fetchone()
                if verdict != "ok":
                    raise StoreError(f"{dst_db}: the copy fails its check: {verdict}")
                (jobs,) = target.execute("SELECT count(*) FROM jobs").fetchone()
            finally:
                target.close()
        finally:
            source.close()
    except sqlite3.Error as exc:
        raise StoreError(f"{src_db}: cannot copy: {exc}") from exc
    fd = open_private(dst_db, os.O_RDONLY)
    try:
        os.fsync(fd)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    dir_fd = os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return Copied(db_bytes=size, jobs=int(jobs))
