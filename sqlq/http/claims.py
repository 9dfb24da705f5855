"""``/claims`` and ``/workers``: the pull protocol's routes over ``Service.remote``.

Thin as the jobs' routes are: each reads its body within its limit, decodes it into
the struct ``sqlq.common.protocol`` defines (msgspec; a bad value is a 422 naming the
field, as every route's is), makes one runtime call and answers JSON. The runtime
fences, writes and answers; what it refuses goes through the one error table
(``sqlq.http.errors.ERRORS``: ``ValidationError`` 422, ``ForbiddenError`` 403,
``StoreError`` 503).

A single outcome (``/claims/complete`` ...) answers 200 with its ``Reported``, or its
refusal as an error body: 409 ``fenced`` (stale: the job moved on, its lease ran out,
or it was cancelled), 422 ``invalid`` (a token this server never signed, or a bad
value), 403 ``forbidden`` (a worker's token on another queue's job). The heartbeat and
the batch of outcomes answer 200 with one answer per item, in order, whatever each
item's fate (a heartbeat that names a token twice is refused whole, a 422 naming the
second: ``sqlq.common.protocol.check_heartbeat``).

Tokens travel only in bodies, never in a URL, so no access log holds one. A claim
long-polls up to ``MAX_WAIT_CLAIM_S`` (30 s); no timeout of this server cuts a request
that long (uvicorn's keep-alive timeout counts only idle time between requests, and
nothing else here has one). A claim whose client is gone by the time its jobs are
claimed (a worker stopped during its long poll) gives them back (``release``: no
attempt counted) instead of holding them until the lease runs out; a client that goes
in the instant between that look and the answer still leaves them to the lease, and so
does one gone from a claim answered within ``LOOK_AFTER_S`` (it is not looked for).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sqlq.common.protocol import (
    FENCED,
    MAX_ERROR,
    MAX_ITEMS,
    MAX_TOKEN,
    CheckpointBody,
    CheckpointIn,
    ClaimAnswer,
    ClaimRequest,
    CompleteBody,
    CompleteIn,
    FailBody,
    FailIn,
    HeartbeatRequest,
    OutcomesRequest,
    ParentsBody,
    ReleaseBody,
    ReleaseIn,
    Reported,
    SnoozeBody,
    SnoozeIn,
    What,
    check_heartbeat,
)
from sqlq.common.roles import Principal
from sqlq.common.running import MAX_CHECKPOINT_BYTES, MAX_PROGRESS_MESSAGE
from sqlq.common.specs import MAX_JOB_BYTES, decode
from sqlq.http.access import principal
from sqlq.http.errors import JSONResponse, error
from sqlq.runtime.service import Service

# The body limits, each named once (413 past it; ``/openapi.json`` states none of them,
# as it states none of the jobs' routes'). A JSON string may spell a character in six
# bytes (``\u00e9``), so a limit that must hold N characters of text allows 6N bytes.
# MAX_ITEMS beats, each a token and a progress message at its longest, escaped
MAX_HEARTBEAT_BODY = MAX_ITEMS * (MAX_TOKEN + 6 * MAX_PROGRESS_MESSAGE + 128)
MAX_OUTCOME_BODY = MAX_JOB_BYTES  # one outcome: a result as large as a job (1 MiB)
# A checkpoint is held to MAX_CHECKPOINT_BYTES as the server encodes it (the runtime's
# check); a client's encoder may escape every character (Python's json.dumps does).
MAX_CHECKPOINT_BODY = 6 * MAX_CHECKPOINT_BYTES + 6 * MAX_TOKEN + 1024
MAX_PARENTS_BODY = 6 * MAX_TOKEN + 1024  # a token and where the page starts
MAX_OUTCOMES_BODY = 16 << 20  # up to MAX_ITEMS outcomes, as /jobs/batch's limit
MAX_CLAIM_BODY = MAX_OUTCOMES_BODY  # a claim may carry a batch of outcomes
# A claim answered sooner than this after it came had its client a moment ago: only one
# that waited longer looks whether its client is still there (a look costs a claim's
# answer ~5 % of the server's CPU, measured on small claims).
LOOK_AFTER_S = 0.1
assert MAX_OUTCOME_BODY >= 6 * MAX_ERROR + 1024, "a failure's error must fit a /claims/fail body"

ReadBody = Callable[[Request, int], Awaitable[bytes]]
Gone = Callable[[], Awaitable[bool]]  # whether the request's client went away (a look)
Answer = tuple[int, bytes]  # status, JSON body

_encode = msgspec.json.Encoder().encode


# Each single form: its body's struct, what it says without the token, and its limit.
SINGLE: dict[str, tuple[type[Any], type[Any], int]] = {
    "complete": (CompleteBody, CompleteIn, MAX_OUTCOME_BODY),
    "fail": (FailBody, FailIn, MAX_OUTCOME_BODY),
    "snooze": (SnoozeBody, SnoozeIn, MAX_OUTCOME_BODY),
    "checkpoint": (CheckpointBody, CheckpointIn, MAX_CHECKPOINT_BODY),
    "release": (ReleaseBody, ReleaseIn, MAX_OUTCOME_BODY),
}
# Every /claims call's limit, by path: what either door reads of a body at most.
LIMITS: dict[str, int] = {
    "/claims": MAX_CLAIM_BODY,
    "/claims/heartbeat": MAX_HEARTBEAT_BODY,
    **{f"/claims/{name}": limit for name, (_, _, limit) in SINGLE.items()},
    "/claims/outcomes": MAX_OUTCOMES_BODY,
    "/claims/parents": MAX_PARENTS_BODY,
}


def _what(body: Any, said: type[Any]) -> What:
    """A single form's body less its token: the ``*In`` struct it extends (shallow: the
    result or data is handed on as decoded, not copied)."""
    fields = msgspec.structs.asdict(body)
    del fields["token"]
    what: What = said(**fields)
    return what


def answer(reported: Reported) -> Answer:
    """A single outcome's answer: 200 ``Reported``, or its refusal as an error body."""
    if reported.error is None:
        return 200, _encode(reported)
    detail = reported.detail or reported.error
    if reported.error == FENCED:
        refused = error(409, FENCED, detail or "fenced", "token")
    elif reported.error == "forbidden":
        refused = error(403, "forbidden", detail)
    else:
        field, sep, message = detail.partition(": ")  # the runtime's "<field>: why"
        if not sep or " " in field:  # a detail that names no field
            field, message = "body", detail
        refused = error(422, "invalid", message, field)
    return refused.status_code, bytes(refused.body)  # (the one table's body, as made)


class ClaimCalls:
    """The work of every ``/claims`` call over ``service.remote``, from a body's bytes to
    an answer's: one piece of code, whichever door the request came in by (the lean
    one, ``sqlq.http.lean``, or the router's, ``routes``). Errors are raised, for the
    one error table (``sqlq.http.errors``) to answer."""

    def __init__(self, service: Service) -> None:
        self._service = service
        self.calls: dict[str, Callable[[Principal, bytes, Gone], Awaitable[Answer]]] = {
            "/claims": self.claim,
            "/claims/heartbeat": self.heartbeat,
            **{f"/claims/{name}": self._single(name) for name in SINGLE},
            "/claims/outcomes": self.outcomes,
            "/claims/parents": self.parents,
        }

    async def claim(self, who: Principal, body: bytes, gone: Gone) -> Answer:
        remote = self._service.remote
        req = decode(body, ClaimRequest)
        came = time.monotonic()
        got = await remote.claim(req, who)
        if got.claims and time.monotonic() - came > LOOK_AFTER_S and await gone():
            # (a long poll's client went away meanwhile)
            await remote.give_back(got, who)
            got = ClaimAnswer(claims=[], outcomes=got.outcomes)  # (nobody reads it)
        return 200, _encode(got)

    async def heartbeat(self, who: Principal, body: bytes, gone: Gone) -> Answer:
        req = check_heartbeat(decode(body, HeartbeatRequest))
        return 200, _encode(await self._service.remote.heartbeat(req, who))

    def _single(self, name: str) -> Callable[[Principal, bytes, Gone], Awaitable[Answer]]:
        struct, said, _ = SINGLE[name]

        async def report(who: Principal, body: bytes, gone: Gone) -> Answer:
            got = decode(body, struct)
            return answer(await self._service.remote.report(got.token, _what(got, said), who))

        report.__name__ = f"report_{name}"
        return report

    async def parents(self, who: Principal, body: bytes, gone: Gone) -> Answer:
        req = decode(body, ParentsBody)
        got = await self._service.remote.parents(req.token, req.start, who)
        return answer(got) if isinstance(got, Reported) else (200, _encode(got))

    async def outcomes(self, who: Principal, body: bytes, gone: Gone) -> Answer:
        req = decode(body, OutcomesRequest)
        return 200, _encode(await self._service.remote.outcomes(req, who))


def routes(service: Service, read_body: ReadBody, calls: ClaimCalls | None = None) -> list[Route]:
    """The router's door: the routes over ``calls`` (``service``'s, by default), each a thin
    one; ``read_body`` is the app's bounded reader."""
    work = calls or ClaimCalls(service)

    def door(path: str) -> Callable[[Request], Awaitable[Response]]:
        call, limit = work.calls[path], LIMITS[path]

        async def route(request: Request) -> Response:
            body = await read_body(request, limit)
            status, out = await call(principal(request.scope), body, request.is_disconnected)
            return Response(out, status_code=status, media_type="application/json")

        route.__name__ = path.strip("/").replace("/", "_")
        return route

    async def workers(_: Request) -> Response:
        return JSONResponse(msgspec.to_builtins(service.remote.workers()))

    return [
        *(Route(path, door(path), methods=["POST"]) for path in work.calls),
        Route("/workers", workers, methods=["GET"]),
    ]
