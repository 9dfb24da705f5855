"""uvicorn's httptools protocol with the request head (request line and headers) capped.

httptools has no limit of its own: it gathers a header's value chunk by chunk
(``bytes +=``) before it calls ``on_header``, so one unauthenticated request
with a 64 MiB header cost ~107 MiB of RSS before the Guard ever saw it.
Counting in ``on_url``/``on_header`` would be too late for the same reason,
so this counts the bytes handed to the parser while a head is incomplete and
answers 431 once they pass ``MAX_HEAD``; a chunk that crosses the limit is fed
up to it, and the rest only if the head ended inside it. Bytes of a body are
not counted. A request head can only come after the previous message
completes, so the count restarts there.

``MAX_HEAD`` is 32 KiB: what nginx passes by default (``large_client_header_buffers
4 8k``), twice Node's 16 KiB, and ~100x a request sqlq's own clients send.
"""

from __future__ import annotations

import msgspec
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sqlq.http.guard import NOSNIFF

MAX_HEAD = 32 << 10

_BODY = msgspec.json.encode(
    {
        "error": "header_too_large",
        "message": f"the request line and headers are larger than {MAX_HEAD} bytes",
        "field": "headers",
    }
)
REFUSAL = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"content-type: application/json\r\n"
    b"content-length: %d\r\n"
    b"connection: close\r\n"
    b"%s: %s\r\n\r\n%s" % (len(_BODY), *NOSNIFF, _BODY)
)


class BoundedHttpTools(HttpToolsProtocol):
    """``HttpToolsProtocol`` that closes a connection whose request head passes ``MAX_HEAD``."""

    _head: int | None = 0  # bytes fed while the current head is incomplete; None in a body

    def data_received(self, data: bytes) -> None:
        head = self._head
        if head is None:
            super().data_received(data)
            return
        if head + len(data) <= MAX_HEAD:
            self._head = head + len(data)
            super().data_received(data)
            return
        room = MAX_HEAD - head
        self._head = MAX_HEAD
        super().data_received(data[:room])
        if self.transport.is_closing():  # the parser refused it, or the client left
            return
        if self._head is not None:  # still inside the head at the limit
            self._refuse()
            return
        self.data_received(data[room:])

    def _refuse(self) -> None:
        self.logger.warning("request head larger than %d bytes: refused (431)", MAX_HEAD)
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(REFUSAL)  # else a response is under way: just close
        self.transport.close()

    def on_headers_complete(self) -> None:
        self._head = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._head = 0
        super().on_message_complete()
