"""A FUSE pass-through filesystem that can lose power, for SQLite power-loss tests.

    python tests/fusefs.py BACKING MOUNTPOINT

BACKING holds what is durable. Data written through MOUNTPOINT stays in memory
until the file is fsynced (or fdatasynced); then the whole file is written to
BACKING and synced there. Writing anything to ``MOUNTPOINT/.powercut`` drops
every unsynced change at once: from then on, reads see only what was synced,
as after a power cut and a reboot.

Simplification, on purpose: metadata operations (create, rename, unlink,
mkdir) are durable at once. The engines' data durability is what is tested;
walq's directory fsyncs are covered by the in-memory SimDisk tests instead.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import threading
import time
from typing import Any

from fuse import FUSE, FuseOSError, Operations  # type: ignore[import-untyped]

CONTROL = "/.powercut"


class PowerLossFS(Operations):  # type: ignore[misc]
    def __init__(self, backing: str) -> None:
        self.backing = backing
        self.overlay: dict[str, bytearray] = {}  # path -> unsynced current content
        self._mutex = threading.RLock()
        self.cuts = 0

    def _real(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def _content(self, path: str) -> bytearray:
        data = self.overlay.get(path)
        if data is None:
            with open(self._real(path), "rb") as f:
                data = bytearray(f.read())
            self.overlay[path] = data
        return data

    # -- metadata -------------------------------------------------------------------

    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        if path == CONTROL:
            now = time.time()
            return {"st_mode": stat.S_IFREG | 0o666, "st_nlink": 1, "st_size": 0,
                    "st_ctime": now, "st_mtime": now, "st_atime": now}  # fmt: skip
        with self._mutex:
            try:
                st = os.lstat(self._real(path))
            except FileNotFoundError:
                raise FuseOSError(errno.ENOENT) from None
            keys = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink",
                    "st_size", "st_uid")  # fmt: skip
            attrs = {k: getattr(st, k) for k in keys}
            if path in self.overlay:
                attrs["st_size"] = len(self.overlay[path])
            return attrs

    def readdir(self, path: str, fh: Any) -> list[str]:
        return [".", "..", *os.listdir(self._real(path))]

    def access(self, path: str, amode: int) -> int:
        return 0

    def statfs(self, path: str) -> dict[str, Any]:
        st = os.statvfs(self.backing)
        return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize",
                                             "f_favail", "f_ffree", "f_files", "f_flag",
                                             "f_frsize", "f_namemax")}  # fmt: skip

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._real(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        return 0

    def utimens(self, path: str, times: Any = None) -> int:
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._real(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._real(path))
        return 0

    def unlink(self, path: str) -> int:
        with self._mutex:
            self.overlay.pop(path, None)
            os.unlink(self._real(path))
        return 0

    def rename(self, old: str, new: str) -> int:
        with self._mutex:
            os.rename(self._real(old), self._real(new))
            if old in self.overlay:
                self.overlay[new] = self.overlay.pop(old)
            else:
                self.overlay.pop(new, None)
        return 0

    # -- data -----------------------------------------------------------------------

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        with self._mutex:
            fd = os.open(self._real(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
            os.close(fd)
            self.overlay[path] = bytearray()
        return 0

    def open(self, path: str, flags: int) -> int:
        if path != CONTROL and not os.path.exists(self._real(path)):
            raise FuseOSError(errno.ENOENT)
        if flags & os.O_TRUNC:
            with self._mutex:
                self.overlay[path] = bytearray()
        return 0

    def read(self, path: str, size: int, offset: int, fh: Any) -> bytes:
        if path == CONTROL:
            return b""
        with self._mutex:
            return bytes(self._content(path)[offset : offset + size])

    def write(self, path: str, data: bytes, offset: int, fh: Any) -> int:
        with self._mutex:
            if path == CONTROL:
                self.overlay.clear()  # the power goes: every unsynced change is gone
                self.cuts += 1
                return len(data)
            buf = self._content(path)
            if offset > len(buf):
                buf.extend(bytes(offset - len(buf)))
            buf[offset : offset + len(data)] = data
            return len(data)

    def truncate(self, path: str, length: int, fh: Any = None) -> int:
        if path == CONTROL:
            return 0
        with self._mutex:
            buf = self._content(path)
            if length < len(buf):
                del buf[length:]
            else:
                buf.extend(bytes(length - len(buf)))
        return 0

    def fsync(self, path: str, datasync: int, fh: Any) -> int:
        with self._mutex:
            data = self.overlay.pop(path, None)
            if data is not None:
                fd = os.open(self._real(path), os.O_WRONLY | os.O_TRUNC)
                try:
                    os.write(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: Any) -> int:
        return 0

    def flush(self, path: str, fh: Any) -> int:
        return 0  # close is not a sync

    def release(self, path: str, fh: Any) -> int:
        return 0


if __name__ == "__main__":
    backing, mountpoint = sys.argv[1], sys.argv[2]
    FUSE(PowerLossFS(backing), mountpoint, foreground=True, nothreads=False, allow_other=False)
