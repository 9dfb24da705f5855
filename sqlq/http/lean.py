"""The job's own routes as plain ASGI: ``POST /jobs``, ``POST /jobs/batch``, ``GET
/jobs/{id}`` and the pull protocol's ``POST /claims`` calls, answered ahead of Starlette's
router.

A no-op job's HTTP cost was mostly the framework's, not the queue's: a ``Request`` and
its header map, a router walking every route, the exception middleware, a ``Response``
and its header list, for one JSON body in and one out. Here a route reads its body from
``receive`` itself (bounded as ``read_body`` bounds it), decodes and encodes with msgspec
straight to bytes, and sends headers built once. Everything else is the same as the
routed handlers': the ``Guard`` ran first (host, token, origin, content type: one
``check`` for every request), each route's role comes from the one table
(``sqlq.http.access.RULES``), a submitter's queues from ``may_submit`` and
``may_read``, and an error answers through the one table (``sqlq.http.errors.answer``).
The router keeps these routes too (a ``HEAD``, say, comes that way), each a thin door onto
the same work (``submit``, ``submit_batch``, ``get``; ``sqlq.http.claims.ClaimCalls`` for
``/claims``): one piece of code either way.

A claim that long-polled looks whether its client is still there before it hands its jobs
over (``sqlq.http.claims``); here that look is ``client_gone``: the ASGI ``receive`` run
up to its first wait and no further, as Starlette's ``Request.is_disconnected`` runs it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl

import anyio
import msgspec
from starlette.types import Message, Receive, Scope, Send

from sqlq.common import query as params
from sqlq.common.errors import JobNotFoundError, ValidationError
from sqlq.common.roles import Principal
from sqlq.common.specs import MAX_JOB_BYTES, decode_batch, decode_job, whole_number
from sqlq.common.wire import job_view
from sqlq.http.access import RoleError, may_read, may_submit, principal, rule
from sqlq.http.claims import LIMITS, ClaimCalls
from sqlq.http.errors import BodyTooLarge, answer
from sqlq.runtime.service import Service

MAX_BODY = MAX_JOB_BYTES  # one job
MAX_BATCH_BODY = 16 << 20  # a batch of up to MAX_BATCH jobs
JOBS_PREFIX = "/jobs/"

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]
Answer = tuple[int, bytes]  # status, JSON body

_encode = msgspec.json.Encoder().encode
_JSON = (b"content-type", b"application/json")


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The request's body, at most ``limit`` bytes (``BodyTooLarge``: at once if its
    ``Content-Length`` says so, else as soon as more came)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            declared = whole_number(value.decode("latin-1"))
            if declared is not None and declared > limit:
                raise BodyTooLarge(limit)
            break
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):  # one message: the whole body (the usual case)
        if len(body) > limit:
            raise BodyTooLarge(limit)
        return body
    chunks, size = [body], len(body)
    while message.get("more_body", False):
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


async def _send(
    send: Send, status: int, body: bytes, extra: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    headers = [_JSON, (b"content-length", str(len(body)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Lean:
    """The lean routes over ``runtime``: ``route(method, path)`` is the handler that
    answers it, or None (the router's, then)."""

    def __init__(self, runtime: Service, claims: ClaimCalls | None = None) -> None:
        self._runtime = runtime
        self.claims = claims or ClaimCalls(runtime)
        self._roles = {
            ("POST", "/jobs"): rule("POST", "/jobs"),
            ("POST", "/jobs/batch"): rule("POST", "/jobs/batch"),
            ("GET", "/jobs/{job_id}"): rule("GET", "/jobs/{job_id}"),
            **{("POST", path): rule("POST", path) for path in self.claims.calls},
        }
        self._exact: dict[tuple[str, str], Handler] = {
            ("POST", "/jobs"): self._submit,
            ("POST", "/jobs/batch"): self._submit_batch,
            **{("POST", path): self._claims for path in self.claims.calls},
        }

    def route(self, method: str, path: str) -> Handler | None:
        exact = self._exact.get((method, path))
        if exact is not None:
            return exact
        if method == "GET" and path.startswith(JOBS_PREFIX) and "/" not in path[6:]:
            return self._get
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.route(scope["method"], scope["path"])
        assert handler is not None, "the guard hands a lean route only what route() takes"
        await handler(scope, receive, send)

    def _allowed(self, scope: Scope, method: str, template: str) -> None:
        who = principal(scope)
        roles = self._roles[(method, template)]
        if who.role not in roles:
            raise RoleError(method, template, roles, who)

    async def _answer(self, scope: Scope, send: Send, exc: Exception) -> None:
        status, body, extra = answer(exc, scope["method"], scope["path"])
        await _send(send, status, body, extra)

    # -- the routes' work, whichever door it came in by (this one, or the router's) ------

    async def submit(self, who: Principal, key_header: str | None, body: bytes) -> Answer:
        """``POST /jobs``: 201 and the job, or 200 and the one its idempotency key made."""
        key = params.idempotency_key(key_header)
        spec = decode_job(body)
        may_submit(who, [("queue", spec.queue)])
        if key is not None:
            if spec.idempotency_key not in (None, key):
                raise ValidationError("idempotency_key", "differs from the Idempotency-Key header")
            spec = msgspec.structs.replace(spec, idempotency_key=key)
        [job], [created] = await self._runtime.submit([spec], who=who.name)
        return 201 if created else 200, _encode(job_view(job))

    async def submit_batch(self, who: Principal, body: bytes) -> Answer:
        """``POST /jobs/batch``: every job in one durable commit, or none."""
        batch = decode_batch(body)
        may_submit(who, [(f"jobs[{i}].queue", j.queue) for i, j in enumerate(batch.jobs)])
        jobs, created = await self._runtime.submit(
            batch.jobs, batch=True, workflow=batch.workflow, who=who.name
        )
        answer: dict[str, Any] = {"ids": [j.id for j in jobs], "created": created}
        if batch.workflow and jobs and jobs[0].flow is not None:
            answer["workflow_id"] = jobs[0].flow.workflow_id
        return 201 if any(created) else 200, _encode(answer)

    async def get(self, who: Principal, job_id: str, query: Mapping[str, str]) -> Answer:
        """``GET /jobs/{id}`` (``?wait=``: once finished, or as it stands after that)."""
        runtime = self._runtime
        if not params.is_job_id(job_id):
            raise JobNotFoundError(job_id)  # no store lookup for an id that cannot exist
        wait = params.wait_seconds(query)
        if wait and who.queues is not None:  # may it read the job at all? (before waiting,
            # or a submitter held to its queues would learn when another queue's job ends)
            if may_read(who, await runtime.get(job_id)) is None:
                raise JobNotFoundError(job_id)
        job = may_read(who, await (runtime.wait(job_id, wait) if wait else runtime.get(job_id)))
        if job is None:
            raise JobNotFoundError(job_id)
        return 200, _encode(job_view(job))

    # -- this door: plain ASGI -------------------------------------------------------------

    async def _submit(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            self._allowed(scope, "POST", "/jobs")
            body = await read_body(scope, receive, MAX_BODY)
            status, out = await self.submit(principal(scope), _header(scope, b"idempotency-key"),
                                            body)  # fmt: skip
        except Exception as exc:
            await self._answer(scope, send, exc)
            return
        await _send(send, status, out)

    async def _submit_batch(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            self._allowed(scope, "POST", "/jobs/batch")
            body = await read_body(scope, receive, MAX_BATCH_BODY)
            status, out = await self.submit_batch(principal(scope), body)
        except Exception as exc:
            await self._answer(scope, send, exc)
            return
        await _send(send, status, out)

    async def _get(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            self._allowed(scope, "GET", "/jobs/{job_id}")
            query = scope.get("query_string", b"")
            job_id = scope["path"][len(JOBS_PREFIX) :]
            status, out = await self.get(principal(scope), job_id, _query(query) if query else {})
        except Exception as exc:
            await self._answer(scope, send, exc)
            return
        await _send(send, status, out)

    async def _claims(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        try:
            self._allowed(scope, "POST", path)
            body = await read_body(scope, receive, LIMITS[path])
            status, out = await self.claims.calls[path](
                principal(scope), body, lambda: client_gone(receive)
            )
        except Exception as exc:
            await self._answer(scope, send, exc)
            return
        await _send(send, status, out)


async def client_gone(receive: Receive) -> bool:
    """Whether the client went away: ``receive`` run to its first wait, not past it (the
    server answers a disconnect at once; else there is nothing to read yet)."""
    message: Message = {}
    with anyio.CancelScope() as scope:
        scope.cancel()
        message = await receive()
    return message.get("type") == "http.disconnect"


def _query(raw: bytes) -> dict[str, str]:
    """A query string as the one-value map ``sqlq.common.query`` reads; a parameter given
    twice keeps its last (as Starlette's ``query_params`` gives it)."""
    return dict(parse_qsl(raw.decode("latin-1"), keep_blank_values=True))
