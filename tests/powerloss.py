"""A simulated disk for walq that can lose power.

``SimDisk`` implements walq's ``FileOps`` in memory and remembers, per inode,
the bytes as of its last ``fdatasync`` and, for the directory, the names as of
its last ``fsync_dir``. After ``cut_after`` I/O calls the power goes: that
state is frozen and every later call fails with EIO, like a device that is gone.
``after_cut`` builds the disk a power cut leaves: only synced bytes, optionally
plus a random prefix, zeros or garbage in place of each file's unsynced tail,
and only the directory entries that were synced.

This is how SQLite's and LevelDB's crash tests find a missing fsync, including
the one on the directory after a rename.
"""

from __future__ import annotations

import errno
import random
import threading
from dataclasses import dataclass, field

TAIL_MODES = ("synced", "prefix", "zeros", "garbage")


class PowerCut(OSError):
    def __init__(self) -> None:
        super().__init__(errno.EIO, "simulated power cut")


@dataclass
class Inode:
    data: bytearray = field(default_factory=bytearray)
    synced: bytes = b""


class SimDisk:
    def __init__(self, cut_after: int | None = None) -> None:
        self.inodes: dict[int, Inode] = {}
        self.names: dict[str, int] = {}
        self.durable_names: dict[str, int] = {}
        self.fds: dict[int, int] = {}
        self._ino = 0
        self._fd = 1000
        self.calls: list[str] = []
        self.cut_after = cut_after
        self.frozen: tuple[dict[str, int], dict[int, tuple[bytes, bytes]]] | None = None
        self._lock = threading.RLock()  # walq calls from its I/O threads

    # -- the fault ------------------------------------------------------------------

    def _io(self, name: str) -> None:
        with self._lock:
            if self.frozen is not None:
                raise PowerCut()
            if self.cut_after is not None and len(self.calls) >= self.cut_after:
                self.frozen = (
                    dict(self.durable_names),
                    {i: (n.synced, bytes(n.data)) for i, n in self.inodes.items()},
                )
                raise PowerCut()
            self.calls.append(name)

    def after_cut(self, mode: str, rng: random.Random) -> SimDisk:
        """The disk as a power cut leaves it (or as it is now, if never cut)."""
        with self._lock:
            names, contents = self.frozen or (
                dict(self.durable_names),
                {i: (n.synced, bytes(n.data)) for i, n in self.inodes.items()},
            )
        disk = SimDisk()
        for name, ino in names.items():
            synced, current = contents[ino]
            tail = current[len(synced) :] if current.startswith(synced) else b""
            if mode == "prefix" and tail:
                extra = tail[: rng.randrange(len(tail) + 1)]
            elif mode == "zeros" and tail:
                extra = bytes(rng.randrange(len(tail) + 1))
            elif mode == "garbage" and tail:
                extra = rng.randbytes(rng.randrange(len(tail) + 1))
            else:
                extra = b""
            new = disk._new_inode()
            disk.inodes[new].data = bytearray(synced + extra)
            disk.inodes[new].synced = synced + extra
            disk.names[name] = disk.durable_names[name] = new
        return disk

    # -- FileOps ----------------------------------------------------------------------

    def _new_inode(self) -> int:
        self._ino += 1
        self.inodes[self._ino] = Inode()
        return self._ino

    def _open(self, path: str, truncate: bool) -> int:
        with self._lock:
            ino = self.names.get(path)
            if ino is None:
                ino = self._new_inode()
                self.names[path] = ino  # durable only after fsync_dir
            elif truncate:
                self.inodes[ino].data = bytearray()
            self._fd += 1
            self.fds[self._fd] = ino
            return self._fd

    def open_append(self, path: str) -> int:
        self._io("open_append")
        return self._open(path, truncate=False)

    def open_new(self, path: str) -> int:
        self._io("open_new")
        return self._open(path, truncate=True)

    def write(self, fd: int, data: bytes) -> None:
        self._io("write")
        with self._lock:
            self.inodes[self.fds[fd]].data += data

    def fdatasync(self, fd: int) -> None:
        self._io("fdatasync")
        with self._lock:
            inode = self.inodes[self.fds[fd]]
            inode.synced = bytes(inode.data)

    def truncate(self, fd: int, size: int) -> None:
        self._io("truncate")
        with self._lock:
            inode = self.inodes[self.fds[fd]]
            del inode.data[size:]

    def close(self, fd: int) -> None:
        with self._lock:  # closing is not I/O that can be lost
            self.fds.pop(fd, None)

    def replace(self, src: str, dst: str) -> None:
        self._io("replace")
        with self._lock:
            self.names[dst] = self.names.pop(src)

    def fsync_dir(self, path: str) -> None:
        self._io("fsync_dir")
        with self._lock:
            self.durable_names = dict(self.names)

    def remove(self, path: str) -> None:
        self._io("remove")
        with self._lock:
            if path not in self.names:
                raise FileNotFoundError(path)
            del self.names[path]

    def read(self, path: str) -> bytes:
        self._io("read")
        with self._lock:
            if path not in self.names:
                raise FileNotFoundError(path)
            return bytes(self.inodes[self.names[path]].data)

    def exists(self, path: str) -> bool:
        with self._lock:
            return path in self.names

    def listdir(self, path: str) -> list[str]:
        with self._lock:
            return [n.rsplit("/", 1)[-1] for n in self.names if n.startswith(path + "/")]
