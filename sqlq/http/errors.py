"""The HTTP error table: each domain error's status, code and body, in one place.

``ERRORS`` maps an exception class to its handler, and every error body is made
by ``_error``, which clips what it echoes (``sqlq.common.errors.clip``: a
100,000-character unknown key came back whole). A 500 says "internal error"
with a request id and the details go to the log under that id; 503 messages
carry no absolute paths. ``sqlq.http.app`` installs the table.
"""

from __future__ import annotations

import itertools
import logging
import os
from typing import Any

import msgspec
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from sqlq.common.errors import (
    ECHO_LIMIT,
    DuplicateKeyError,
    ForbiddenError,
    IdempotencyConflictError,
    JobNotFoundError,
    JobRunningError,
    QueueFullError,
    ScheduleError,
    SqlqError,
    StoreError,
    TransitionError,
    UnencodableError,
    ValidationError,
    WorkerNameTaken,
    clip,
)
from sqlq.common.redact import redact_paths
from sqlq.common.specs import BadJSON

# The app's logger: the internal-error lines keep the name operators filter on.
log = logging.getLogger("sqlq.http.app")

_request_ids = itertools.count(1)
_PROCESS_TAG = os.urandom(3).hex()


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return msgspec.json.encode(content)


class BodyTooLarge(SqlqError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"request body is larger than {limit} bytes")


class Forbidden(ForbiddenError):
    """A 403 whose body names a field (the header, or the value a role may not use)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ScheduleNotFoundError(SqlqError):
    """No schedule of that name (404, as a missing job is)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"schedule {name} not found")
        self.name = name


def _error(status: int, code: str, message: str, field: str | None = None) -> JSONResponse:
    """Every error body: the message and the field clipped, whatever they quote."""
    body: dict[str, Any] = {"error": code, "message": clip(message)}
    if field is not None:
        body["field"] = clip(field, ECHO_LIMIT // 2)
    return JSONResponse(body, status_code=status)


error = _error  # for the routes that answer an error without raising one (a fenced outcome)


async def _forbidden(request: Request, exc: Exception) -> Response:
    """A known principal without the right: its role (``sqlq.http.access.RoleError``,
    naming the roles needed) or a worker's queues (the runtime's). Logged with the
    principal's name, which the message holds; never a secret."""
    assert isinstance(exc, ForbiddenError)
    log.info("refused (403): %s %s: %s", request.method, request.url.path, exc.message)
    return _error(403, "forbidden", exc.message, getattr(exc, "field", None))


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
    if isinstance(exc, WorkerNameTaken):
        return _error(409, "worker_name_taken", str(exc), "worker")
    code = "conflict"
    if isinstance(exc, JobRunningError):
        code = "running"
    elif isinstance(exc, IdempotencyConflictError | DuplicateKeyError):
        code = "idempotency_conflict"
    elif isinstance(exc, ScheduleError):  # changed under the request: read it again
        code = "schedule_conflict"
    return _error(409, code, str(exc))


UNAVAILABLE_RETRY_AFTER_S = 1  # a 503's Retry-After: the store may be back at once


async def _unavailable(_: Request, exc: Exception) -> Response:
    # The store failed, is out of reach, or the server is not ready: nothing was
    # acknowledged, and the same request may be sent again.
    response = _error(503, "unavailable", redact_paths(str(exc)))
    response.headers["retry-after"] = str(UNAVAILABLE_RETRY_AFTER_S)
    return response


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


def handler_for(exc: Exception) -> Any:
    """The ``ERRORS`` entry for ``exc``: its class's, or its nearest base's."""
    for cls in type(exc).__mro__:
        if cls in ERRORS:
            return ERRORS[cls]
    return _unexpected


ERRORS: dict[Any, Any] = {
    ValidationError: _validation,
    ForbiddenError: _forbidden,
    UnencodableError: _unencodable,
    QueueFullError: _queue_full,
    BadJSON: _bad_json,
    BodyTooLarge: _too_large,
    JobNotFoundError: _not_found,
    ScheduleNotFoundError: _not_found,
    ScheduleError: _conflict,
    TransitionError: _conflict,
    IdempotencyConflictError: _conflict,
    DuplicateKeyError: _conflict,
    WorkerNameTaken: _conflict,
    StoreError: _unavailable,
    HTTPException: _http,
    Exception: _unexpected,
}
