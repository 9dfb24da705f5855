"""The HTTP front end: thin handlers over one ``Service``.

Each handler parses and validates, makes one runtime call and answers JSON.
Domain errors become HTTP statuses in one table (``ERRORS``), and every error
body is made by ``_error``, which clips what it echoes (``sqlq.common.errors.clip``:
a 100,000-character unknown key came back whole); nothing here touches a file
or a database. What reaches a client never leaks the server's
insides: a 500 says "internal error" with a request id (the details go to the
log under that id), and 503 messages carry no absolute paths. Every request
first passes ``sqlq.http.guard`` (host, token, origin, content type).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.types import Receive, Scope, Send

from sqlq import __version__
from sqlq.common import query as params
from sqlq.common.errors import (
    ECHO_LIMIT,
    DuplicateKeyError,
    IdempotencyConflictError,
    JobNotFoundError,
    JobRunningError,
    QueueFullError,
    SqlqError,
    StoreError,
    TransitionError,
    UnencodableError,
    ValidationError,
    clip,
)
from sqlq.common.models import Job
from sqlq.common.redact import redact_paths
from sqlq.common.specs import (
    MAX_JOB_BYTES,
    BadJSON,
    RetrySpec,
    decode,
    decode_batch,
    decode_job,
    whole_number,
)
from sqlq.http.guard import Guard, Security
from sqlq.http.openapi import document
from sqlq.runtime.claims import QueueInfo
from sqlq.runtime.config import DEFAULT_GRACE_S
from sqlq.runtime.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from sqlq.runtime.service import Service
from sqlq.ui.options import PREFIX as UI_PREFIX
from sqlq.ui.options import UiOptions

log = logging.getLogger(__name__)

MAX_BODY = MAX_JOB_BYTES  # one job
MAX_BATCH_BODY = 16 << 20  # a batch of up to MAX_BATCH jobs
VERSION = __version__

_request_ids = itertools.count(1)
_PROCESS_TAG = os.urandom(3).hex()


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return msgspec.json.encode(content)


class BodyTooLarge(SqlqError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than {limit} bytes")


def _error(status: int, code: str, message: str, field: str | None = None) -> JSONResponse:
    """Every error body: the message and the field clipped, whatever they quote."""
    body: dict[str, Any] = {"error": code, "message": clip(message)}
    if field is not None:
        body["field"] = clip(field, ECHO_LIMIT // 2)
    return JSONResponse(body, status_code=status)


async def _validation(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, ValidationError)
    return _error(422, "invalid", exc.message, exc.field)


async def _unencodable(_: Request, exc: Exception) -> Response:
    return _error(422, "invalid", f"cannot be stored as JSON: {exc}", "body")


async def _queue_full(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, QueueFullError)
    response = _error(429, "queue_full", str(exc))
    response.headers["retry-after"] = str(exc.retry_after_s)
    return response


async def _bad_json(_: Request, exc: Exception) -> Response:
    return _error(400, "bad_json", str(exc), "body")


async def _too_large(_: Request, exc: Exception) -> Response:
    return _error(413, "too_large", str(exc), "body")


async def _not_found(_: Request, exc: Exception) -> Response:
    return _error(404, "not_found", str(exc))


async def _conflict(_: Request, exc: Exception) -> Response:
    code = "conflict"
    if isinstance(exc, JobRunningError):
        code = "running"
    elif isinstance(exc, IdempotencyConflictError | DuplicateKeyError):
        code = "idempotency_conflict"
    return _error(409, code, str(exc))


async def _unavailable(_: Request, exc: Exception) -> Response:
    # The store failed or the server is not ready: nothing was acknowledged.
    return _error(503, "unavailable", redact_paths(str(exc)))


async def _http(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _error(exc.status_code, "http", str(exc.detail))


async def _unexpected(request: Request, exc: Exception) -> Response:
    request_id = f"{_PROCESS_TAG}-{next(_request_ids)}"
    log.error(
        "internal error, request %s: %s %s", request_id, request.method, request.url.path,
        exc_info=exc,
    )  # fmt: skip
    response = _error(500, "internal", f"internal error; request id {request_id}")
    response.headers["x-request-id"] = request_id
    return response


def _handler(exc: Exception) -> Any:
    """The ``ERRORS`` entry for ``exc``: its class's, or its nearest base's."""
    for cls in type(exc).__mro__:
        if cls in ERRORS:
            return ERRORS[cls]
    return _unexpected


ERRORS: dict[Any, Any] = {
    ValidationError: _validation,
    UnencodableError: _unencodable,
    QueueFullError: _queue_full,
    BadJSON: _bad_json,
    BodyTooLarge: _too_large,
    JobNotFoundError: _not_found,
    TransitionError: _conflict,
    IdempotencyConflictError: _conflict,
    DuplicateKeyError: _conflict,
    StoreError: _unavailable,
    HTTPException: _http,
    Exception: _unexpected,
}


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    size = None if declared is None else whole_number(declared)
    if size is not None and size > limit:
        raise BodyTooLarge(limit)
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def view(job: Job) -> dict[str, Any]:
    return job.to_dict()


def _info(info: QueueInfo) -> dict[str, Any]:
    return {
        "depth": info.depth,
        "running": info.running,
        "limit": info.limit,
        "paused": info.paused,
    }


def _job_id(request: Request) -> str:
    job_id: str = request.path_params["job_id"]
    if not params.is_job_id(job_id):
        raise JobNotFoundError(job_id)  # no store lookup for an id that cannot exist
    return job_id


def create_app(
    runtime: Service,
    *,
    start_runtime: bool = True,
    grace_s: float = DEFAULT_GRACE_S,
    security: Security | None = None,
    ui: UiOptions | None = UiOptions(),  # noqa: B008 (frozen)
) -> Starlette:
    """The ASGI app. Its lifespan stops the runtime (and starts it, unless the
    caller already did, as ``sqlq serve`` does so recovery finishes before the
    port opens). ``security`` defaults to a loopback server without a token;
    ``ui=None`` leaves the dashboard out (``--no-ui``)."""

    api_document = document(VERSION)
    security = security or Security()
    dashboard = None
    if ui is not None:  # imported here: without the dashboard, no Jinja2 at all
        from sqlq.ui.app import Dashboard

        dashboard = Dashboard(runtime, ui, token=security.token, clock=runtime.clock)

    async def submit(request: Request) -> Response:
        key = params.idempotency_key(request.headers.get("idempotency-key"))
        spec = decode_job(await read_body(request, MAX_BODY))
        if key is not None:
            if spec.idempotency_key not in (None, key):
                raise ValidationError("idempotency_key", "differs from the Idempotency-Key header")
            spec = msgspec.structs.replace(spec, idempotency_key=key)
        [job], [created] = await runtime.submit([spec])
        return JSONResponse(view(job), status_code=201 if created else 200)

    async def submit_batch(request: Request) -> Response:
        batch = decode_batch(await read_body(request, MAX_BATCH_BODY))
        jobs, created = await runtime.submit(batch.jobs, batch=True)
        body = {"ids": [j.id for j in jobs], "created": created}
        return JSONResponse(body, status_code=201 if any(created) else 200)

    async def list_jobs(request: Request) -> Response:
        query = params.job_query(request.query_params)
        jobs = await runtime.list_jobs(query)
        more = len(jobs) == query.limit
        body = {
            "jobs": [view(j) for j in jobs],
            "next": params.cursor(jobs[-1].id) if more else None,
        }
        return JSONResponse(body)

    async def get_job(request: Request) -> Response:
        job_id = _job_id(request)
        wait = params.wait_seconds(request.query_params)
        job = await (runtime.wait(job_id, wait) if wait else runtime.get(job_id))
        if job is None:
            raise JobNotFoundError(job_id)
        return JSONResponse(view(job))

    async def queues(_: Request) -> Response:
        infos = await runtime.queues()
        return JSONResponse({"queues": [{"name": q, **_info(i)} for q, i in infos.items()]})

    async def pause_queue(request: Request) -> Response:
        name = params.queue_name(request.path_params["queue"])
        paused = request.url.path.endswith("/pause")
        return JSONResponse({"name": name, **_info(await runtime.pause(name, paused))})

    async def retry_job(request: Request) -> Response:
        return JSONResponse(view(await runtime.retry(_job_id(request))))

    async def retry_matching(request: Request) -> Response:
        spec = decode(await read_body(request, MAX_BODY) or b"{}", RetrySpec)
        return JSONResponse({"retried": await runtime.retry_matching(spec)})

    async def cancel_job(request: Request) -> Response:
        return JSONResponse(view(await runtime.cancel(_job_id(request))))

    async def healthz(_: Request) -> Response:
        # Liveness: 503 only for what a restart mends (a failed store).
        ok, reason = runtime.liveness()
        body = {"status": "ok" if ok else "failed", "reason": redact_paths(reason)}
        return JSONResponse(body, status_code=200 if ok else 503)

    async def readyz(_: Request) -> Response:
        ok, reason = runtime.readiness()
        body = {"ready": ok, "reason": redact_paths(reason)}
        return JSONResponse(body, status_code=200 if ok else 503)

    async def stats(_: Request) -> Response:
        return JSONResponse(runtime.stats())

    async def openapi(_: Request) -> Response:
        return JSONResponse(api_document)

    async def metrics(_: Request) -> Response:
        return Response(runtime.metrics.exposition(), media_type=METRICS_CONTENT_TYPE)

    async def submit_fast(scope: Scope, receive: Receive, send: Send) -> None:
        """``submit`` without the router and exception middleware (see ``Guard``); errors
        go through the same table as every other route's."""
        request = Request(scope, receive)
        try:
            response = await submit(request)
        except Exception as exc:
            response = await _handler(exc)(request, exc)
        await response(scope, receive, send)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        if start_runtime:
            await runtime.start()
        if dashboard is not None:
            dashboard.sampler.start()
        try:
            yield
        finally:
            if dashboard is not None:
                await dashboard.sampler.stop()
            await runtime.stop(grace_s)

    app = Starlette(
        routes=[
            Route("/jobs", submit, methods=["POST"]),
            Route("/jobs", list_jobs, methods=["GET"]),
            Route("/jobs/batch", submit_batch, methods=["POST"]),
            Route("/jobs/retry", retry_matching, methods=["POST"]),
            Route("/jobs/{job_id}/retry", retry_job, methods=["POST"]),
            Route("/queues", queues, methods=["GET"]),
            Route("/queues/{queue}/pause", pause_queue, methods=["POST"]),
            Route("/queues/{queue}/resume", pause_queue, methods=["POST"]),
            Route("/jobs/{job_id}", get_job, methods=["GET"]),
            Route("/jobs/{job_id}", cancel_job, methods=["DELETE"]),
            Route("/healthz", healthz, methods=["GET"]),
            Route("/readyz", readyz, methods=["GET"]),
            Route("/stats", stats, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/openapi.json", openapi, methods=["GET"]),
            *([] if dashboard is None else [Mount(UI_PREFIX, routes=dashboard.routes())]),
        ],
        exception_handlers=ERRORS,
        lifespan=lifespan,
        middleware=[
            Middleware(
                Guard,
                security=security,
                fast={("POST", "/jobs"): submit_fast},
                delegated=() if dashboard is None else (UI_PREFIX,),
            )
        ],
    )
    return app
