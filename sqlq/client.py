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
server could not be reached). Both clients share every request and every
parse; only the sending differs.
"""

from __future__ import annotations

import asyncio
import builtins
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
import msgspec

from sqlq.common.errors import SqlqError
from sqlq.common.models import TERMINAL, Job
from sqlq.common.wire import BatchResult, JobPage, QueueList, QueueView, Retried

T = TypeVar("T")
DEFAULT_URL = "http://127.0.0.1:8080"


class ApiError(SqlqError):
    """An error answer from the server (or no answer at all)."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(f"{status} {code}: {message}" + (f" ({field})" if field else ""))
        self.status, self.code, self.message, self.field = status, code, message, field


class Invalid(ApiError):
    """The request was wrong (400, 413, 415, 422); ``field`` names what."""


class Unauthorized(ApiError):
    """No token, a wrong one, or a request the server refuses on principle (401, 403, 421)."""


class NotFound(ApiError):
    """No such job (404)."""


class Conflict(ApiError):
    """The job is not in a state that allows it, or a key was reused (409)."""


class RateLimited(ApiError):
    """The queue is full (429); try again after ``retry_after`` seconds."""

    retry_after: float = 1.0


class Unavailable(ApiError):
    """The server is not ready, its store failed (503), or it could not be reached."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: Invalid,
    413: Invalid,
    415: Invalid,
    422: Invalid,
    401: Unauthorized,
    403: Unauthorized,
    421: Unauthorized,
    404: NotFound,
    409: Conflict,
    429: RateLimited,
}


@dataclass(frozen=True, slots=True)
class Call:
    """One request, built the same way for both clients."""

    method: str
    path: str
    json: Any = None
    params: Mapping[str, Any] | None = None
    headers: Mapping[str, str] | None = None
    retry: bool = False  # safe to send again after a lost reply (reads, keyed submits)


def _parse(response: httpx.Response, into: type[T]) -> T:
    if response.status_code < 400:
        return msgspec.convert(response.json(), into)
    try:
        body = response.json()
    except ValueError:
        body = {"error": "http", "message": response.text[:200]}
    cls = _BY_STATUS.get(response.status_code, Unavailable)
    err = cls(
        response.status_code, body.get("error", "?"), body.get("message", ""), body.get("field")
    )
    if isinstance(err, RateLimited):
        err.retry_after = float(response.headers.get("retry-after", "1"))
    raise err


def _job_body(
    kind: str, args: Mapping[str, Any] | None, options: Mapping[str, Any]
) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": kind, "args": dict(args or {})}
    body.update({k: v for k, v in options.items() if v is not None})
    return body


def _key() -> str:
    return uuid.uuid4().hex


class _Calls:
    """Every request the clients make, as ``Call``s."""

    @staticmethod
    def submit(kind: str, args: Mapping[str, Any] | None, key: str | None, **options: Any) -> Call:
        headers = {"Idempotency-Key": key or _key()}
        return Call("POST", "/jobs", _job_body(kind, args, options), headers=headers, retry=True)

    @staticmethod
    def submit_many(jobs: list[Mapping[str, Any]]) -> Call:
        keyed = [{**job, "idempotency_key": job.get("idempotency_key") or _key()} for job in jobs]
        return Call("POST", "/jobs/batch", {"jobs": keyed}, retry=True)

    @staticmethod
    def get(job_id: str, wait: float = 0.0) -> Call:
        params = {"wait": f"{wait:.3f}"} if wait > 0 else None
        return Call("GET", f"/jobs/{job_id}", params=params, retry=True)

    @staticmethod
    def page(
        state: str | None, kind: str | None, queue: str | None, limit: int, after: str | None
    ) -> Call:
        params = {"state": state, "kind": kind, "queue": queue, "limit": limit, "after": after}
        return Call(
            "GET", "/jobs", params={k: v for k, v in params.items() if v is not None}, retry=True
        )


class _Base:
    def __init__(self, url: str, token: str | None, retries: int, backoff_s: float) -> None:
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff_s = backoff_s
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _unreachable(self, exc: Exception) -> Unavailable:
        return Unavailable(0, "unreachable", f"{self.url}: {type(exc).__name__}: {exc}")


class Client(_Base):
    """The synchronous client."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float = 75.0,  # longer than the longest wait the server allows (60 s)
        retries: int = 3,
        backoff_s: float = 0.2,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(url, token, retries, backoff_s)
        self._http = httpx.Client(
            base_url=self.url, headers=self.headers, timeout=timeout, transport=transport
        )

    def _send(self, call: Call, into: type[T]) -> T:
        for attempt in range(self.retries + 1):
            try:
                response = self._http.request(
                    call.method, call.path, json=call.json, params=call.params, headers=call.headers
                )
            except httpx.TransportError as exc:
                if not call.retry or attempt == self.retries:
                    raise self._unreachable(exc) from exc
                time.sleep(self.backoff_s * 2**attempt)
                continue
            return _parse(response, into)
        raise AssertionError("unreachable")

    def submit(
        self,
        kind: str,
        args: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> Job:
        """Submit one job; ``options``: delay_ms, run_at, max_attempts, priority, queue."""
        return self._send(_Calls.submit(kind, args, idempotency_key, **options), Job)

    def submit_many(self, jobs: builtins.list[Mapping[str, Any]]) -> builtins.list[str]:
        """Submit many jobs (dicts shaped like ``POST /jobs`` bodies) atomically; their ids."""
        return self._send(_Calls.submit_many(jobs), BatchResult).ids

    def get(self, job_id: str) -> Job:
        return self._send(_Calls.get(job_id), Job)

    def wait(self, job_id: str, within: float = 60.0) -> Job:
        """The job once finished, or as it stands after ``within`` seconds."""
        deadline = time.monotonic() + within
        while True:
            left = deadline - time.monotonic()
            job = self._send(_Calls.get(job_id, min(60.0, max(0.0, left))), Job)
            if job.state in TERMINAL or left <= 0:
                return job

    def list(
        self,
        *,
        state: str | None = None,
        kind: str | None = None,
        queue: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> JobPage:
        """One page of jobs in id order; pass ``page.next`` as ``after`` for the next."""
        return self._send(_Calls.page(state, kind, queue, limit, after), JobPage)

    def jobs(self, **filters: Any) -> Iterator[Job]:
        """Every matching job, page after page."""
        after = None
        while True:
            page = self.list(after=after, limit=1000, **filters)
            yield from page.jobs
            if page.next is None:
                return
            after = page.next

    def cancel(self, job_id: str) -> Job:
        return self._send(Call("DELETE", f"/jobs/{job_id}"), Job)

    def retry(self, job_id: str) -> Job:
        """Put a dead or cancelled job back, with a fresh attempt budget."""
        return self._send(Call("POST", f"/jobs/{job_id}/retry"), Job)

    def retry_all(
        self, *, state: str = "dead", kind: str | None = None, queue: str | None = None
    ) -> int:
        body = {k: v for k, v in {"state": state, "kind": kind, "queue": queue}.items() if v}
        return self._send(Call("POST", "/jobs/retry", body), Retried).retried

    def queues(self) -> builtins.list[QueueView]:
        return self._send(Call("GET", "/queues", retry=True), QueueList).queues

    def pause(self, queue: str, paused: bool = True) -> QueueView:
        action = "pause" if paused else "resume"
        return self._send(Call("POST", f"/queues/{queue}/{action}", retry=True), QueueView)

    def stats(self) -> dict[str, Any]:
        return self._send(Call("GET", "/stats", retry=True), dict)

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
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float = 75.0,
        retries: int = 3,
        backoff_s: float = 0.2,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(url, token, retries, backoff_s)
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=self.headers, timeout=timeout, transport=transport
        )

    async def _send(self, call: Call, into: type[T]) -> T:
        for attempt in range(self.retries + 1):
            try:
                response = await self._http.request(
                    call.method, call.path, json=call.json, params=call.params, headers=call.headers
                )
            except httpx.TransportError as exc:
                if not call.retry or attempt == self.retries:
                    raise self._unreachable(exc) from exc
                await asyncio.sleep(self.backoff_s * 2**attempt)
                continue
            return _parse(response, into)
        raise AssertionError("unreachable")

    async def submit(
        self,
        kind: str,
        args: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> Job:
        return await self._send(_Calls.submit(kind, args, idempotency_key, **options), Job)

    async def submit_many(self, jobs: builtins.list[Mapping[str, Any]]) -> builtins.list[str]:
        return (await self._send(_Calls.submit_many(jobs), BatchResult)).ids

    async def get(self, job_id: str) -> Job:
        return await self._send(_Calls.get(job_id), Job)

    async def wait(self, job_id: str, within: float = 60.0) -> Job:
        deadline = time.monotonic() + within
        while True:
            left = deadline - time.monotonic()
            job = await self._send(_Calls.get(job_id, min(60.0, max(0.0, left))), Job)
            if job.state in TERMINAL or left <= 0:
                return job

    async def list(
        self,
        *,
        state: str | None = None,
        kind: str | None = None,
        queue: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> JobPage:
        return await self._send(_Calls.page(state, kind, queue, limit, after), JobPage)

    async def jobs(self, **filters: Any) -> AsyncIterator[Job]:
        after = None
        while True:
            page = await self.list(after=after, limit=1000, **filters)
            for job in page.jobs:
                yield job
            if page.next is None:
                return
            after = page.next

    async def cancel(self, job_id: str) -> Job:
        return await self._send(Call("DELETE", f"/jobs/{job_id}"), Job)

    async def retry(self, job_id: str) -> Job:
        return await self._send(Call("POST", f"/jobs/{job_id}/retry"), Job)

    async def retry_all(
        self, *, state: str = "dead", kind: str | None = None, queue: str | None = None
    ) -> int:
        body = {k: v for k, v in {"state": state, "kind": kind, "queue": queue}.items() if v}
        return (await self._send(Call("POST", "/jobs/retry", body), Retried)).retried

    async def queues(self) -> builtins.list[QueueView]:
        return (await self._send(Call("GET", "/queues", retry=True), QueueList)).queues

    async def pause(self, queue: str, paused: bool = True) -> QueueView:
        action = "pause" if paused else "resume"
        return await self._send(Call("POST", f"/queues/{queue}/{action}", retry=True), QueueView)

    async def stats(self) -> dict[str, Any]:
        return await self._send(Call("GET", "/stats", retry=True), dict)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
