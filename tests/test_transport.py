"""``sqlq.transport.KeepAlive`` (``sqlq worker``'s HTTP transport) against small real
servers on 127.0.0.1: answers framed both ways, connections kept and reused, and every
failure as the httpx error the client's retries read."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from sqlq import AsyncClient, transport
from sqlq.calls import Call, FencedError, RateLimited
from sqlq.transport import MAX_IDLE, Direct, KeepAlive, for_url
from tests.helpers import wait_for

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Served:
    def __init__(self, url: str) -> None:
        self.url = url
        self.connections = 0
        self.requests: list[bytes] = []


async def _serve(answer: Answer) -> tuple[asyncio.Server, Served]:
    served = Served("")

    async def on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.connections += 1
        try:
            await answer(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on, "127.0.0.1", 0)
    served.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    return server, served


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Answer], Awaitable[Served]]]:
    servers: list[asyncio.Server] = []

    async def start(answer: Answer) -> Served:
        server, served = await _serve(answer)
        servers.append(server)
        return served

    yield start
    for s in servers:
        s.close()


Pick = Callable[[bytes, int], bytes]  # a request and its number (from 1): the bytes answered
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


@pytest.fixture
def reply(serve: Callable[[Answer], Awaitable[Served]]) -> Callable[[Pick], Awaitable[Served]]:
    """A server that answers each request on a connection, in turn, with what ``pick``
    makes of it (every request kept in ``Served.requests``)."""

    async def start(pick: Pick) -> Served:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while True:
                request = await _request(reader)
                served.requests.append(request)
                writer.write(pick(request, len(served.requests)))
                await writer.drain()

        served = await serve(answer)
        return served

    return start


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


async def test_answers_by_length_and_chunked_on_one_kept_connection(
    reply: Callable[[Pick], Awaitable[Served]],
) -> None:
    def pick(request: bytes, n: int) -> bytes:
        if n % 2:
            return _json(b"201 Created", b'{"n": 1}', b"Content-Type: application/json")
        return (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b'3\r\n{"n\r\n5\r\n": 2}\r\n0\r\n\r\n')  # fmt: skip

    served = await reply(pick)
    async with httpx.AsyncClient(base_url=served.url, transport=KeepAlive()) as http:
        first = await http.post("/claims?x=1", json={"queues": ["q"]})
        second = await http.get("/stats")
    assert (first.status_code, first.json()) == (201, {"n": 1})
    assert first.headers["content-type"] == "application/json"
    assert (second.status_code, second.json()) == (200, {"n": 2})
    assert served.connections == 1  # kept alive and used again
    assert served.requests[0].startswith(b"POST /claims?x=1 HTTP/1.1\r\n")
    assert served.requests[0].endswith(b'{"queues":["q"]}')
    assert b"\r\nhost: 127.0.0.1:" in served.requests[0].lower()


async def test_a_connection_the_server_closes_is_not_used_again(
    serve: Callable[[Answer], Awaitable[Served]],
) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        await writer.drain()

    served = await serve(answer)
    async with httpx.AsyncClient(base_url=served.url, transport=KeepAlive()) as http:
        for _ in range(3):
            assert (await http.get("/")).json() == {}
    assert served.connections == 3


async def test_a_server_that_closes_before_answering_is_a_protocol_error(
    serve: Callable[[Answer], Awaitable[Served]],
) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)  # then closes, unanswered

    served = await serve(answer)
    async with httpx.AsyncClient(base_url=served.url, transport=KeepAlive()) as http:
        with pytest.raises(httpx.RemoteProtocolError, match="before it answered"):
            await http.get("/")


async def test_garbage_for_an_answer_is_a_protocol_error(
    reply: Callable[[Pick], Awaitable[Served]],
) -> None:
    served = await reply(lambda _, n: b"SMTP ready\r\n\r\n")
    async with httpx.AsyncClient(base_url=served.url, transport=KeepAlive()) as http:
        with pytest.raises(httpx.RemoteProtocolError, match="malformed"):
            await http.get("/")


@pytest.mark.parametrize("past", ["headers", "bytes"])
async def test_an_answer_past_its_bounds_is_refused_and_its_connection_closed(
    reply: Callable[[Pick], Awaitable[Served]], monkeypatch: pytest.MonkeyPatch, past: str
) -> None:
    """A wrong ``--url`` may serve anything: an answer of more headers than
    ``MAX_HEADERS``, or more body than ``MAX_ANSWER_BYTES``, is an error, never read
    into memory whole, and the next call opens a connection of its own."""
    monkeypatch.setattr(transport, "MAX_ANSWER_BYTES", 1000)
    big = (_json(b"200 OK", b"{}", *[b"X-%d: 1" % i for i in range(transport.MAX_HEADERS + 1)])
           if past == "headers" else _json(b"200 OK", b" " * 1001))  # fmt: skip
    served = await reply(lambda _, n: big if n == 1 else OK)
    async with httpx.AsyncClient(base_url=served.url, transport=KeepAlive()) as http:
        with pytest.raises(httpx.RemoteProtocolError, match=f"more than [0-9]+ {past}"):
            await http.get("/")
        assert (await http.get("/")).json() == {}
    assert served.connections == 2


async def test_no_answer_within_the_read_timeout_is_a_read_timeout(
    serve: Callable[[Answer], Awaitable[Served]],
) -> None:
    gone = asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        await reader.read()  # never answers; returns once the client closed
        gone.set()

    served = await serve(answer)
    async with httpx.AsyncClient(base_url=served.url, transport=KeepAlive(),
                                 timeout=httpx.Timeout(5.0, read=0.05)) as http:  # fmt: skip
        with pytest.raises(httpx.ReadTimeout):
            await http.get("/")
    await gone.wait()  # the connection was closed, not left half-read


async def test_a_refused_connection_is_a_connect_error() -> None:
    with socket.socket() as held:  # bound, never listening: refused, and no one else's port
        held.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{held.getsockname()[1]}"
        async with httpx.AsyncClient(base_url=url, transport=KeepAlive()) as http:
            with pytest.raises(httpx.ConnectError):
                await http.get("/")


async def test_an_answer_nobody_asked_for_is_never_read_as_the_next_one(
    reply: Callable[[Pick], Awaitable[Served]],
) -> None:
    """A server that sends two answers to one request: the first is the answer, the
    connection is closed for the second, and the next request gets its own answer."""
    stray = _json(b"200 OK", b'{"n": 0}', b"X-Stray: 1")
    served = await reply(lambda _, n: _json(b"200 OK", b'{"n": %d}' % n) + stray)  # one write
    async with httpx.AsyncClient(base_url=served.url, transport=KeepAlive()) as http:
        first = await http.get("/")
        second = await http.get("/")
    assert (first.json(), second.json()) == ({"n": 1}, {"n": 2})  # not the stray {"n": 0}
    assert "x-stray" not in first.headers
    assert "x-stray" not in second.headers
    assert served.connections == 2


async def test_bytes_on_an_idle_connection_close_it(
    serve: Callable[[Answer], Awaitable[Served]],
) -> None:
    sent = asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        writer.write(OK)
        await writer.drain()
        if served.connections == 1:
            writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n{"n": 0}')
            await writer.drain()
            sent.set()
        await reader.read()

    served = await serve(answer)
    transport = KeepAlive()
    async with httpx.AsyncClient(base_url=served.url, transport=transport) as http:
        assert (await http.get("/")).json() == {}
        await sent.wait()
        await _until_idle_closed(transport)
        assert (await http.get("/")).json() == {}  # not the stray {"n": 0}
    assert served.connections == 2


async def test_an_idle_connection_the_server_closes_is_replaced(
    serve: Callable[[Answer], Awaitable[Served]],
) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)  # kept alive by its headers, then closed, as a server's
        writer.write(OK)  # keep-alive
        await writer.drain()  # timeout would

    served = await serve(answer)
    transport = KeepAlive()
    async with httpx.AsyncClient(base_url=served.url, transport=transport) as http:
        assert (await http.get("/")).json() == {}
        await _until_idle_closed(transport)
        assert (await http.get("/")).json() == {}
    assert served.connections == 2


async def test_interim_answers_are_skipped_and_an_upgrade_is_refused(
    reply: Callable[[Pick], Awaitable[Served]],
) -> None:
    def pick(request: bytes, n: int) -> bytes:
        if request.split(b" ")[1] == b"/hints":
            return b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" + OK
        return b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\nzz"

    served = await reply(pick)
    async with httpx.AsyncClient(base_url=served.url, transport=KeepAlive()) as http:
        hinted = await http.get("/hints")
        assert (hinted.status_code, hinted.json()) == (200, {})
        assert "link" not in hinted.headers  # the interim answer's headers are not the answer's
        with pytest.raises(httpx.RemoteProtocolError, match="switched protocols"):
            await http.get("/upgrade")


async def test_an_answer_in_one_byte_packets_is_read_whole(
    serve: Callable[[Answer], Awaitable[Served]],
) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        whole = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"3\r\n{\"n\r\n5\r\n\": 7}\r\n0\r\n\r\n")  # fmt: skip
        for i in range(len(whole)):
            writer.write(whole[i : i + 1])
            await writer.drain()
        await reader.read()

    served = await serve(answer)
    async with httpx.AsyncClient(base_url=served.url, transport=KeepAlive()) as http:
        assert (await http.get("/")).json() == {"n": 7}


async def test_a_streamed_body_goes_with_its_length_and_line_breaks_are_refused(
    reply: Callable[[Pick], Awaitable[Served]],
) -> None:
    async def parts() -> AsyncIterator[bytes]:
        yield b"ab"
        yield b"cd"

    served = await reply(lambda _, n: OK)
    async with httpx.AsyncClient(base_url=served.url, transport=KeepAlive()) as http:
        assert (await http.post("/", content=parts())).json() == {}
        with pytest.raises(httpx.LocalProtocolError, match="line break"):
            await http.get("/", headers={"x-a": "1\r\nx-b: 2"})
    sent = served.requests[0].lower()
    assert b"transfer-encoding" not in sent
    assert b"\r\ncontent-length: 4\r\n" in sent
    assert sent.endswith(b"abcd")


async def test_a_cancelled_request_closes_its_connection(
    serve: Callable[[Answer], Awaitable[Served]],
) -> None:
    asked, gone = asyncio.Event(), asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        if served.connections == 1:
            asked.set()
            await reader.read()  # never answers; returns once the client closed
            gone.set()
            return
        writer.write(OK)
        await writer.drain()
        await reader.read()

    served = await serve(answer)
    async with httpx.AsyncClient(base_url=served.url, transport=KeepAlive()) as http:
        pending = asyncio.ensure_future(http.get("/"))
        await asyncio.wait_for(asked.wait(), 10.0)
        pending.cancel()
        with pytest.raises(asyncio.CancelledError):
            await pending
        await asyncio.wait_for(gone.wait(), 10.0)  # closed, not left with an answer owed
        assert (await http.get("/")).json() == {}
    assert served.connections == 2


async def test_at_most_max_idle_connections_are_kept(
    serve: Callable[[Answer], Awaitable[Served]],
) -> None:
    wide = MAX_IDLE + 4
    arrived = asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            served.requests.append(await _request(reader))
            if len(served.requests) >= wide:
                arrived.set()
            await arrived.wait()  # hold the first round's answers until all are in flight
            writer.write(OK)
            await writer.drain()

    served = await serve(answer)
    transport = KeepAlive()
    async with httpx.AsyncClient(base_url=served.url, transport=transport) as http:
        await asyncio.gather(*(http.get("/") for _ in range(wide)))
        assert served.connections == wide
        assert len(transport._idle) == MAX_IDLE  # the other 4 closed as they finished
        await asyncio.gather(*(http.get("/") for _ in range(MAX_IDLE)))
    assert served.connections == wide  # the second round used only kept connections


async def test_only_plain_http_without_a_proxy_gets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert isinstance(for_url("http://sqlq:8080"), KeepAlive)
    assert for_url("https://sqlq:8080") is None  # TLS: httpx's own
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    assert for_url("http://sqlq:8080") is None  # a proxy applies: httpx's own
    with pytest.raises(httpx.UnsupportedProtocol):
        await KeepAlive().handle_async_request(httpx.Request("GET", "https://sqlq:8080/"))


async def _until_idle_closed(transport: KeepAlive) -> None:
    """Until the idle connection has seen the server's bytes or its close (loopback
    delivers them within a few turns of the loop)."""
    await wait_for(lambda: all(conn.closed for _, _, conn in transport._idle))


async def test_the_clients_protocol_calls_go_direct_with_its_head_and_base_path(
    reply: Callable[[Pick], Awaitable[Served]],
) -> None:
    """Over ``KeepAlive``, ``AsyncClient``'s protocol calls skip httpx's objects: the
    request carries the base URL's path, the token and the JSON type, and the answers
    read as httpx's would, errors included (a 429's Retry-After, a 409 fenced)."""

    answers = [
        _json(b"200 OK", b'{"claims": []}'),
        _json(b"429 Too Many Requests", b'{"error": "queue_full", "message": "full"}',
              b"Retry-After: 7"),
        _json(b"409 Conflict", b'{"error": "fenced", "message": "moved on", "field": "token"}'),
    ]  # fmt: skip
    served = await reply(lambda _, n: answers[n - 1])
    async with AsyncClient(served.url + "/base/", token="s3cret", transport=KeepAlive()) as c:
        assert await c.claim(["q"], worker="w", max=3) == []
        with pytest.raises(RateLimited) as limited:
            await c.claim(["q"], worker="w")
        assert limited.value.retry_after == 7.0
        with pytest.raises(FencedError, match="moved on"):
            await c.complete("t", None)
    first = served.requests[0]
    assert first.startswith(b"POST /base/claims HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer s3cret\r\n" in first
    assert b"\r\nContent-Type: application/json\r\n" in first
    assert b"user-agent" not in first.lower()  # httpx's client would have sent one
    assert served.connections == 1


async def test_what_direct_cannot_send_goes_through_httpx(
    reply: Callable[[Pick], Awaitable[Served]],
) -> None:
    """A path to quote goes through httpx's client (quoted); a token with a line break,
    credentials in the URL, or TLS get no ``Direct`` at all; and a closed client's calls
    fail as httpx's do, with no connection left open."""

    served = await reply(lambda _, n: OK)
    client = AsyncClient(served.url, transport=KeepAlive())
    call = Call("POST", "/jobs/a b", dict, content=b"{}")
    assert await client._send(call) == {}
    assert served.requests[0].startswith(b"POST /jobs/a%20b HTTP/1.1\r\n")
    assert b"user-agent" in served.requests[0].lower()  # httpx's client sent this one
    await client.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await client._send(Call("POST", "/claims", dict, content=b"{}"))
    assert len(served.requests) == 1
    with pytest.raises(ValueError, match="token: holds a line break"):
        AsyncClient(served.url, token="s3cret\n", transport=KeepAlive())
    keep = KeepAlive()
    assert Direct.for_client(keep, served.url, {"X-A": "1\r\nX-B: 2"}, 5.0) is None
    assert Direct.for_client(keep, "http://u:p@127.0.0.1:1", {}, 5.0) is None
    assert Direct.for_client(keep, "https://127.0.0.1:1", {}, 5.0) is None
    assert Direct.for_client(keep, served.url + "/?x=1", {}, 5.0) is None
    assert Direct.for_client(None, served.url, {}, 5.0) is None
    assert Direct.for_client(keep, served.url, {}, httpx.Timeout(5.0)) is None
    assert isinstance(Direct.for_client(keep, served.url, {}, 5.0), Direct)


async def test_a_call_that_ends_after_the_transport_closed_keeps_no_connection(
    serve: Callable[[Answer], Awaitable[Served]],
) -> None:
    asked, go = asyncio.Event(), asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        asked.set()
        await go.wait()
        writer.write(OK)
        await writer.drain()
        await reader.read()

    served = await serve(answer)
    keep = KeepAlive()
    direct = Direct.for_client(keep, served.url, {}, 5.0)
    assert direct is not None
    pending = asyncio.ensure_future(direct.call("POST", "/claims", b"{}"))
    await asyncio.wait_for(asked.wait(), 10.0)
    await keep.aclose()
    go.set()
    got = await pending
    assert got is not None
    assert got[0] == 200
    assert keep._idle == []  # closed, not kept
    with pytest.raises(httpx.TransportError, match="closed"):
        await direct.call("POST", "/claims", b"{}")
