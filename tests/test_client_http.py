"""``AsyncClient`` and ``Client`` over real sockets on 127.0.0.1, through httpx for every
URL: the protocol's calls as sent (base path, token, JSON type) on one kept connection,
``https://`` with a private CA, a proxy from the environment, a long poll that outlasts
the read timeout, a lost reply sent again only where it may be, and every failure as the
``sqlq.calls`` exception the worker reads."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import cast

import httpcore
import httpx
import pytest
import uvloop

import sqlq
from sqlq import AsyncClient, Client, http_asyncio
from sqlq import client as client_module
from sqlq.calls import Call, FencedError, RateLimited, Unavailable

TLS = Path(__file__).parent / "data" / "tls"  # cert.pem, key.pem: make.sh there made them
Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
Pick = Callable[[bytes, int], bytes | None]  # a request and its number (from 1): the answer
CLAIMS = b'{"claims": []}'
DONE = {"id": "j", "kind": "sleep", "args": {}, "state": "completed", "queue": "default",
        "priority": 0, "attempts": 1, "max_attempts": 5, "epoch": 1, "created_at": 1.0,
        "ready_at": 1.0, "updated_at": 1.0}  # fmt: skip


class Served:
    def __init__(self) -> None:
        self.url = ""
        self.connections = 0
        self.requests: list[bytes] = []


def _json(status: bytes, body: bytes, *headers: bytes) -> bytes:
    """An answer of ``body`` framed by its length (``status``: ``b"200 OK"``)."""
    head = b"".join(h + b"\r\n" for h in headers)
    return b"HTTP/1.1 %s\r\n%sContent-Length: %d\r\n\r\n%s" % (status, head, len(body), body)


async def _request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


@pytest.fixture
async def reply() -> AsyncIterator[Callable[..., Awaitable[Served]]]:
    """A server that answers each request, in turn, with what ``pick`` makes of it (None:
    it closes that connection unanswered) after ``hold_s``; every request kept in
    ``Served.requests``."""
    servers: list[asyncio.Server] = []
    writers: list[asyncio.StreamWriter] = []
    handlers: list[asyncio.Task[None]] = []

    async def start(pick: Pick, tls: ssl.SSLContext | None = None, hold_s: float = 0.0) -> Served:
        served = Served()

        async def on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            served.connections += 1
            writers.append(writer)
            handlers.append(cast("asyncio.Task[None]", asyncio.current_task()))
            try:
                while True:
                    served.requests.append(await _request(reader))
                    answer = pick(served.requests[-1], len(served.requests))
                    if answer is None:
                        return
                    await asyncio.sleep(hold_s)
                    writer.write(answer)
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(on, "127.0.0.1", 0, ssl=tls)
        servers.append(server)
        scheme = "https" if tls else "http"
        served.url = f"{scheme}://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        return served

    yield start
    for s in servers:
        s.close()
    for task in handlers:  # a connection still open (kept alive): closed before the loop is
        task.cancel()
    await asyncio.gather(*handlers, return_exceptions=True)
    await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)


async def test_the_protocols_calls_go_as_sent_on_one_kept_connection(
    reply: Callable[..., Awaitable[Served]],
) -> None:
    """The request carries the base URL's path, the token and the JSON type; the answers
    read as their exceptions (a 429's Retry-After, a 409 fenced); one connection serves
    every call, kept alive between them."""
    answers = [
        _json(b"200 OK", CLAIMS),
        _json(b"429 Too Many Requests", b'{"error": "queue_full", "message": "full"}',
              b"Retry-After: 7"),
        _json(b"409 Conflict", b'{"error": "fenced", "message": "moved on", "field": "token"}'),
    ]  # fmt: skip
    served = await reply(lambda _, n: answers[n - 1])
    async with AsyncClient(served.url + "/base/", token="s3cret") as c:
        assert await c.claim(["q"], worker="w", max=3) == []
        with pytest.raises(RateLimited) as limited:
            await c.claim(["q"], worker="w")
        assert limited.value.retry_after == 7.0
        with pytest.raises(FencedError, match="moved on"):
            await c.complete("t", None)
    first = served.requests[0].lower()
    assert first.startswith(b"post /base/claims http/1.1\r\n")
    assert b"\r\nauthorization: bearer s3cret\r\n" in first
    assert b"\r\ncontent-type: application/json\r\n" in first
    assert b"\r\naccept-encoding: identity\r\n" in first  # (read as it comes: none compressed)
    body = json.loads(first.split(b"\r\n\r\n", 1)[1])
    assert (body["queues"], body["worker"], body["max"]) == (["q"], "w", 3)
    assert served.connections == 1


async def test_https_with_a_private_ca_named_by_ssl_cert_file(
    reply: Callable[..., Awaitable[Served]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the README's reverse proxy serves: TLS, the CA trusted as httpx is told to
    trust one (``SSL_CERT_FILE``), by both clients; an unknown CA is refused, as
    ``Unavailable``."""
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(TLS / "cert.pem", TLS / "key.pem")
    served = await reply(lambda _, n: _json(b"200 OK", CLAIMS), tls)
    monkeypatch.setenv("SSL_CERT_FILE", str(TLS / "cert.pem"))
    async with AsyncClient(served.url, token="s3cret") as c:
        assert await c.claim(["q"], worker="w") == []
    with Client(served.url) as sync:  # (a thread of its own: the loop serves it meanwhile)
        assert await asyncio.to_thread(sync.claim, ["q"], worker="w") == []
    assert b"\r\nauthorization: bearer s3cret\r\n" in served.requests[0].lower()
    monkeypatch.delenv("SSL_CERT_FILE")
    async with AsyncClient(served.url, retries=0) as c:
        with pytest.raises(Unavailable, match="CERTIFICATE_VERIFY_FAILED"):
            await c.claim(["q"], worker="w")
    assert len(served.requests) == 2  # the refused one never got as far as a request


async def test_a_proxy_from_the_environment_carries_the_calls(
    reply: Callable[..., Awaitable[Served]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``HTTP_PROXY`` set: the call goes to the proxy, asking for the server's URL (here
    a name that no resolver knows: only the proxy could have answered it)."""
    proxy = await reply(lambda _, n: _json(b"200 OK", CLAIMS))
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    async with AsyncClient("http://sqlq.invalid:8080") as c:
        assert await c.claim(["q"], worker="w") == []
    assert proxy.requests[0].startswith(b"POST http://sqlq.invalid:8080/claims HTTP/1.1\r\n")


async def test_a_long_poll_outlasts_the_read_timeout_and_nothing_else_does(
    reply: Callable[..., Awaitable[Served]],
) -> None:
    """A claim's ``wait_s`` is added to the read timeout: the server may hold its answer
    that long on purpose. A call that asks for no wait is cut off at the read timeout
    (``Unavailable``, no retry left). The server holds each answer 1 s, four read
    timeouts."""

    served = await reply(lambda _, n: _json(b"200 OK", CLAIMS), hold_s=1.0)
    async with AsyncClient(served.url, timeout=0.25, retries=0) as c:
        assert await c.claim(["q"], worker="w", wait_s=30.0) == []
        with pytest.raises(Unavailable, match="ReadTimeout"):
            await c.claim(["q"], worker="w")


def test_both_clients_give_a_long_poll_its_wait_on_top_of_the_read_timeout() -> None:
    """The timeouts each call asks httpx for: the client's, and for a long poll (a claim's
    ``wait_s``, ``wait``'s ``?wait=``) its read part lengthened by the wait."""
    asked: list[tuple[str, dict[str, float]]] = []

    def server(request: httpx.Request) -> httpx.Response:
        asked.append((request.url.path, request.extensions["timeout"]))
        if request.url.path == "/claims":
            return httpx.Response(200, content=CLAIMS)
        return httpx.Response(200, json=DONE)

    plain = {"connect": 5.0, "read": 5.0, "write": 5.0, "pool": 5.0}
    with Client("http://q", timeout=5.0, transport=httpx.MockTransport(server)) as c:
        c.claim(["q"], worker="w", wait_s=12.5)
        c.claim(["q"], worker="w")
        c.wait("j", within=20.0)
    assert asked[0] == ("/claims", {**plain, "read": 17.5})
    assert asked[1] == ("/claims", plain)
    assert asked[2][0] == "/jobs/j"
    assert 5.0 + 19.0 < asked[2][1]["read"] <= 5.0 + 20.0


async def test_the_async_client_asks_the_same_timeouts() -> None:
    asked: list[dict[str, float]] = []

    def server(request: httpx.Request) -> httpx.Response:
        asked.append(request.extensions["timeout"])
        return httpx.Response(200, content=CLAIMS)

    async with AsyncClient("http://q", timeout=5.0, transport=httpx.MockTransport(server)) as c:
        await c.claim(["q"], worker="w", wait_s=12.5)
        await c.claim(["q"], worker="w")
    assert [t["read"] for t in asked] == [17.5, 5.0]
    assert {t["connect"] for t in asked} == {5.0}


async def test_a_reply_lost_with_its_connection_is_sent_again_only_where_it_may_be(
    reply: Callable[..., Awaitable[Served]],
) -> None:
    """The server closes the connection of every other request unanswered: a heartbeat
    (safe to send again) is, on a new connection, and answered; a claim (its jobs would
    be held by the lost reply) is not: ``Unavailable``."""
    beat = _json(b"200 OK", b'{"items": [{"token": "t", "lease_until": 1.0}]}')
    served = await reply(lambda _, n: None if n % 2 else beat)
    async with AsyncClient(served.url, backoff_s=0.0) as c:
        beats = await c.heartbeat(["t"])
        assert [b.token for b in beats] == ["t"]
        with pytest.raises(Unavailable, match="unreachable"):
            await c.claim(["q"], worker="w")
    assert [r.split(b" ")[1] for r in served.requests] == [
        b"/claims/heartbeat", b"/claims/heartbeat", b"/claims"]  # fmt: skip
    assert served.connections == 2  # the claim went on the answered heartbeat's, kept


async def test_a_path_is_quoted_and_a_closed_client_sends_nothing(
    reply: Callable[..., Awaitable[Served]],
) -> None:
    served = await reply(lambda _, n: _json(b"200 OK", b"{}"))
    client = AsyncClient(served.url)
    assert await client._send(Call("POST", "/jobs/a b", dict, content=b"{}")) == {}
    assert served.requests[0].startswith(b"POST /jobs/a%20b HTTP/1.1\r\n")
    await client.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await client._send(Call("POST", "/claims", dict, content=b"{}"))
    assert len(served.requests) == 1
    with pytest.raises(ValueError, match="token: holds a line break"):
        AsyncClient(served.url, token="s3cret\n")


async def test_an_answer_past_its_bound_is_not_read_whole(
    reply: Callable[..., Awaitable[Served]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server's answer is an input like any other: one past ``MAX_ANSWER_BYTES`` fails
    the call (unavailable, as a broken connection does) instead of filling the memory."""
    monkeypatch.setattr(client_module, "MAX_ANSWER_BYTES", 1000)
    padded = b'{"claims": [], "pad": "' + b"x" * 2000 + b'"}'
    served = await reply(lambda _, n: _json(b"200 OK", padded))
    async with AsyncClient(served.url, retries=0) as c:
        with pytest.raises(Unavailable):
            await c.claim(["q"], worker="w")
    small = await reply(lambda _, n: _json(b"200 OK", CLAIMS))
    async with AsyncClient(small.url, retries=0) as c:
        assert await c.claim(["q"], worker="w") == []


class _Wire(asyncio.Transport):
    """A transport that keeps what is written to it (``AsyncioStream``'s writes)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return False

    reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


async def test_an_answer_read_slowly_pauses_reading_and_resumes_it_once_taken() -> None:
    """Backpressure: past ``READ_HIGH`` bytes waiting, the connection stops reading (the
    kernel's buffer, then the server, wait); once the reader is down to ``READ_LOW``, it
    reads again."""
    wire, inbox = _Wire(), http_asyncio._Inbox()
    inbox.connection_made(wire)
    stream = http_asyncio.AsyncioStream(wire, inbox)
    inbox.data_received(b"x" * http_asyncio.READ_HIGH)
    assert wire.reading
    inbox.data_received(b"x")
    assert not wire.reading
    left = http_asyncio.READ_HIGH + 1
    while left > http_asyncio.READ_LOW:
        assert not wire.reading
        left -= len(await stream.read(64 * 1024))
    assert wire.reading


async def test_a_wake_a_cancelled_request_cannot_use_goes_to_the_next() -> None:
    """A connection given back wakes the first request waiting; if that one is cancelled
    before it runs, the next one waiting is woken instead, not left to its pool timeout."""
    transport = http_asyncio.AsyncioTransport()
    taken = asyncio.ensure_future(_take_one(transport))
    await asyncio.sleep(0)  # it waits, first in line
    nxt = asyncio.get_running_loop().create_future()
    transport._waiters.append(nxt)  # another request waiting behind it
    transport._wake()  # a connection given back wakes the first ...
    taken.cancel()  # ... which is cancelled before it runs: the wake passes on
    with pytest.raises(asyncio.CancelledError):
        await taken
    assert nxt.done()


async def _take_one(transport: http_asyncio.AsyncioTransport) -> None:
    """A request that waits for a connection (none may open: the limit is reached)."""
    transport._open.update(object() for _ in range(http_asyncio.MAX_CONNECTIONS))  # type: ignore[misc]
    origin = httpcore.Origin(b"http", b"127.0.0.1", 9)
    await transport._take(origin, {"pool": None})


async def test_an_unknown_scheme_is_unsupported_protocol() -> None:
    transport = http_asyncio.AsyncioTransport()
    with pytest.raises(httpx.UnsupportedProtocol, match="ftp://"):
        await transport.handle_async_request(httpx.Request("GET", "ftp://127.0.0.1/x"))


async def test_a_requests_writes_go_out_as_one_at_its_first_read() -> None:
    """httpcore writes a request's head, body and end apart; the stream holds them and
    writes them as one at the first read (one segment for a small request), and writes
    at once what passes ``FLUSH_BYTES``."""
    wire = _Wire()
    inbox = http_asyncio._Inbox()
    stream = http_asyncio.AsyncioStream(wire, inbox)
    await stream.write(b"POST / HTTP/1.1\r\n\r\n")
    await stream.write(b"{}")
    await stream.write(b"")
    assert wire.writes == []
    inbox.data_received(b"HTTP/1.1 200 OK\r\n")
    assert await stream.read(4) == b"HTTP"
    assert wire.writes == [b"POST / HTTP/1.1\r\n\r\n{}"]
    assert await stream.read(100) == b"/1.1 200 OK\r\n"
    big = b"x" * http_asyncio.FLUSH_BYTES
    await stream.write(big)
    assert wire.writes[1:] == [big]
    inbox.connection_lost(None)
    assert await stream.read(100) == b""  # the end: httpcore reads it as the server's close


async def test_a_read_times_out_and_a_lost_connection_is_a_read_error() -> None:
    inbox = http_asyncio._Inbox()
    stream = http_asyncio.AsyncioStream(_Wire(), inbox)
    with pytest.raises(httpcore.ReadTimeout):
        await stream.read(10, timeout=0.01)
    assert inbox.waiter is None
    inbox.connection_lost(ConnectionResetError("reset by peer"))
    with pytest.raises(httpcore.ReadError, match="reset by peer"):
        await stream.read(10)
    assert http_asyncio.as_httpx(httpcore.ReadError("x")).__class__ is httpx.ReadError
    assert type(http_asyncio.as_httpx(httpcore.PoolTimeout("x"))) is httpx.PoolTimeout
    assert type(http_asyncio.as_httpx(ValueError("x"))) is ValueError


async def test_a_body_larger_than_a_write_arrives_whole(
    reply: Callable[..., Awaitable[Served]],
) -> None:
    """A 1 MiB body goes in parts (waiting for room as the server reads), and arrives
    whole; the connection is kept for the next call."""
    served = await reply(lambda _, n: _json(b"200 OK", b"{}"))
    big = b'{"pad": "' + b"x" * (1 << 20) + b'"}'
    async with AsyncClient(served.url, retries=0) as c:
        assert await c._send(Call("POST", "/a", dict, content=big)) == {}
        assert await c._send(Call("POST", "/b", dict, content=b"{}")) == {}
    assert served.requests[0].endswith(big)
    assert served.connections == 1


async def test_a_kept_connection_the_server_closed_is_not_used_again() -> None:
    """The server closes each connection after its answer, saying nothing: once the
    close has come, the pool sees the idle connection readable (``is_readable``) and
    opens another for the next call, rather than failing it."""

    async def on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        writer.write(_json(b"200 OK", b"{}"))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(on, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with AsyncClient(url, retries=0) as c:
        transport = c._http._transport_for_url(httpx.URL(url))
        assert isinstance(transport, http_asyncio.AsyncioTransport)
        for _ in range(3):
            assert await c._send(Call("POST", "/b", dict, content=b"{}")) == {}
            idle = transport.kept()
            for _ in range(500):  # until the close has come (or 5 s: then the assert says)
                if not idle or idle[0].has_expired():
                    break
                await asyncio.sleep(0.01)
            assert not idle or idle[0].has_expired()
    server.close()


async def test_a_refused_connection_is_unavailable_and_names_it() -> None:
    quiet = socket.socket()
    quiet.bind(("127.0.0.1", 0))
    port = quiet.getsockname()[1]
    quiet.close()  # nothing listens on it now
    async with AsyncClient(f"http://127.0.0.1:{port}", retries=0) as c:
        with pytest.raises(Unavailable, match="ConnectError"):
            await c.claim(["q"], worker="w")


def test_the_worker_loop_uvloop_carries_plain_and_tls_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``sqlq worker`` runs on uvloop: the same transport, its TLS handshake included
    (``start_tls``), there."""
    monkeypatch.setenv("SSL_CERT_FILE", str(TLS / "cert.pem"))
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(TLS / "cert.pem", TLS / "key.pem")

    async def on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await _request(reader)
                writer.write(_json(b"200 OK", CLAIMS))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> list[object]:
        got: list[object] = []
        for context, scheme in ((None, "http"), (tls, "https")):
            server = await asyncio.start_server(on, "127.0.0.1", 0, ssl=context)
            port = server.sockets[0].getsockname()[1]
            async with AsyncClient(f"{scheme}://127.0.0.1:{port}") as c:
                got.append(await c.claim(["q"], worker="w"))
                got.append(await c.claim(["q"], worker="w"))
            server.close()
        return got

    assert uvloop.run(main()) == [[], [], [], []]


async def test_requests_past_the_open_connections_wait_for_one_and_time_out_at_the_pool_timeout(
    reply: Callable[..., Awaitable[Served]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one connection allowed: two calls at once go one after the other on it; a
    call that cannot have it within its pool timeout is ``PoolTimeout`` (unavailable)."""
    monkeypatch.setattr(http_asyncio, "MAX_CONNECTIONS", 1)
    served = await reply(lambda _, n: _json(b"200 OK", CLAIMS), hold_s=0.2)
    async with AsyncClient(served.url, retries=0) as c:
        both = await asyncio.gather(c.claim(["q"], worker="a"), c.claim(["q"], worker="b"))
        assert list(both) == [[], []]
        assert served.connections == 1
    async with AsyncClient(served.url, retries=0, timeout=0.05) as c:
        held = asyncio.create_task(c.claim(["q"], worker="a", wait_s=5.0))
        for _ in range(1000):  # until the first holds the one connection (5 s at most)
            if len(served.requests) >= 3:
                break
            await asyncio.sleep(0.005)
        with pytest.raises(Unavailable, match="PoolTimeout"):
            await c.claim(["q"], worker="b")
        assert await held == []


async def test_a_client_given_no_url_or_token_takes_configures_then_the_environments(
    reply: Callable[..., Awaitable[Served]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Client()`` and ``AsyncClient()`` with ``SQLQ_URL`` and ``SQLQ_TOKEN`` set talk to
    that server with that token; ``sqlq.configure`` wins over them; an explicit argument
    over both."""
    served = await reply(lambda _, n: _json(b"200 OK", CLAIMS))
    other = await reply(lambda _, n: _json(b"200 OK", CLAIMS))
    monkeypatch.setenv("SQLQ_URL", served.url)
    monkeypatch.setenv("SQLQ_TOKEN", "from-env")
    async with AsyncClient() as c:
        assert await c.claim(["q"], worker="w") == []
    with Client() as sync:
        assert await asyncio.to_thread(sync.claim, ["q"], worker="w") == []
    assert [b"bearer from-env" in r.lower() for r in served.requests] == [True, True]
    sqlq.configure(url=other.url, token="from-code")
    try:
        async with AsyncClient() as c:
            assert c.url == other.url
            assert await c.claim(["q"], worker="w") == []
        assert b"bearer from-code" in other.requests[0].lower()
        assert AsyncClient(served.url, token="given").headers["Authorization"] == "Bearer given"
        assert AsyncClient(served.url).headers == {}  # a URL named here: no default token
    finally:
        sqlq.configure()
    assert AsyncClient().url == served.url
    monkeypatch.delenv("SQLQ_URL")
    monkeypatch.delenv("SQLQ_TOKEN")
    assert (AsyncClient().url, AsyncClient().headers) == ("http://127.0.0.1:8080", {})
