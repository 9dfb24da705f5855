"""The only door between walq and the filesystem.

Every byte walq writes and every sync it relies on goes through a ``FileOps``,
so fault-injection tests can substitute one that fails on demand or that
remembers what was synced and rebuilds the disk a power cut would leave.
"""

from __future__ import annotations

import os
from typing import Protocol

from sqlq.common.engine.datadir import open_private


class FileOps(Protocol):
    def open_append(self, path: str) -> int:
        """Open (creating if needed) for appending; returns a file descriptor."""
        ...

    def open_new(self, path: str) -> int:
        """Create ``path``, which must not exist, for writing; returns a file descriptor."""
        ...

    def write(self, fd: int, data: bytes) -> None:
        """Write all of ``data`` at the end of the file."""
        ...

    def fdatasync(self, fd: int) -> None: ...

    def truncate(self, fd: int, size: int) -> None: ...

    def close(self, fd: int) -> None: ...

    def replace(self, src: str, dst: str) -> None:
        """Atomically rename ``src`` over ``dst`` (durable only after ``fsync_dir``)."""
        ...

    def fsync_dir(self, path: str) -> None: ...

    def remove(self, path: str) -> None: ...

    def read(self, path: str) -> bytes:
        """The whole file as it is now; ``FileNotFoundError`` if absent."""
        ...

    def exists(self, path: str) -> bool: ...

    def listdir(self, path: str) -> list[str]: ...


class OsFileOps:
    """``FileOps`` on the real filesystem."""

    def open_append(self, path: str) -> int:
        return open_private(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def open_new(self, path: str) -> int:
        # O_EXCL: a temporary file is always new, never someone's file reused.
        return open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND)

    def write(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def close(self, fd: int) -> None:
        os.close(fd)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def remove(self, path: str) -> None:
        os.remove(path)

    def read(self, path: str) -> bytes:
        with open(open_private(path, os.O_RDONLY), "rb") as f:
            return f.read()

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)


OS_FILES = OsFileOps()


def write_new(fs: FileOps, path: str, data: bytes) -> None:
    """``data`` as the new file ``path`` (0600, ``open_new``), synced before this returns;
    its directory is the caller's to sync (after a rename, or after several files)."""
    fd = fs.open_new(path)
    try:
        fs.write(fd, data)
        fs.fdatasync(fd)
    finally:
        fs.close(fd)
