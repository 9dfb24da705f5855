"""What a request must pass before any handler sees it.

One pure ASGI middleware, in this order:

1. **Host** (421): while the server is bound to loopback, a request whose
   ``Host`` is not ``localhost``, ``127.0.0.1`` or ``[::1]`` (any port), or a
   name added with ``--allowed-host``, is refused. A web page that rebinds its
   own DNS name to 127.0.0.1 still sends its own name as ``Host``. On any other
   binding the ``--allowed-host`` names, when given, are the only ones answered.
   Loopback means an address ``ipaddress`` calls loopback, or a name all of
   whose addresses are (``127.evil.example`` is a name like any other).
2. **Token** (401): with ``--token`` or ``--token-file`` set, every path except the
   probes (``/healthz``, ``/readyz``) needs ``Authorization: Bearer <token>``, found
   in the ``Roster`` in constant time; the ``Principal`` it names goes into the
   request's scope (``sqlq.http.access.PRINCIPAL``), where each route's rule checks
   its role (403, ``sqlq.http.access``). Without a token every request is ``ADMIN``'s.
   A client address that sent ``MAX_FAILURES`` wrong ones in a minute gets 429 with
   ``Retry-After`` instead, its token not even looked up (``sqlq.throttle``): others
   are not affected.
3. **Origin** (403): a browser sends ``Origin`` with every cross-site POST; one
   that names another host than ``Host`` is refused, so a page elsewhere cannot
   drive the API even on loopback without a token.
4. **Content type** (415): a body must be ``application/json`` or
   ``application/*+json``. An HTML form cannot send those cross-site without a
   CORS preflight, which this server never grants.

Paths under a ``delegated`` prefix (the dashboard, ``/ui``) pass 1 and 3 here
and bring their own 2 and 4: a browser cannot put a bearer header on a link or
a JSON body in a form, so the dashboard checks a session cookie and a CSRF
field instead (``sqlq.ui.app``).

It is plain ASGI, not Starlette's ``BaseHTTPMiddleware``, because it runs on
every request and the latter wraps each one in extra tasks and streams.

Every answer carries ``NOSNIFF`` (``X-Content-Type-Options: nosniff``, so a
browser never reads a JSON body that quotes a request back as HTML or script): a
refusal here, a handler's, an error's, a 500's, the dashboard's and ``/openapi.json``.
Under ``sqlq serve`` uvicorn sends it with every answer, its own 400s included
(``SERVED_HEADERS``, its ``headers`` setting: no ASGI layer, which cost 15k instructions
a request, measured); the 431 that ``sqlq.http.head`` writes itself spells it too. An
app served otherwise (in-process, another server) has ``Stamped`` wrapped around it
instead (``create_app``), outside Starlette's server-error layer too.
"""

from __future__ import annotations

import ipaddress
import math
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sqlq.common.roles import ADMIN, MIN_TOKEN_LENGTH, Principal, Roster, roster
from sqlq.http.access import PRINCIPAL
from sqlq.throttle import Throttle

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]", "::1"})
PROBES = frozenset({"/healthz", "/readyz"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# What every answer carries (the module's docstring): sent by uvicorn under ``sqlq serve``
# (``SERVED_HEADERS``), set by ``Stamped`` otherwise, spelt by the 431.
NOSNIFF = (b"x-content-type-options", b"nosniff")
SERVED_HEADERS = [(NOSNIFF[0].decode(), NOSNIFF[1].decode())]  # uvicorn's ``headers``

__all__ = ["MIN_TOKEN_LENGTH", "Guard", "Security", "is_loopback"]  # MIN_...: the CLI's


def _addresses(name: str) -> list[str]:
    """Every address ``name`` resolves to (``OSError`` if it does not)."""
    return [str(info[4][0]) for info in socket.getaddrinfo(name, None)]


def is_loopback(host: str, resolve: Callable[[str], list[str]] = _addresses) -> bool:
    """Whether binding to ``host`` keeps the server on this machine only: a loopback
    address, or a name whose every address is one (resolved with ``resolve``)."""
    name = host.strip()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    if not name:
        return False
    try:
        found = resolve(name)
    except (OSError, UnicodeError):
        return False
    try:
        return bool(found) and all(ipaddress.ip_address(a).is_loopback for a in found)
    except ValueError:  # an address we cannot judge (a scoped IPv6 one, say): not loopback
        return False


@dataclass(frozen=True, kw_only=True)
class Security:
    # --token, the admin's; None: no token asked (only allowed on loopback, or by override)
    token: str | None = field(default=None, repr=False)
    # --token-file's (secret, principal) pairs (``sqlq.common.roles.read_token_file``)
    principals: tuple[tuple[str, Principal], ...] = field(default=(), repr=False)
    # Host names accepted in the Host header; None: any (not on loopback, no --allowed-host).
    allowed_hosts: frozenset[str] | None = LOOPBACK_HOSTS
    extra_hosts: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def for_binding(
        cls,
        host: str,
        token: str | None,
        extra_hosts: tuple[str, ...] = (),
        principals: tuple[tuple[str, Principal], ...] = (),
    ) -> Security:
        extra = frozenset(h.lower() for h in extra_hosts)
        allowed = LOOPBACK_HOSTS | extra if is_loopback(host) else (extra or None)
        return cls(token=token, principals=principals, allowed_hosts=allowed, extra_hosts=extra)

    @property
    def required(self) -> bool:
        """Whether a request needs a token at all."""
        return self.token is not None or bool(self.principals)

    def roster(self) -> Roster | None:
        """Everyone the tokens name (a new ``Roster``: build it once per app)."""
        return roster(self.token, self.principals)


HOSTS_REMEMBERED = 64  # distinct ``Host`` headers whose verdict is kept (then forgotten)


def _host_name(value: str) -> str:
    """``Host`` without its port: ``[::1]:8080`` -> ``[::1]``, ``a:80`` -> ``a``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _origin_authority(origin: str) -> str | None:
    """``https://a.example:8080`` -> ``a.example:8080``; None for ``null`` or junk."""
    if "://" not in origin:
        return None
    return origin.split("://", 1)[1].split("/", 1)[0].lower()


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/json":
        return True
    return media.startswith("application/") and media.endswith("+json")


Refusal = tuple[int, str, str, str, list[tuple[bytes, bytes]]]


def _none(method: str, path: str) -> None:
    """No fast route: every request goes to the app."""


class Stamped:
    """``app`` with ``NOSNIFF`` on every HTTP answer it starts, where no server adds it
    (``sqlq serve``'s uvicorn does: ``SERVED_HEADERS``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [*message.get("headers", ())]
                if NOSNIFF not in headers:
                    headers.append(NOSNIFF)
                message["headers"] = headers  # (a message is handed over, not kept: no copy)
            await send(message)

        await self.app(scope, receive, stamped)


class Guard:
    """Every request's checks; then the app, or a route's fast path.

    ``fast`` gives, for ``(method, path)``, an ASGI app that answers that route
    without the router and exception middleware between, or None (``sqlq.http.lean``:
    the job's own routes, the hot path); it must answer every error itself.
    """

    def __init__(
        self,
        app: ASGIApp,
        security: Security,
        fast: Callable[[str, str], ASGIApp | None] | None = None,
        delegated: tuple[str, ...] = (),
        throttle: Throttle | None = None,
        roster: Roster | None = None,
    ) -> None:
        self.app = app
        self.security = security
        self.throttle = throttle or Throttle()
        self._roster = roster if roster is not None else security.roster()
        self._fast = fast or _none
        self._delegated = delegated
        self._delegated_paths = frozenset(delegated)
        self._delegated_prefixes = tuple(p + "/" for p in delegated)  # (one C call a request)
        self._hosts: dict[bytes, bool] = {}  # ``Host`` headers seen: allowed or not

    def _host_allowed(self, raw: bytes, host: str) -> bool:
        """Whether ``Host`` names this server (``--allowed-host``), remembered by the raw
        header: every request asks, and clients send one or two names."""
        known = self._hosts
        allowed = known.get(raw)
        if allowed is None:
            allowed = _host_name(host) in (self.security.allowed_hosts or ())
            if len(known) >= HOSTS_REMEMBERED:  # (made-up names can only empty it)
                known.clear()
            known[raw] = allowed
        return allowed

    def _own_checks(self, path: str) -> bool:
        """Whether ``path`` is under a prefix that checks its own token and content type."""
        return path in self._delegated_paths or path.startswith(self._delegated_prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._other(scope, receive, send)
            return
        refusal = self.check(scope)
        if refusal is None:
            fast = self._fast(scope["method"], scope["path"])
            await (fast or self.app)(scope, receive, send)
            return
        status, code, message, header, extra = refusal
        body = msgspec.json.encode({"error": code, "message": message, "field": header})
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *extra,
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _other(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Lifespan passes; a WebSocket is refused before it is accepted (sqlq serves none,
        and ``sqlq serve`` runs uvicorn with ``ws="none"``); any other type is an error."""
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})  # policy violation
        else:
            raise RuntimeError(f"unsupported ASGI scope type {scope['type']!r}")

    def check(self, scope: Scope) -> Refusal | None:
        """Why the request is refused (status, code, message, header, extra headers); on
        the way, the principal its token names goes into ``scope``."""
        headers: dict[bytes, bytes] = {}
        for k, v in scope["headers"]:
            headers.setdefault(k, v)  # the first of a repeated header
        sec = self.security
        raw_host = headers.get(b"host", b"")
        host = raw_host.decode("latin-1")
        if sec.allowed_hosts is not None and not self._host_allowed(raw_host, host):
            return (
                421,
                "misdirected",
                "this server answers only to its own names (see --allowed-host)",
                "host",
                [],
            )
        own = bool(self._delegated) and self._own_checks(scope["path"])
        if self._roster is None:
            scope[PRINCIPAL] = ADMIN
        elif scope["path"] not in PROBES and not own:
            client = scope.get("client")
            address = client[0] if client else None
            wait = self.throttle.retry_after(address)
            if wait is not None:  # refused before the compare: no oracle while throttled
                return (
                    429,
                    "too_many_attempts",
                    "too many wrong tokens from this address lately: try again later",
                    "authorization",
                    [(b"retry-after", str(max(1, math.ceil(wait))).encode())],
                )
            given = headers.get(b"authorization", b"")
            scheme, _, credential = given.partition(b" ")
            who = self._roster.find(credential) if scheme.lower() == b"bearer" else None
            if who is None:
                if given:  # a guess; a request without the header guesses nothing
                    self.throttle.failed(address)
                return (
                    401,
                    "unauthorized",
                    "a valid Authorization: Bearer <token> header is required",
                    "authorization",
                    [(b"www-authenticate", b'Bearer realm="sqlq"')],
                )
            scope[PRINCIPAL] = who
        origin = headers.get(b"origin")
        if origin is not None:
            authority = _origin_authority(origin.decode("latin-1"))
            if authority != host.strip().lower():
                return (403, "cross_origin", "cross-origin requests are refused", "origin", [])
        method: Any = scope["method"]
        if method in BODY_METHODS and not own:
            content_type = headers.get(b"content-type")
            has_body = b"transfer-encoding" in headers or headers.get(
                b"content-length", b"0"
            ) not in (b"0", b"")
            if (content_type is not None or has_body) and not _is_json(
                (content_type or b"").decode("latin-1")
            ):
                return (
                    415,
                    "unsupported_media_type",
                    "the body must be application/json",
                    "content-type",
                    [],
                )
        return None
