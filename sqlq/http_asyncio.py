"""``AsyncioTransport``: httpx's own HTTP/1.1 (httpcore's connections, h11's messages)
carried by asyncio's transports instead of anyio's streams.

A remote worker spends most of its CPU on its calls (a claim brings 32 jobs and carries
32 outcomes). httpx's default transport reaches the socket through anyio, where every
read and write enters a cancel scope and each request's head, body and end go out as
three writes (three segments, with ``TCP_NODELAY``); and through httpcore's connection
pool, whose queue of requests, events and shielded scopes cost as much again. Measured
on this machine, one claim's CPU in the worker: ~600 us through httpx's default
transport; through this one, about a third of that (``results/P-asyncio.md``).

What this module owns is bytes between a socket and httpcore, and which kept
connection a request goes on; never HTTP. h11 writes and parses every message;
httpcore's ``AsyncHTTPConnection`` connects, does the TLS handshake (asyncio's
``start_tls``), frames, keeps alive and expires each connection, and applies the
timeouts by step; its errors are mapped to httpx's as httpx's own transport maps them.
Proxies from the environment stay on httpx's transports (the client's mounts).

A request's writes are held until its first read (or until ``FLUSH_BYTES`` wait) and
go out as one ``transport.write``: a small request is one segment. Nothing waits on a
write meanwhile: the bytes are in memory already (a request body is at most the
client's), and the answer cannot come before them.
"""

# ruff: noqa: ASYNC109 (the ``timeout`` parameters are httpcore's interface, by step)
from __future__ import annotations

import asyncio
import collections
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any

import httpcore
import httpx

FLUSH_BYTES = 64 * 1024  # held writes past this go out at once (a large body, in parts)
# httpx's default limits (``httpx.Limits()``): connections open at once, kept idle, and
# how long an idle one is kept
MAX_CONNECTIONS, MAX_IDLE, KEEPALIVE_S = 100, 20, 5.0  # httpx's default limits
# An answer waiting to be read past READ_HIGH bytes pauses reading until READ_LOW are left:
# a slow reader of a large body holds at most about this much, not the whole body.
READ_HIGH, READ_LOW = 256 * 1024, 64 * 1024

# httpcore's errors as httpx's, the most specific first (as httpx's transport maps them)
_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


def as_httpx(exc: Exception) -> Exception:
    """``exc`` as httpx raises it: an httpcore error mapped, anything else as it is."""
    for theirs, ours in _ERRORS:
        if isinstance(exc, theirs):
            mapped = ours(str(exc))
            mapped.__cause__ = exc
            return mapped
    return exc


class _Inbox(asyncio.Protocol):
    """What the connection received and not yet read, and its flow control."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.eof = False
        self.error: Exception | None = None
        self.waiter: asyncio.Future[None] | None = None  # a read waiting for data
        self.drained: asyncio.Future[None] | None = None  # a write waiting for room
        self.paused = False
        self.transport: asyncio.BaseTransport | None = None
        self.held = False  # reading paused: ``READ_HIGH`` bytes wait to be read

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.data += data
        if len(self.data) > READ_HIGH and not self.held and self.transport is not None:
            self.held = True  # a reader slower than the server: the kernel's buffer waits
            self.transport.pause_reading()  # type: ignore[attr-defined]
        self._wake()

    def taken(self) -> None:
        """Some of ``data`` was read: reading goes on once little is left."""
        if self.held and len(self.data) <= READ_LOW and self.transport is not None:
            self.held = False
            if not self.transport.is_closing():
                self.transport.resume_reading()  # type: ignore[attr-defined]

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # (the transport closes itself)

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self.error = exc
        self._wake()
        self.resume_writing()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


async def _within(
    future: asyncio.Future[None], timeout: float | None, error: type[Exception]
) -> None:
    """Wait for ``future``, ``timeout`` seconds at most (then ``error``). A timer that
    fails the future rather than ``asyncio.timeout``: nothing is cancelled."""
    if timeout is None:
        await future
        return
    timer = asyncio.get_running_loop().call_later(timeout, _expire, future, error)
    try:
        await future
    finally:
        timer.cancel()


def _expire(future: asyncio.Future[None], error: type[Exception]) -> None:
    if not future.done():
        future.set_exception(error("timed out"))


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One connection, as httpcore reads and writes it."""

    def __init__(self, transport: asyncio.Transport, inbox: _Inbox) -> None:
        self._transport = transport
        self._inbox = inbox
        self._held: list[bytes] = []
        self._held_bytes = 0

    def _flush(self) -> None:
        if self._held:
            if self._transport.is_closing():
                self._held.clear()
                raise httpcore.WriteError(str(self._inbox.error or "the connection is closed"))
            self._transport.write(b"".join(self._held) if len(self._held) > 1 else self._held[0])
            self._held.clear()
            self._held_bytes = 0

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        self._held.append(buffer)
        self._held_bytes += len(buffer)
        if self._held_bytes < FLUSH_BYTES:
            return
        self._flush()
        inbox = self._inbox
        if inbox.paused:  # the kernel's buffer and the transport's are full: wait for room
            inbox.drained = asyncio.get_running_loop().create_future()
            await _within(inbox.drained, timeout, httpcore.WriteTimeout)
            if inbox.error is not None or self._transport.is_closing():
                raise httpcore.WriteError(str(inbox.error or "the connection is closed"))

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._flush()
        inbox = self._inbox
        while not inbox.data:
            if inbox.eof:
                if inbox.error is not None:
                    raise httpcore.ReadError(str(inbox.error))
                return b""
            inbox.waiter = asyncio.get_running_loop().create_future()
            try:
                await _within(inbox.waiter, timeout, httpcore.ReadTimeout)
            finally:
                inbox.waiter = None
        if len(inbox.data) <= max_bytes:
            data = bytes(inbox.data)
            inbox.data.clear()
        else:
            data = bytes(inbox.data[:max_bytes])
            del inbox.data[:max_bytes]
        if inbox.held:
            inbox.taken()
        return data

    async def aclose(self) -> None:
        self._held.clear()
        self._transport.close()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        self._flush()
        loop = asyncio.get_running_loop()
        try:
            tls = await asyncio.wait_for(
                loop.start_tls(
                    self._transport, self._inbox, ssl_context, server_hostname=server_hostname
                ),
                timeout,
            )
        except TimeoutError as exc:
            self._transport.close()
            raise httpcore.ConnectTimeout("the TLS handshake timed out") from exc
        except (OSError, ssl.SSLError) as exc:
            self._transport.close()
            raise httpcore.ConnectError(str(exc)) from exc
        if tls is None:
            raise httpcore.ConnectError("the connection closed in the TLS handshake")
        return AsyncioStream(tls, self._inbox)

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":  # an idle connection the server closed, or wrote on
            return self._inbox.eof or bool(self._inbox.data)
        if info == "client_addr":
            return self._transport.get_extra_info("sockname")
        if info == "server_addr":
            return self._transport.get_extra_info("peername")
        if info in ("ssl_object", "socket"):
            return self._transport.get_extra_info(info)
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """httpcore's connections, opened on the running loop."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        local = None if local_address is None else (local_address, 0)
        loop = asyncio.get_running_loop()
        return await self._open(
            lambda: loop.create_connection(_Inbox, host, port, local_addr=local),
            timeout, socket_options,
        )  # fmt: skip

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        return await self._open(lambda: loop.create_unix_connection(_Inbox, path), timeout,
                                socket_options)  # fmt: skip

    @staticmethod
    async def _open(
        connect: Callable[[], Any], timeout: float | None, socket_options: Iterable[Any] | None
    ) -> AsyncioStream:
        try:
            transport, inbox = await asyncio.wait_for(connect(), timeout)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout("connecting timed out") from exc
        except OSError as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        sock: socket.socket | None = transport.get_extra_info("socket")
        if sock is not None:
            for option in socket_options or ():
                sock.setsockopt(*option)
        return AsyncioStream(transport, inbox)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class _Body(httpx.AsyncByteStream):
    """A response's body as httpx reads it, its errors mapped; its connection goes back
    to the transport once it is closed."""

    def __init__(self, stream: Any, done: Callable[[], Awaitable[None]]) -> None:
        self._stream = stream
        self._done = done

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._stream:
                yield chunk
        except Exception as exc:
            raise as_httpx(exc) from exc.__cause__

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            await self._done()


class AsyncioTransport(httpx.AsyncBaseTransport):
    """httpx's transport for direct connections (no proxy): httpcore's HTTP/1.1
    connections (``httpcore.AsyncHTTPConnection``: connect, TLS, h11, keep-alive, expiry)
    on ``AsyncioBackend``, with httpx's default limits. ``exchange`` is the short way for
    an encoded call, with no httpx request or response made for it.

    The connections are kept here rather than in ``httpcore.AsyncConnectionPool``, whose
    queue of waiting requests, anyio events and shielded cancel scopes cost as much again
    as the request itself (measured: ~460 us a call through the pool on uvloop, ~230 on a
    connection): a request takes an idle connection that is still usable (not closed by
    the server, not expired) or opens one, and gives it back once its answer is read; at
    most ``MAX_CONNECTIONS`` are open at once (a request past them waits, up to its
    ``pool`` timeout) and ``MAX_IDLE`` kept."""

    def __init__(
        self, *, verify: ssl.SSLContext | str | bool = True, trust_env: bool = True
    ) -> None:
        self._ssl = httpx.create_ssl_context(verify=verify, trust_env=trust_env)
        self._backend = AsyncioBackend()
        # idle connections by origin (scheme, host, port: httpcore's Origin has no hash)
        self._idle: dict[tuple[bytes, bytes, int], list[httpcore.AsyncHTTPConnection]] = {}
        self._open: set[httpcore.AsyncHTTPConnection] = set()
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False

    async def _take(
        self, origin: httpcore.Origin, timeout: dict[str, float | None]
    ) -> httpcore.AsyncHTTPConnection:
        """A connection to ``origin`` for one request: an idle one still usable, or a new
        one if fewer than ``MAX_CONNECTIONS`` are open (an idle one to another origin is
        closed to make room); otherwise the first given back, within the pool timeout."""
        key = (origin.scheme, origin.host, origin.port)
        loop = asyncio.get_running_loop()
        pool_s = timeout.get("pool")
        deadline = None if pool_s is None else loop.time() + pool_s
        while True:
            idle = self._idle.get(key)
            while idle:
                conn = idle.pop()
                if conn.is_available() and not conn.has_expired():
                    return conn
                await self._drop(conn)
            if self._closed:
                raise httpcore.ConnectError("the transport is closed")
            if len(self._open) < MAX_CONNECTIONS:
                conn = httpcore.AsyncHTTPConnection(origin, ssl_context=self._ssl,
                                                    keepalive_expiry=KEEPALIVE_S,
                                                    network_backend=self._backend)  # fmt: skip
                self._open.add(conn)
                return conn
            other = next((cs for cs in self._idle.values() if cs), None)
            if other is not None:
                await self._drop(other.pop())
                continue
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                left = None if deadline is None else max(0.0, deadline - loop.time())
                await _within(waiter, left, httpcore.PoolTimeout)
            except BaseException:  # a wake this request will not use goes to the next one
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    self._wake()
                raise
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    async def _taken(
        self, origin: httpcore.Origin, timeout: dict[str, float | None]
    ) -> httpcore.AsyncHTTPConnection:
        try:
            return await self._take(origin, timeout)
        except (httpcore.PoolTimeout, httpcore.ConnectError) as exc:  # (no room; closed)
            raise as_httpx(exc) from exc

    async def _give(self, conn: httpcore.AsyncHTTPConnection, origin: httpcore.Origin) -> None:
        """``conn``'s answer is read: kept for the next request, if it may be."""
        idle = self._idle.setdefault((origin.scheme, origin.host, origin.port), [])
        kept = sum(len(cs) for cs in self._idle.values())  # (httpx's limit: in all)
        if not self._closed and conn.is_idle() and kept < MAX_IDLE:
            idle.append(conn)
            self._wake()
        else:
            await self._drop(conn)

    async def _drop(self, conn: httpcore.AsyncHTTPConnection) -> None:
        self._open.discard(conn)
        self._wake()
        await conn.aclose()

    def _wake(self) -> None:
        """A connection was given back or closed: the first request waiting looks again."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        url = request.url
        port = url.port or _PORTS.get(url.scheme)
        if port is None:  # (httpx's own transport says the same)
            raise httpx.UnsupportedProtocol(
                f"request URL has an unsupported protocol {url.scheme}://"
            )
        origin = httpcore.Origin(url.raw_scheme, url.raw_host, port)
        sent = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        conn = await self._taken(origin, request.extensions.get("timeout", {}))
        try:
            got = await conn.handle_async_request(sent)
        except BaseException as exc:
            await self._drop(conn)
            if not isinstance(exc, Exception):
                raise
            raise as_httpx(exc) from exc
        return httpx.Response(got.status, headers=got.headers,
                              stream=_Body(got.stream, lambda: self._give(conn, origin)),
                              extensions=got.extensions)  # fmt: skip

    async def exchange(
        self,
        method: bytes,
        url: httpcore.URL,
        headers: list[tuple[bytes, bytes]],
        content: bytes,
        timeout: dict[str, float | None],
        limit: int,
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """One request with its body in hand; its answer read whole, at most ``limit``
        bytes (past that, ``httpx.RemoteProtocolError``): status, headers, body."""
        sent = httpcore.Request(method, url, headers=headers, content=content,
                                extensions={"timeout": timeout})  # fmt: skip
        origin = url.origin
        conn = await self._taken(origin, timeout)
        try:
            got = await conn.handle_async_request(sent)
            try:
                chunks: list[bytes] = []
                size = 0
                async for chunk in got.stream:  # type: ignore[union-attr]
                    size += len(chunk)
                    if size > limit:
                        raise httpx.RemoteProtocolError(f"an answer of more than {limit} bytes")
                    chunks.append(chunk)
            finally:
                await got.aclose()
        except BaseException as exc:
            await self._drop(conn)
            if isinstance(exc, httpx.TransportError) or not isinstance(exc, Exception):
                raise
            raise as_httpx(exc) from exc
        await self._give(conn, origin)
        return got.status, got.headers, chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def kept(self) -> list[httpcore.AsyncHTTPConnection]:
        """The idle connections kept for the next requests."""
        return [c for conns in self._idle.values() for c in conns]

    async def aclose(self) -> None:
        self._closed = True
        idle = [c for conns in self._idle.values() for c in conns]
        self._idle.clear()
        for conn in idle:
            await self._drop(conn)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self.aclose()


_PORTS = {"http": 80, "https": 443}
