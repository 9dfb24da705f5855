"""A TCP proxy a test can cut, for partitions between a node and its database.

``cut`` makes the link silent, as a partition is: bytes already sent wait, nothing
is answered, a new connection is accepted but never reaches the other side, and no
connection is closed or reset (a reset would tell the client at once, which a real
partition never does). ``heal`` lets everything through again, as TCP's
retransmissions do once a link comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class Proxy:
    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._open = asyncio.Event()
        self._open.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def cut(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            await self._open.wait()  # a connection made during a cut reaches nobody until healed
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except (OSError, asyncio.CancelledError):  # (cancelled: the proxy closed meanwhile)
            writer.close()
            return
        self._writers.add(up_writer)
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pump(src, dst))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await src.read(65536):
                await self._open.wait()  # held, not lost, while the link is cut
                dst.write(data)
                await dst.drain()
        dst.close()


@contextlib.asynccontextmanager
async def proxy_to(host: str, port: int) -> AsyncIterator[Proxy]:
    proxy = Proxy(host, port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()
