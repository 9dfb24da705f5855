"""A trivial endpoint: a bare ASGI app on the same uvicorn/uvloop/httptools stack.

It reads the request body and answers 201 with a fixed id: no framework, no
work. The load generator's rate against it is the ceiling of the client plus
the HTTP server on this machine; a rate measured against sqlq near it would
be a client limit, not a server limit.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

_BODY = b'{"id":"0"}'
_HEADERS = [(b"content-type", b"application/json"), (b"content-length", b"10")]

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 201, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": _BODY})


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(
        app,
        host="127.0.0.1",
        port=int(sys.argv[1]),
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
        proxy_headers=False,
        lifespan="off",
    )
