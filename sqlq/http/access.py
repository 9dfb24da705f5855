"""Which roles may use each route: one table, applied to every route the app has.

``RULES`` maps ``(method, path template)`` to the roles that may call it (``OPEN``: the
probes, which need no token at all). ``sqlq.http.app`` wraps every route's endpoint
with its rule when it builds the router (``guarded``), so the router's own matching
decides which rule a request meets, and a route without a rule is an error when the
app is built, not a door left open. The guard (``sqlq.http.guard``) has already
resolved the bearer token to a ``Principal`` (401 for an unknown one) and put it in
the request's scope; this module answers 403, naming the roles the route needs, for
a known one without the right. The dashboard (``/ui``) is not in the table: it checks
its own session, and takes the admin and read roles (``sqlq.ui.session``).

The roles, route by route:

- ``admin``: everything.
- ``submit``: ``POST /jobs``, ``POST /jobs/batch`` and ``GET /jobs/{id}`` (with
  ``?wait``), no listing. A job records no submitter, so "its own jobs" is as much as a
  durable rule can say without a new stored field: if its token-file line names queues,
  it submits only to those (403) and reads only their jobs (another queue's job is a
  404, as a missing one is); if not, it reads any job whose id it knows. Ids are unique,
  not secret (``sqlq.common.models.new_job_id``), so a submit token without queues
  should be trusted to read every job's args.
- ``worker``: ``/claims`` and ``/claims/*`` only; the runtime holds it to its queues.
- ``read``: every ``GET`` but the dashboard's actions; nothing under ``/claims``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Scope

from sqlq.common.models import Job
from sqlq.common.roles import Principal, Role
from sqlq.http.errors import Forbidden

A, S, W, R = Role.ADMIN, Role.SUBMIT, Role.WORKER, Role.READ
OPEN: Final = frozenset(Role)  # no token needed: the guard lets the probes through
PRINCIPAL = "sqlq.principal"  # the scope key the guard puts the request's principal under

RULES: dict[tuple[str, str], frozenset[Role]] = {
    ("POST", "/jobs"): frozenset({A, S}),
    ("GET", "/jobs"): frozenset({A, R}),
    ("POST", "/jobs/batch"): frozenset({A, S}),
    ("POST", "/jobs/retry"): frozenset({A}),
    ("POST", "/jobs/cancel"): frozenset({A}),
    ("POST", "/jobs/{job_id}/retry"): frozenset({A}),
    ("GET", "/jobs/{job_id}"): frozenset({A, S, R}),
    ("DELETE", "/jobs/{job_id}"): frozenset({A}),
    ("GET", "/queues"): frozenset({A, R}),
    ("GET", "/workflows/{workflow_id}"): frozenset({A, R}),
    ("POST", "/workflows/{workflow_id}/cancel"): frozenset({A}),
    ("POST", "/workflows/{workflow_id}/retry"): frozenset({A}),
    ("PUT", "/queues/{queue}"): frozenset({A}),
    ("PUT", "/queues/{queue}/keys/{key}"): frozenset({A}),
    ("DELETE", "/queues/{queue}/keys/{key}"): frozenset({A}),
    ("POST", "/queues/{queue}/pause"): frozenset({A}),
    ("POST", "/queues/{queue}/resume"): frozenset({A}),
    ("GET", "/schedules"): frozenset({A, R}),
    ("PUT", "/schedules/{name}"): frozenset({A}),
    ("GET", "/schedules/{name}"): frozenset({A, R}),
    ("DELETE", "/schedules/{name}"): frozenset({A}),
    ("POST", "/schedules/{name}/pause"): frozenset({A}),
    ("POST", "/schedules/{name}/resume"): frozenset({A}),
    ("POST", "/schedules/{name}/trigger"): frozenset({A}),
    ("POST", "/claims"): frozenset({A, W}),
    ("POST", "/claims/heartbeat"): frozenset({A, W}),
    ("POST", "/claims/complete"): frozenset({A, W}),
    ("POST", "/claims/fail"): frozenset({A, W}),
    ("POST", "/claims/snooze"): frozenset({A, W}),
    ("POST", "/claims/checkpoint"): frozenset({A, W}),
    ("POST", "/claims/release"): frozenset({A, W}),
    ("POST", "/claims/outcomes"): frozenset({A, W}),
    ("POST", "/claims/parents"): frozenset({A, W}),
    ("GET", "/workers"): frozenset({A, R}),
    ("GET", "/healthz"): OPEN,
    ("GET", "/readyz"): OPEN,
    ("GET", "/stats"): frozenset({A, R}),
    ("GET", "/metrics"): frozenset({A, R}),
    ("GET", "/openapi.json"): frozenset({A, R}),
}

Endpoint = Callable[[Request], Awaitable[Response]]


class RoleError(Forbidden):
    """A known token whose role may not use this route (403, naming the roles it needs)."""

    def __init__(self, method: str, path: str, roles: frozenset[Role], who: Principal) -> None:
        needs = " or ".join(sorted(r.value for r in roles))
        super().__init__(f"{method} {path} needs the {needs} role; this token ({who.name}) "
                         f"is {who.role.value}", "authorization")  # fmt: skip
        self.needs = roles


def principal(scope: Scope) -> Principal:
    """Who sent the request: the guard put it there (``ADMIN`` on a server without a
    token). Only the probes and the dashboard pass the guard without one, and neither
    asks; a route that did would be a bug, and fails loudly rather than guess."""
    who: Principal = scope[PRINCIPAL]
    return who


def rule(method: str, path: str) -> frozenset[Role]:
    """The roles that may call ``method path`` (a route's template); ``KeyError`` naming
    the route if the table has none."""
    try:
        return RULES[(method, path)]
    except KeyError:
        raise KeyError(f"{method} {path} has no rule in sqlq.http.access.RULES") from None


def require(roles: frozenset[Role], method: str, path: str, endpoint: Endpoint) -> Endpoint:
    """``endpoint`` behind its rule: ``RoleError`` (403) for a principal without the role."""
    if roles is OPEN:
        return endpoint

    async def checked(request: Request) -> Response:
        who = principal(request.scope)
        if who.role not in roles:
            raise RoleError(method, path, roles, who)
        return await endpoint(request)

    return checked


def guarded(routes: Sequence[BaseRoute]) -> list[BaseRoute]:
    """Every ``Route`` with its endpoint behind its rule; anything else (the dashboard's
    mount) as it is. One method a route (HEAD goes with GET, as Starlette adds it)."""
    out: list[BaseRoute] = []
    for route in routes:
        if not isinstance(route, Route):
            out.append(route)
            continue
        methods = (route.methods or set()) - {"HEAD"}
        if len(methods) != 1:
            raise ValueError(f"{route.path}: a guarded route has one method, not {methods}")
        [method] = methods
        endpoint = require(rule(method, route.path), method, route.path, route.endpoint)
        out.append(Route(route.path, endpoint, methods=[method], name=route.name))
    return out


def may_submit(who: Principal, queues: list[tuple[str, str]]) -> None:
    """A submitter whose token-file line names queues submits only to those (403 naming
    the first field that names another); anyone else may submit anywhere."""
    if who.queues is None:
        return
    for field, queue in queues:
        if not who.serves(queue):
            raise Forbidden(f"this token ({who.name}) submits only to its queues "
                            f"({', '.join(sorted(who.queues))})", field)  # fmt: skip


def may_read(who: Principal, job: Job | None) -> Job | None:
    """The job, if ``who`` may read it: a submitter whose line names queues reads only
    their jobs; another queue's job is as missing (404) as one that does not exist, so
    the answer says nothing of it."""
    if job is None or who.role is not Role.SUBMIT or who.serves(job.queue):
        return job
    return None
