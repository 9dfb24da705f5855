"""A minimal keep-alive HTTP/1.1 client for the load generator.

Measured here against the bare ASGI endpoint of ``sqlq.bench.trivial`` (32
connections, uvloop): aiohttp spent 167 us of client CPU per request (4.8k
req/s), this client 36 us (15.5k req/s). On a 2-core machine the client's CPU
is taken from the server being measured, so that difference is the server's.
This client speaks just enough HTTP for our own server: one
request in flight per connection, ``Content-Length`` bodies, no chunking, no
redirects, no TLS. Anything else is an error, not a guess.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any, cast

import msgspec


class HTTPError(ConnectionError):
    pass


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.closed = False
        self.host = b"127.0.0.1"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.waiter is None or self.waiter.done():
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buf[:end]).lower()
        i = head.find(b"\r\ncontent-length:")
        if i < 0:
            self.waiter.set_exception(HTTPError("response without content-length"))
            return
        j = head.find(b"\r\n", i + 2)
        length = int(head[i + 17 : j if j >= 0 else len(head)])
        total = end + 4 + length
        if len(self.buf) < total:
            return
        status = int(head[9:12])
        body = bytes(self.buf[end + 4 : total])
        del self.buf[:total]
        self.waiter.set_result((status, body))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(HTTPError(f"connection lost: {exc}"))

    async def request(self, method: bytes, path: bytes, body: bytes) -> tuple[int, bytes]:
        if self.closed or self.transport is None:
            raise HTTPError("connection closed")
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(
            b"%s %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (method, path, self.host, len(body), body)
        )
        return await self.waiter


class HttpPool:
    """``size`` keep-alive connections; each request borrows one."""

    def __init__(self, url: str, size: int) -> None:
        hostport = url.removeprefix("http://").rstrip("/")
        host, _, port = hostport.partition(":")
        self.host, self.port, self.size = host, int(port or 80), size
        self._free: asyncio.Queue[_Connection] = asyncio.Queue()
        self._all: list[_Connection] = []

    async def _connect(self) -> _Connection:
        _, conn = await asyncio.get_running_loop().create_connection(
            _Connection, self.host, self.port
        )
        conn.host = f"{self.host}:{self.port}".encode()  # the server checks Host (421)
        self._all.append(conn)
        return conn

    async def __aenter__(self) -> HttpPool:
        for _ in range(self.size):
            self._free.put_nowait(await self._connect())
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        for conn in self._all:
            if conn.transport is not None:
                conn.transport.close()

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        """One request. A connection the server closed while idle (uvicorn's
        keep-alive timeout) is replaced first; a GET that loses its connection
        mid-flight is retried once. A POST never is: it may have been applied."""
        for attempt in (1, 2):
            conn = await self._free.get()
            try:
                if conn.closed:
                    conn = await self._connect()
                return await conn.request(method.encode(), path.encode(), body)
            except HTTPError:
                if method != "GET" or attempt == 2:
                    raise
            finally:
                # Back as it is, even closed: the next borrower replaces it above. Replacing
                # it here raised when the server was gone, and the pool lost the connection
                # (its other users then waited for ever).
                self._free.put_nowait(conn)
        raise AssertionError("unreachable")

    async def json(self, method: str, path: str, body: bytes = b"") -> tuple[int, Any]:
        status, data = await self.request(method, path, body)
        return status, msgspec.json.decode(data) if data else None
