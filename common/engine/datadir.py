"""The data directory: created private, refused when unsafe, locked while in use.

A job queue's files hold every job's arguments and results, so the directory is
created 0700 and its files 0600. An existing directory that another user owns,
or that group or others may write, is refused at start: whoever can write there
can swap the log for a link or a forged record. Files are opened with
``O_NOFOLLOW``, so a link planted in place of one is an error, never followed.

A directory or file of ours that is merely too open (0755, 0644: an older sqlq,
a restore from a backup, a umask) is not refused but tightened, to 0700 and
0600, when the engine opens it, and the log says so: the data is ours, and
refusing to start over a mode would be a restart that exits for nothing.

The lock is an exclusive, advisory ``flock``, held for the life of an engine.
The kernel releases it when the process dies, so a kill -9 never leaves a stale
lock behind, while a second live opener is refused at once.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat

from sqlq.common.errors import StoreError, StoreLockedError

log = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600


def prepare_dir(path: str) -> None:
    """Create ``path`` (and missing parents) 0700, or check that an existing one is safe."""
    missing: list[str] = []
    here = os.path.abspath(path)
    while not os.path.lexists(here):
        missing.append(here)
        here = os.path.dirname(here)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            pass  # made meanwhile by someone else: checked below like any existing one
    check_dir(path)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        _tighten(fd, path, DIR_MODE)
    finally:
        os.close(fd)


def _tighten(fd: int, path: str, mode: int) -> None:
    """Give the open ``fd`` (at ``path``) ``mode`` if group or others have any access."""
    was = stat.S_IMODE(os.fstat(fd).st_mode)
    if was & 0o077:
        os.fchmod(fd, mode)
        log.warning("%s was mode %04o; tightened to %04o", path, was, mode)


def check_dir(path: str) -> None:
    """Raise ``StoreError`` unless ``path`` is a real directory that only we may write."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise StoreError(f"data directory {path}: {exc.strerror}") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise StoreError(f"data directory {path} is not a directory (a link or a file)")
    if st.st_uid != os.geteuid():
        raise StoreError(
            f"data directory {path} belongs to uid {st.st_uid}, not to this user "
            f"(uid {os.geteuid()}); refusing to use it"
        )
    if st.st_mode & 0o022:
        raise StoreError(
            f"data directory {path} is writable by group or others "
            f"(mode {stat.S_IMODE(st.st_mode):o}); run chmod go-w on it"
        )


def open_private(path: str, flags: int) -> int:
    """``os.open`` for the engines' files: never through a link, created 0600, and an
    existing one that group or others may read made 0600 (and logged)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        _tighten(fd, path, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


class DirLock:
    def __init__(self, directory: str, name: str) -> None:
        self.path = os.path.join(directory, name)
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = open_private(self.path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot open the lock file: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLockedError(f"{self.path} is held by another process") from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the flock
            self._fd = None
