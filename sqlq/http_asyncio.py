"""``AsyncioTransport``: httpx's own HTTP/1.1 (httpcore's pool, h11's messages) carried by
asyncio's transports instead of anyio's streams.

A remote worker spends most of its CPU on its calls (a claim brings 32 jobs and carries
32 outcomes), and httpx's default transport reaches the socket through anyio: every read
and every write enters a cancel scope, each checks for cancellation by yielding to the
loop, and a request's head, body and end go out as three writes (three segments, with
``TCP_NODELAY``). Measured on this machine, one claim's CPU in the worker: ~600 us through
httpx's default transport, ~250 us through this one (``AsyncClient._exchange``).

What this module owns is bytes between a socket and httpcore, never HTTP: h11 writes and
parses every message, httpcore keeps the pool, keep-alive, the TLS handshake (asyncio's
``start_tls``), timeouts by step and the errors, which are mapped to httpx's as httpx's
own transport maps them. Proxies from the environment stay on httpx's transports (the
client's mounts).

A request's writes are held until its first read (or until ``FLUSH_BYTES`` wait) and
go out as one ``transport.write``: a small request is one segment. Nothing waits on a
write meanwhile: the bytes are in memory already (a request body is at most the
client's), and the response cannot come before them.
"""

# ruff: noqa: ASYNC109 (the ``timeout`` parameters are httpcore's interface, by step)
from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Iterable
from types import TracebackType
from typing import Any

import httpcore
import httpx

FLUSH_BYTES = 64 * 1024  # held writes past this go out at once (a large body, in parts)

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

    def data_received(self, data: bytes) -> None:
        self.data += data
        self._wake()

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
    """A response's body as httpx reads it, its errors mapped."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._stream:
                yield chunk
        except Exception as exc:
            raise as_httpx(exc) from exc.__cause__

    async def aclose(self) -> None:
        await self._stream.aclose()


class AsyncioTransport(httpx.AsyncBaseTransport):
    """httpx's transport for direct connections (no proxy), on ``AsyncioBackend``: the
    same pool, limits and TLS settings as ``httpx.AsyncHTTPTransport``'s defaults.
    ``exchange`` is the short way for an encoded call, with no httpx request or response
    made for it."""

    def __init__(
        self, *, verify: ssl.SSLContext | str | bool = True, trust_env: bool = True
    ) -> None:
        limits = httpx.Limits()  # httpx's defaults: 100 connections, 20 kept, 5 s idle
        self.pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, trust_env=trust_env),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=AsyncioBackend(),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.AsyncByteStream)
        url = request.url
        sent = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            got = await self.pool.handle_async_request(sent)
        except Exception as exc:
            raise as_httpx(exc) from exc
        return httpx.Response(got.status, headers=got.headers, stream=_Body(got.stream),
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
        try:
            got = await self.pool.handle_async_request(sent)
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
        except httpx.TransportError:
            raise
        except Exception as exc:
            raise as_httpx(exc) from exc
        return got.status, got.headers, chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def aclose(self) -> None:
        await self.pool.aclose()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None = None,
        exc_value: BaseException | None = None,
        traceback: TracebackType | None = None,
    ) -> None:
        await self.aclose()
