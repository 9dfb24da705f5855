"""``sqlq.transport.KeepAlive`` (``sqlq worker``'s HTTP transport) against small real
servers on 127.0.0.1: answers framed both ways, connections kept and reused, and every
failure as the httpx error the client's retries read."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from sqlq.transport import KeepAlive, for_url

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


async def _request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


async def test_answers_by_length_and_chunked_on_one_kept_connection(
    serve: Callable[[Answer], Awaitable[Served]],
) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            served.requests.append(await _request(reader))
            if len(served.requests) % 2:
                writer.write(b"HTTP/1.1 201 Created\r\nContent-Length: 8\r\n"
                             b"Content-Type: application/json\r\n\r\n{\"n\": 1}")  # fmt: skip
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                             b"3\r\n{\"n\r\n5\r\n\": 2}\r\n0\r\n\r\n")  # fmt: skip
            await writer.drain()

    served = await serve(answer)
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
    serve: Callable[[Answer], Awaitable[Served]],
) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        writer.write(b"SMTP ready\r\n\r\n")
        await writer.drain()
        await reader.read()

    served = await serve(answer)
    async with httpx.AsyncClient(base_url=served.url, transport=KeepAlive()) as http:
        with pytest.raises(httpx.RemoteProtocolError, match="malformed"):
            await http.get("/")


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
    server, served = await _serve(lambda r, w: asyncio.sleep(0))
    server.close()
    await server.wait_closed()
    async with httpx.AsyncClient(base_url=served.url, transport=KeepAlive()) as http:
        with pytest.raises(httpx.ConnectError):
            await http.get("/")


async def test_only_plain_http_without_a_proxy_gets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert isinstance(for_url("http://sqlq:8080"), KeepAlive)
    assert for_url("https://sqlq:8080") is None  # TLS: httpx's own
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    assert for_url("http://sqlq:8080") is None  # a proxy applies: httpx's own
    with pytest.raises(httpx.UnsupportedProtocol):
        await KeepAlive().handle_async_request(httpx.Request("GET", "https://sqlq:8080/"))
