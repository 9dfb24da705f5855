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


class WorkflowNotFoundError(SqlqError):
    """No workflow of that id with a member still kept (404, as a missing job is)."""

    def __init__(self, workflow_id: str) -> None:
        super().__init__(f"workflow {workflow_id} not found")
        self.workflow_id = workflow_id


Answer = tuple[int, bytes, list[tuple[bytes, bytes]]]  # status, JSON body, extra headers


def _body(code: str, message: str, field: str | None = None) -> bytes:
    """Every error body: the message and the field clipped, whatever they quote."""
    body: dict[str, Any] = {"error": code, "message": clip(message)}
    if field is not None:
        body["field"] = clip(field, ECHO_LIMIT // 2)
    return msgspec.json.encode(body)


def _error(status: int, code: str, message: str, field: str | None = None) -> JSONResponse:
    return JSONResponse(msgspec.Raw(_body(code, message, field)), status_code=status)


error = _error  # for the routes that answer an error without raising one (a fenced outcome)

UNAVAILABLE_RETRY_AFTER_S = 1  # a 503's Retry-After: the store may be back at once


def answer(exc: Exception, method: str, path: str) -> Answer:
    """What ``exc``, raised by the route ``method path``, answers: the one table of
    statuses and codes, for the routes Starlette serves (``ERRORS``) and the lean ones
    (``sqlq.http.lean``) alike. A 403 and a 500 are logged here (a 500 with its request id,
    which its answer names: the details go to the log only)."""
    if isinstance(exc, ValidationError):
        return 422, _body("invalid", exc.message, exc.field), []
    if isinstance(exc, ForbiddenError):
        # A known principal without the right: its role (``RoleError``, naming the roles
        # needed) or a worker's queues. Logged with the principal's name, never a secret.
        log.info("refused (403): %s %s: %s", method, path, exc.message)
        return 403, _body("forbidden", exc.message, getattr(exc, "field", None)), []
    if isinstance(exc, UnencodableError):
        return 422, _body("invalid", f"cannot be stored as JSON: {exc}", "body"), []
    if isinstance(exc, QueueFullError):
        return (
            429,
            _body("queue_full", str(exc)),
            [(b"retry-after", str(exc.retry_after_s).encode())],
        )
    if isinstance(exc, BadJSON):
        return 400, _body("bad_json", str(exc), "body"), []
    if isinstance(exc, BodyTooLarge):
        return 413, _body("too_large", str(exc), "body"), []
    if isinstance(exc, JobNotFoundError | ScheduleNotFoundError | WorkflowNotFoundError):
        return 404, _body("not_found", str(exc)), []
    if isinstance(exc, WorkerNameTaken):
        return 409, _body("worker_name_taken", str(exc), "worker"), []
    if isinstance(exc, TransitionError | IdempotencyConflictError | DuplicateKeyError
                  | ScheduleError):  # fmt: skip
        code = "conflict"
        if isinstance(exc, JobRunningError):
            code = "running"
        elif isinstance(exc, IdempotencyConflictError | DuplicateKeyError):
            code = "idempotency_conflict"
        elif isinstance(exc, ScheduleError):  # changed under the request: read it again
            code = "schedule_conflict"
        return 409, _body(code, str(exc)), []
    if isinstance(exc, StoreError):
        # The store failed, is out of reach, or the server is not ready: nothing was
        # acknowledged, and the same request may be sent again.
        return (
            503,
            _body("unavailable", redact_paths(str(exc))),
            [(b"retry-after", str(UNAVAILABLE_RETRY_AFTER_S).encode())],
        )
    if isinstance(exc, HTTPException):
        return exc.status_code, _body("http", str(exc.detail)), []
    request_id = f"{_PROCESS_TAG}-{next(_request_ids)}"
    log.error("internal error, request %s: %s %s", request_id, method, path, exc_info=exc)
    return (
        500,
        _body("internal", f"internal error; request id {request_id}"),
        [(b"x-request-id", request_id.encode())],
    )


async def _handle(request: Request, exc: Exception) -> Response:
    """``answer`` as Starlette's exception handlers give it."""
    status, body, extra = answer(exc, request.method, request.url.path)
    response = JSONResponse(msgspec.Raw(body), status_code=status)
    for name, value in extra:
        response.headers[name.decode()] = value.decode()
    return response


def handler_for(exc: Exception) -> Any:
    """The handler of every error (``answer`` tells them apart)."""
    return _handle


# Starlette's exception middleware finds a handler by class (``Exception``'s is its
# server-error layer's, which logs and raises again: only for what ``answer`` calls a 500).
_ANSWERED = (ValidationError, ForbiddenError, UnencodableError, QueueFullError, BadJSON,
             BodyTooLarge, JobNotFoundError, ScheduleNotFoundError, WorkflowNotFoundError,
             ScheduleError,
             TransitionError, IdempotencyConflictError, DuplicateKeyError, WorkerNameTaken,
             StoreError, HTTPException)  # fmt: skip
ERRORS: dict[Any, Any] = {**dict.fromkeys(_ANSWERED, _handle), Exception: _handle}
