"""The benchmark's keep-alive client when its server dies: every borrower gets an error.

A pooled connection that the server closed is put back as it is and replaced by the next
borrower; replacing it while handing it back raised when nothing listened any more, so the
connection never went back and the pool's other users waited for ever (a PostgreSQL crash
trial hung 14 minutes on it).
"""

from __future__ import annotations

import asyncio

from sqlq.bench.client.http import HttpPool


async def test_a_dead_server_fails_every_borrower_and_hangs_none() -> None:
    async def answer_once_then_close(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()  # the server goes away mid-request: no answer

    server = await asyncio.start_server(answer_once_then_close, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with HttpPool(f"http://127.0.0.1:{port}", 1) as pool:
        server.close()
        await server.wait_closed()  # nothing listens now: a reconnect is refused
        first = asyncio.create_task(pool.request("POST", "/jobs", b"{}"))
        second = asyncio.create_task(pool.request("POST", "/jobs", b"{}"))
        done = await asyncio.wait_for(
            asyncio.gather(first, second, return_exceptions=True), timeout=30
        )
    assert all(isinstance(r, OSError) for r in done), done
