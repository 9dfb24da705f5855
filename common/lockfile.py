"""An exclusive, advisory lock on a data directory, held for the life of an engine.

``flock`` is released by the kernel when the process dies, so a kill -9 never
leaves a stale lock behind, while a second live opener is refused at once.
"""

from __future__ import annotations

import fcntl
import os

from common.errors import StoreLockedError


class DirLock:
    def __init__(self, directory: str, name: str) -> None:
        self.path = os.path.join(directory, name)
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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
