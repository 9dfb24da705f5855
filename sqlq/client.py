"""``Client`` and ``AsyncClient``: sqlq over HTTP, typed, on httpx.

    from sqlq import Client

    with Client("http://127.0.0.1:8080") as q:
        job = q.submit("resize", {"path": "a.png"})
        done = q.wait(job.id, timeout=30)

``submit`` sends an idempotency key (one it makes up if you give none) and
retries a request whose reply was lost (a connection error or timeout) with the
same key, so a retried submit returns the job the first attempt made instead of
making a second one. Errors are the server's, as exceptions: ``Invalid`` (400,
413, 415, 422; ``.field`` names what), ``Unauthorized``, ``NotFound``,
``Conflict``, ``RateLimited`` (``.retry_after``) and ``Unavailable`` (503, or the
server could not be reached).

A remote worker's side of the pull protocol is here too (``claim``, ``heartbeat``,
``complete``/``fail``/``snooze``/``checkpoint``/``release`` and the batch ``outcomes``,
answered as ``sqlq.common.protocol``'s structs); ``sqlq.Worker`` runs handlers over it.
A stale token is ``FencedError`` (409) for a single outcome, and a ``Reported`` with
``error="fenced"`` per item of a batch, so one stale item never hides the others.

Every request is written once (``Requests``), as a plan that yields the ``Call``s it
makes and is sent back their answers; ``Client`` runs a plan with blocking sends and
``AsyncClient`` with awaited ones, so only the sending differs. Both send through httpx,
for every URL: ``https://``, a proxy from the environment, HTTP/1.1 kept alive, all as
httpx does them. ``timeout`` bounds each step of a call (connect, write, read, a pooled
connection); a long poll (``claim``'s ``wait_s``, ``wait``) has its wait added to the read
part, so a short timeout never cuts off an answer the server holds on purpose.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import inspect
import ssl
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, Self, TypeVar, cast

import httpcore
import httpx

from sqlq.calls import (
    ApiError,
    Call,
    Conflict,
    FencedError,
    Invalid,
    NotFound,
    Plan,
    RateLimited,
    Requests,
    Unauthorized,
    Unavailable,
    pages,
)
from sqlq.common.errors import SqlqError
from sqlq.common.models import TERMINAL
from sqlq.common.protocol import MAX_CLAIM
from sqlq.common.roles import token_problem
from sqlq.common.specs import MAX_JOB_BYTES
from sqlq.common.wire import (
    BatchResult,
    CancelCounts,
    JobPage,
    QueueList,
    QueueView,
    Retried,
    ScheduleList,
    ScheduleView,
)
from sqlq.common.wire import JobView as Job  # a job as the API shows it
from sqlq.defaults import DEFAULT_URL, client_token, client_url
from sqlq.http_asyncio import AsyncioTransport

T = TypeVar("T")
P = ParamSpec("P")
# The largest answer a protocol call reads: a full claim of the largest jobs, with room.
MAX_ANSWER_BYTES = 4 * MAX_CLAIM * MAX_JOB_BYTES
MAX_ROUTES = 64  # paths whose URL and transport AsyncClient keeps (the protocol has 7)
_JSON = {"Content-Type": "application/json"}
_LEFT_OUT = {b"accept", b"accept-encoding", b"connection"}  # (_Route.head: identity asked)

# httpcore asks ``import sniffio`` for every request's locks; without sniffio installed
# (anyio 4 no longer needs it) each ask is a failed import that searches sys.path again:
# 270 us a request here, measured, more than the request itself costs the client. Its
# absence is remembered once (None in sys.modules: the import fails at once, as before).
if "sniffio" not in sys.modules and importlib.util.find_spec("sniffio") is None:
    sys.modules["sniffio"] = None  # type: ignore[assignment]


class _Route:
    """Where ``AsyncClient._exchange`` sends one path: its URL (as httpx and as httpcore
    take it) and the transport httpx's client picks for it."""

    __slots__ = ("core", "head", "transport", "url")

    def __init__(
        self, url: httpx.URL, transport: httpx.AsyncBaseTransport, headers: httpx.Headers
    ) -> None:
        self.url = url
        self.transport = transport
        self.core = httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port,
                                 target=url.raw_path)  # fmt: skip
        # Host, then the client's own headers and the JSON type, less what asks for what
        # the short way does not read (``Accept-Encoding``: the body is read as it comes)
        # or says what HTTP/1.1 means anyway (``Accept: */*``, ``Connection: keep-alive``)
        self.head = [(b"Host", url.netloc), (b"Accept-Encoding", b"identity"),
                     *((k, v) for k, v in headers.raw if k.lower() not in _LEFT_OUT)]  # fmt: skip

    def headers(self, content: bytes) -> list[tuple[bytes, bytes]]:
        return [*self.head, (b"Content-Length", b"%d" % len(content))]


class _AsyncHttpx(httpx.AsyncClient):
    """httpx's client, whose transport for a direct URL (one no proxy from the environment
    takes: those stay httpx's mounts) is ``AsyncioTransport``, unless one is given."""

    def _init_transport(  # type: ignore[override]
        self,
        *,
        verify: ssl.SSLContext | str | bool = True,
        trust_env: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        **_: Any,
    ) -> httpx.AsyncBaseTransport:
        if transport is not None:
            return transport
        return AsyncioTransport(verify=verify, trust_env=trust_env)


def _header(headers: list[tuple[bytes, bytes]], name: str) -> str | None:
    """An answer's header by its lowercase name (httpcore's headers: a list of pairs)."""
    key = name.encode()
    return next((v.decode("latin-1") for k, v in headers if k.lower() == key), None)


class _Base:
    def __init__(
        self, url: str | None, token: str | None, timeout: float, retries: int, backoff_s: float
    ) -> None:
        # not given: ``sqlq.configure``'s, else SQLQ_URL / SQLQ_TOKEN (``sqlq.defaults``)
        # the default token goes only to the default server: a URL named here gets none
        token = token if url is not None else client_token(token)
        self.url = client_url(url).rstrip("/")
        self.timeout = httpx.Timeout(timeout)
        self.retries = retries
        self.backoff_s = backoff_s
        problem = token_problem(token) if token else None  # (no token: no header)
        if problem is not None:
            raise ValueError(f"token: {problem} (it goes in a header)")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _timeout_of(self, call: Call[Any]) -> httpx.Timeout:
        """``call``'s timeout: the client's, its read part lengthened by the wait ``call``
        asks the server to hold its answer (a long poll), which is no sign of trouble."""
        t = self.timeout
        if not call.wait_s or t.read is None:
            return t
        return httpx.Timeout(t.connect, read=t.read + call.wait_s, write=t.write, pool=t.pool)

    def _backoff(self, call: Call[Any], attempt: int, exc: httpx.TransportError) -> float:
        """How long to wait before sending ``call`` again after its ``attempt`` (from 0)
        was lost; ``Unavailable`` if it may not be sent again."""
        if not call.retry or attempt >= self.retries:
            raise Unavailable(0, "unreachable", f"{self.url}: {type(exc).__name__}: {exc}") from exc
        return self.backoff_s * 2.0**attempt


def _method(plan: Callable[..., Any], owner: str, run: Callable[..., Any]) -> Any:
    """``run`` dressed as the method the plan describes: its name, docstring and signature
    (with ``self``), so ``help()`` and ``inspect`` show what the plan takes."""
    functools.update_wrapper(run, plan)
    run.__qualname__ = f"{owner}.{plan.__name__}"
    signature = inspect.signature(plan)
    this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    returns = signature.return_annotation  # "Plan[Job]": the method returns (or awaits) a Job
    if isinstance(returns, str) and returns.startswith("Plan[") and returns.endswith("]"):
        returns = returns[len("Plan[") : -1]
    run.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[this, *signature.parameters.values()], return_annotation=returns
    )
    return run


def _blocking(plan: Callable[P, Plan[T]]) -> Callable[Concatenate[Client, P], T]:
    def method(self: Client, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(plan(*args, **kwargs))

    return cast("Callable[Concatenate[Client, P], T]", _method(plan, "Client", method))


def _awaited(
    plan: Callable[P, Plan[T]],
) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]:
    async def method(self: AsyncClient, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._run(plan(*args, **kwargs))

    return cast(
        "Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]",
        _method(plan, "AsyncClient", method),
    )


class Client(_Base):
    """The synchronous client."""

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        timeout: float = 75.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(url, token, timeout, retries, backoff_s)
        self._http = httpx.Client(
            base_url=self.url, headers=self.headers, timeout=self.timeout, transport=transport
        )

    @property
    def closed(self) -> bool:
        """Closed: it sends nothing more."""
        return self._http.is_closed

    def _send(self, call: Call[T]) -> T:
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    call.method, call.path, timeout=self._timeout_of(call), **call.sent()
                )
            except httpx.TransportError as exc:
                time.sleep(self._backoff(call, attempt, exc))
                attempt += 1
                continue
            return call.answer(response)

    def _run(self, plan: Plan[T]) -> T:
        try:
            call = next(plan)
            while True:
                call = plan.send(self._send(call))
        except StopIteration as done:
            return cast(T, done.value)

    submit = _blocking(Requests.submit)
    submit_many = _blocking(Requests.submit_many)
    submit_workflow = _blocking(Requests.submit_workflow)
    workflow = _blocking(Requests.workflow)
    cancel_workflow = _blocking(Requests.cancel_workflow)
    retry_workflow = _blocking(Requests.retry_workflow)
    get = _blocking(Requests.get)
    wait = _blocking(Requests.wait)
    list = _blocking(Requests.list)
    cancel = _blocking(Requests.cancel)
    cancel_matching = _blocking(Requests.cancel_matching)
    retry = _blocking(Requests.retry)
    retry_all = _blocking(Requests.retry_all)
    queues = _blocking(Requests.queues)
    pause = _blocking(Requests.pause)
    set_policy = _blocking(Requests.set_policy)
    set_key_policy = _blocking(Requests.set_key_policy)
    stats = _blocking(Requests.stats)
    put_schedule = _blocking(Requests.put_schedule)
    schedules = _blocking(Requests.schedules)
    schedule = _blocking(Requests.schedule)
    delete_schedule = _blocking(Requests.delete_schedule)
    pause_schedule = _blocking(Requests.pause_schedule)
    trigger = _blocking(Requests.trigger)
    claim = _blocking(Requests.claim)
    report_and_claim = _blocking(Requests.report_and_claim)
    heartbeat = _blocking(Requests.heartbeat)
    complete = _blocking(Requests.complete)
    fail = _blocking(Requests.fail)
    snooze = _blocking(Requests.snooze)
    checkpoint = _blocking(Requests.checkpoint)
    parents = _blocking(Requests.parents)
    release = _blocking(Requests.release)
    outcomes = _blocking(Requests.outcomes)
    workers = _blocking(Requests.workers)

    def jobs(self, **filters: Any) -> Iterator[Job]:
        """Every matching job, page after page."""
        plan = pages(filters)
        while plan is not None:
            page = self._run(plan)
            yield from page.jobs
            plan = pages(filters, page)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncClient(_Base):
    """The asyncio client: the same methods, awaited."""

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        timeout: float = 75.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(url, token, timeout, retries, backoff_s)
        self._http = _AsyncHttpx(
            base_url=self.url, headers=self.headers, timeout=self.timeout, transport=transport
        )
        # what _exchange sends with every body: the client's headers, made once
        self._encoded = httpx.Headers({**self._http.headers, **_JSON})
        self._routes: dict[str, _Route] = {}

    @property
    def closed(self) -> bool:
        """Closed: it sends nothing more."""
        return self._http.is_closed

    async def _send(self, call: Call[T]) -> T:
        encoded = call.content is not None and not call.params and not call.headers
        attempt = 0
        while True:
            try:
                if encoded:
                    return await self._exchange(call)
                response = await self._http.request(
                    call.method, call.path, timeout=self._timeout_of(call), **call.sent()
                )
            except httpx.TransportError as exc:
                await asyncio.sleep(self._backoff(call, attempt, exc))
                attempt += 1
                continue
            return call.answer(response)

    async def _exchange(self, call: Call[T]) -> T:
        """``call``, a body encoded already with no query or headers of its own (the pull
        protocol's calls, many a second from a worker), handed straight to the transport
        that httpx's client picks for its URL, and its answer read whole, bounded. Through
        the client itself, each call's URL was parsed and merged with the base, its
        headers merged, its answer's cookies looked for and its body wrapped twice, and a
        remote no-op job's calls are most of what its worker spends. The URL and the
        transport are looked up once a path instead; on ``AsyncioTransport`` (every
        direct URL, by default) no httpx request or response is made either. TLS,
        proxies (the client's mounts), timeouts and errors are httpx's, as through the
        client."""
        if self._http.is_closed:
            raise RuntimeError("Cannot send a request, as the client has been closed.")
        route = self._routes.get(call.path)
        if route is None:
            url = httpx.URL(self.url + call.path)
            route = _Route(url, self._http._transport_for_url(url), self._encoded)  # (its mount)
            if len(self._routes) < MAX_ROUTES:
                self._routes[call.path] = route
        timeout = self._timeout_of(call).as_dict()
        assert call.content is not None
        if isinstance(route.transport, AsyncioTransport):
            status, headers, body = await route.transport.exchange(
                call.method.encode(), route.core, route.headers(call.content), call.content,
                timeout,
                MAX_ANSWER_BYTES,
            )  # fmt: skip
            return call.read(status, body, functools.partial(_header, headers))
        request = httpx.Request(call.method, route.url, headers=self._encoded,
                                content=call.content, extensions={"timeout": timeout})  # fmt: skip
        response = await route.transport.handle_async_request(request)
        try:  # read whole, but bounded: a server's answer is an input like any other
            chunks, size = [], 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise httpx.RemoteProtocolError(f"an answer of more than {MAX_ANSWER_BYTES} "
                                                    "bytes")  # fmt: skip
                chunks.append(chunk)
        finally:
            await response.aclose()
        return call.read(response.status_code, b"".join(chunks), response.headers.get)

    async def _run(self, plan: Plan[T]) -> T:
        try:
            call = next(plan)
            while True:
                call = plan.send(await self._send(call))
        except StopIteration as done:
            return cast(T, done.value)

    submit = _awaited(Requests.submit)
    submit_many = _awaited(Requests.submit_many)
    submit_workflow = _awaited(Requests.submit_workflow)
    workflow = _awaited(Requests.workflow)
    cancel_workflow = _awaited(Requests.cancel_workflow)
    retry_workflow = _awaited(Requests.retry_workflow)
    get = _awaited(Requests.get)
    wait = _awaited(Requests.wait)
    list = _awaited(Requests.list)
    cancel = _awaited(Requests.cancel)
    cancel_matching = _awaited(Requests.cancel_matching)
    retry = _awaited(Requests.retry)
    retry_all = _awaited(Requests.retry_all)
    queues = _awaited(Requests.queues)
    pause = _awaited(Requests.pause)
    set_policy = _awaited(Requests.set_policy)
    set_key_policy = _awaited(Requests.set_key_policy)
    stats = _awaited(Requests.stats)
    put_schedule = _awaited(Requests.put_schedule)
    schedules = _awaited(Requests.schedules)
    schedule = _awaited(Requests.schedule)
    delete_schedule = _awaited(Requests.delete_schedule)
    pause_schedule = _awaited(Requests.pause_schedule)
    trigger = _awaited(Requests.trigger)
    claim = _awaited(Requests.claim)
    report_and_claim = _awaited(Requests.report_and_claim)
    heartbeat = _awaited(Requests.heartbeat)
    complete = _awaited(Requests.complete)
    fail = _awaited(Requests.fail)
    snooze = _awaited(Requests.snooze)
    checkpoint = _awaited(Requests.checkpoint)
    parents = _awaited(Requests.parents)
    release = _awaited(Requests.release)
    outcomes = _awaited(Requests.outcomes)
    workers = _awaited(Requests.workers)

    async def jobs(self, **filters: Any) -> AsyncIterator[Job]:
        """Every matching job, page after page."""
        plan = pages(filters)
        while plan is not None:
            page = await self._run(plan)
            for job in page.jobs:
                yield job
            plan = pages(filters, page)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


# The methods' return types and the error base stay importable from here, as before.
__all__ = [
    "DEFAULT_URL",
    "TERMINAL",
    "ApiError",
    "AsyncClient",
    "BatchResult",
    "Call",
    "CancelCounts",
    "Client",
    "Conflict",
    "FencedError",
    "Invalid",
    "Job",
    "JobPage",
    "NotFound",
    "QueueList",
    "QueueView",
    "RateLimited",
    "Retried",
    "ScheduleList",
    "ScheduleView",
    "SqlqError",
    "Unauthorized",
    "Unavailable",
]
