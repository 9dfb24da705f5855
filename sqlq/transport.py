"""``KeepAlive``: an httpx transport for plain HTTP/1.1 to one server, lean on CPU; and
``Direct``, the client's protocol calls over it with no httpx objects at all.

A remote worker's calls are small JSON bodies to one server over a few kept-alive
connections, many a second. httpx's own transport (httpcore, on anyio, with h11 in pure
Python) spent about 900 us of the worker's CPU a call here, measured, which was the
largest part of a remote no-op job's cost and of what a worker's parent process takes
from the cores its handler processes run on. ``KeepAlive`` replaces the connection:
asyncio's own transport, and httptools (the C parser uvicorn serves the API with) to
read the answer. httpx's client above it then cost more than the call (``Direct``'s
docstring), so ``AsyncClient`` sends the protocol's calls, whose JSON bodies it has
encoded already, through ``Direct`` to ``KeepAlive.exchange``, and everything else
through httpx's client and ``handle_async_request``.

Only what sqlq's client needs: ``http://`` URLs, no proxy (``for_url`` picks httpx's
transport for anything else), a request's body read whole and sent with its length, and
answers framed by ``Content-Length`` or chunked (an answer that ends at EOF, HTTP/1.0
style, is refused), after any interim 1xx answers, which are skipped; an answer is read
whole, ``MAX_HEADERS`` headers and ``MAX_ANSWER_BYTES`` of body at most. A connection is
used by one request at a time and kept for the next while the server keeps it alive,
``MAX_IDLE`` of them; a timeout, an error, an upgrade or any byte that no request asked
for closes it, so a stray answer that comes before the next request is never read as
that request's (one that crosses it on the wire, a 408 at an idle close, still can be,
as with any HTTP/1.1 client). Errors are
httpx's (``ConnectError``, ``ReadTimeout``, ``RemoteProtocolError`` ...), so the client's
retries and the worker's backoff read them as they read httpx's own.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import urllib.request
from collections.abc import Mapping
from typing import Any, cast

import httptools
import httpx

from sqlq.common.protocol import MAX_CLAIM
from sqlq.common.specs import MAX_JOB_BYTES

_FRAMING = (b"content-length", b"transfer-encoding")  # set here, from the body read whole
MAX_IDLE = 8  # connections kept open between requests (a worker uses 2 to 6 at once)
# An answer past these is refused (a wrong --url that serves a large file, say), not read
# into memory whole: a claim's answer is at most MAX_CLAIM jobs of MAX_JOB_BYTES of args
# and a checkpoint each, encoded once more, so 4x that leaves room to spare.
MAX_ANSWER_BYTES = 4 * MAX_CLAIM * MAX_JOB_BYTES
MAX_HEADERS = 256  # header lines of one answer (uvicorn sends 3 to 5)


log = logging.getLogger("sqlq.transport")
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]  # the status, raw headers, and body
_PLAIN_PATH = re.compile(r"[A-Za-z0-9/._~-]*")  # a path sent as it is: nothing to quote


class _Unasked(Exception):
    """An answer began while no request waited for one."""


class _TooLarge(Exception):
    """An answer with more than ``MAX_HEADERS`` headers or ``MAX_ANSWER_BYTES`` of body."""


class _Connection(asyncio.Protocol):
    """One TCP connection and the answer being read on it (httptools' callbacks)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._parser = httptools.HttpResponseParser(self)
        self._answer: asyncio.Future[Answer] | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._body: list[bytes] = []
        self._size = 0  # bytes of the body so far
        self.keep = False

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)  # (uvloop's: not a subclass)

    def data_received(self, data: bytes) -> None:
        if not self._waiting():
            self._fail(httpx.RemoteProtocolError("the server sent bytes nobody asked for"))
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if isinstance(exc.__context__, _Unasked):  # a second answer behind the first
                self._fail(httpx.RemoteProtocolError("the server sent an answer nobody asked for"))
            elif isinstance(exc.__context__, _TooLarge):
                self._fail(httpx.RemoteProtocolError(str(exc.__context__)))
            else:
                self._fail(httpx.RemoteProtocolError(f"a malformed answer: {exc}"))
        except httptools.HttpParserUpgrade:
            self._fail(httpx.RemoteProtocolError("the server switched protocols (101)"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(
                httpx.RemoteProtocolError("the server closed the connection before it answered")
            )

    # -- httptools' callbacks --------------------------------------------------------------

    def on_message_begin(self) -> None:
        if not self._waiting():
            raise _Unasked  # (httptools wraps it; data_received closes the connection)
        self._headers, self._body, self._size = [], [], 0

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self._headers) >= MAX_HEADERS:
            raise _TooLarge(f"an answer with more than {MAX_HEADERS} headers")
        self._headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self._size += len(body)
        if self._size > MAX_ANSWER_BYTES:
            raise _TooLarge(f"an answer of more than {MAX_ANSWER_BYTES} bytes")
        self._body.append(body)

    def on_message_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # interim (100 Continue, 103 Early Hints): the answer follows
            return
        self.keep = self._parser.should_keep_alive()
        if self._answer is not None and not self._answer.done():
            self._answer.set_result((status, self._headers, b"".join(self._body)))

    # -- a request ---------------------------------------------------------------------------

    def ask(self, data: bytes) -> asyncio.Future[Answer]:
        assert self.transport is not None
        self._answer = asyncio.get_running_loop().create_future()
        self._headers, self._body, self._size, self.keep = [], [], 0, False
        self.transport.write(data)
        return self._answer

    def _waiting(self) -> bool:
        return self._answer is not None and not self._answer.done()

    def _fail(self, exc: Exception) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class Direct:
    """JSON calls to one server's ``http://`` base URL over ``keep``, with the head they all
    carry built once and no httpx request or response around them. Through httpx's client
    (parsing the URL, merging headers and cookies, decoding the answer) a claim cost a
    worker ~615 us of CPU here, on ``KeepAlive``; through this, ~115 us (measured
    against a trivial server). What httpx's client would add and this does not: a
    ``User-Agent``, ``Accept-Encoding``, cookies, and its INFO log of each request (here
    a DEBUG one). ``for_client`` says when it applies."""

    def __init__(
        self, keep: KeepAlive, url: httpx.URL, headers: list[tuple[bytes, bytes]], timeout: float
    ) -> None:
        self._keep, self._timeout = keep, timeout
        self._host, self._port = url.host, url.port or 80
        self._base = url.raw_path.rstrip(b"/")
        self._where = f"http://{url.netloc.decode()}{self._base.decode()}"
        fixed = [(b"Host", url.netloc), (b"Accept", b"*/*"), (b"Content-Type", b"application/json"),
                 *headers]  # fmt: skip
        self._fixed = b"".join(name + b": " + value + b"\r\n" for name, value in fixed)

    @classmethod
    def for_client(
        cls, transport: httpx.AsyncBaseTransport | None, base_url: str,
        headers: Mapping[str, str], timeout: object,
    ) -> Direct | None:  # fmt: skip
        """A ``Direct`` for a client on ``transport``, or None where httpx's client is to
        do it all: another transport, a URL other than plain ``http://`` (or one holding
        credentials), a timeout that is not one number, a header with a line break."""
        if not isinstance(transport, KeepAlive) or not isinstance(timeout, int | float):
            return None
        url = httpx.URL(base_url)
        if url.scheme != "http" or url.userinfo or url.query:
            return None
        raw = [(k.encode(), v.encode()) for k, v in headers.items()]
        if any(b"\r" in k + v or b"\n" in k + v for k, v in raw):
            return None  # (KeepAlive refuses it at the call: LocalProtocolError)
        return cls(transport, url, raw, float(timeout))

    async def call(self, method: str, path: str, body: bytes) -> Answer | None:
        """The answer to ``body`` sent to ``path`` (below the base URL); None, unsent, if
        the path is not plain enough to send as it is (httpx's path quotes it)."""
        if _PLAIN_PATH.fullmatch(path) is None:
            return None
        data = b"%s %s%s HTTP/1.1\r\n%sContent-Length: %d\r\n\r\n%s" % (
            method.encode(), self._base, path.encode(), self._fixed, len(body), body)  # fmt: skip
        answer = await self._keep.exchange(
            self._host, self._port, data, self._timeout, self._timeout)  # fmt: skip
        if log.isEnabledFor(logging.DEBUG):
            log.debug("HTTP Request: %s %s%s %d", method, self._where, path, answer[0])
        return answer


def header(headers: list[tuple[bytes, bytes]], name: str) -> str | None:
    """The value of header ``name`` (lowercase) in an answer's raw ``headers``, if any."""
    wanted = name.encode()
    for key, value in headers:
        if key.lower() == wanted:
            return value.decode("latin-1")
    return None


def _no_line_break(name: bytes, value: bytes) -> None:
    if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name:
        raise httpx.LocalProtocolError(f"header {name!r} holds a line break")


class KeepAlive(httpx.AsyncBaseTransport):
    """Plain HTTP/1.1 to ``http://`` URLs over kept-alive asyncio connections."""

    def __init__(self) -> None:
        self._idle: list[tuple[str, int, _Connection]] = []
        self._closed = False

    async def exchange(
        self, host: str, port: int, data: bytes, connect_s: float | None, read_s: float | None
    ) -> Answer:
        """Send ``data`` (one whole request) to ``host:port`` on a kept connection (or a new
        one) and read its answer: the status, the raw headers, the body."""
        if self._closed:
            raise httpx.UnsupportedProtocol("this transport is closed")  # (a TransportError)
        conn = self._reuse(host, port) or await self._connect(host, port, connect_s)
        try:
            async with asyncio.timeout(read_s):
                answer = await conn.ask(data)
        except TimeoutError:
            conn.close()
            raise httpx.ReadTimeout("no answer within the read timeout") from None
        except BaseException:
            conn.close()
            raise
        if conn.keep and not conn.closed and not self._closed and len(self._idle) < MAX_IDLE:
            self._idle.append((host, port, conn))
        else:
            conn.close()
        return answer

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(f"KeepAlive speaks http:// only, not {url.scheme}")
        timeout: dict[str, float | None] = request.extensions.get("timeout", {})
        body = await request.aread()  # whole, so it goes with its length (never chunked)
        head = [request.method.encode(), b" ", url.raw_path, b" HTTP/1.1\r\n"]
        for name, value in request.headers.raw:
            if name.lower() in _FRAMING:
                continue  # framed below, from the body itself
            _no_line_break(name, value)
            head += [name, b": ", value, b"\r\n"]
        if body or request.method not in ("GET", "HEAD"):
            head += [b"Content-Length: ", str(len(body)).encode(), b"\r\n"]
        head.append(b"\r\n")
        try:
            status, headers, content = await self.exchange(
                url.host, url.port or 80, b"".join(head) + body,
                timeout.get("connect"), timeout.get("read"))  # fmt: skip
        except httpx.RequestError as exc:
            exc.request = request
            raise
        return httpx.Response(status, headers=headers, content=content, request=request)

    def _reuse(self, host: str, port: int) -> _Connection | None:
        while self._idle:
            h, p, conn = self._idle.pop()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                continue
            if (h, p) == (host, port):
                return conn
            conn.close()
        return None

    async def _connect(self, host: str, port: int, within: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(within):
                _, conn = await loop.create_connection(_Connection, host, port)
        except TimeoutError:
            raise httpx.ConnectTimeout(f"could not connect to {host}:{port} in time") from None
        except OSError as exc:
            raise httpx.ConnectError(f"could not connect to {host}:{port}: {exc}") from exc
        assert conn.transport is not None
        sock = conn.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    async def aclose(self) -> None:
        self._closed = True  # (a call still out closes its connection when it ends)
        for _, _, conn in self._idle:
            conn.close()
        self._idle.clear()


def for_url(url: str) -> httpx.AsyncBaseTransport | None:
    """``KeepAlive`` for a plain ``http://`` URL that no proxy setting applies to; None
    (httpx's own transport) for anything else: TLS, a proxy, another scheme."""
    if httpx.URL(url).scheme != "http":
        return None
    proxies: dict[str, Any] = urllib.request.getproxies()
    if any(k in proxies for k in ("http", "all")):
        return None
    return KeepAlive()
