"""The HTTP front end: thin handlers over one ``Service``.

Each handler parses and validates, makes one runtime call and answers JSON.
Domain errors become HTTP statuses in one table (``sqlq.http.errors.ERRORS``,
which also keeps what reaches a client free of the server's insides); nothing
here touches a file or a database. Every request first passes
``sqlq.http.guard`` (host, token, origin, content type), and every route its role's
rule (``sqlq.http.access``: the table of who may call what).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import anyio
import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp

from sqlq import __version__
from sqlq.common import query as params
from sqlq.common.errors import JobNotFoundError, ValidationError
from sqlq.common.fair import MAX_POLICY_BODY, KeyPolicy, Policy
from sqlq.common.models import State
from sqlq.common.redact import redact_paths
from sqlq.common.specs import (
    CancelSpec,
    RetrySpec,
    decode,
)
from sqlq.common.wire import CancelCounts, Retried, job_view
from sqlq.http.access import guarded, principal
from sqlq.http.claims import routes as claim_routes
from sqlq.http.errors import ERRORS, JSONResponse, WorkflowNotFoundError
from sqlq.http.guard import Guard, Security, Stamped
from sqlq.http.lean import MAX_BATCH_BODY, MAX_BODY, Lean
from sqlq.http.lean import read_body as read_scope_body
from sqlq.http.openapi import document
from sqlq.http.schedules import routes as schedule_routes
from sqlq.runtime.claims import QueueInfo
from sqlq.runtime.config import DEFAULT_GRACE_S
from sqlq.runtime.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from sqlq.runtime.service import Service
from sqlq.ui.options import PREFIX as UI_PREFIX
from sqlq.ui.options import UiOptions

VERSION = __version__


def _raw(answer: tuple[int, bytes]) -> Response:
    """A lean route's answer, as a routed one's."""
    status, body = answer
    return Response(body, status_code=status, media_type="application/json")


async def read_body(request: Request, limit: int) -> bytes:
    """A routed request's body, bounded as a lean route's is (``sqlq.http.lean``)."""
    return await read_scope_body(request.scope, request.receive, limit)


view = job_view  # a job as every route shows it, with its schedule and tick


def _info(info: QueueInfo) -> dict[str, Any]:
    return {
        "depth": info.depth,
        "running": info.running,
        "limit": info.limit,
        "paused": info.paused,
        "remote": info.remote,
        "warning": info.warning,
        "unclaimed_kinds": list(info.unclaimed),
        "policy": None if info.policy is None else msgspec.to_builtins(info.policy),
    }


FORCE = {"1": True, "true": True, "0": False, "false": False}  # exactly these (OpenAPI's enum)


def _force(request: Request) -> bool:
    """``?force=``: 1/true or 0/false (absent: false); anything else a 422 naming it, not
    a cancel of another kind than was asked for."""
    given = request.query_params.getlist("force")
    if not given:
        return False
    force = FORCE.get(given[0]) if len(given) == 1 else None
    if force is None:
        raise ValidationError("force", "must be 1, true, 0 or false, given once")
    return force


def _job_id(request: Request) -> str:
    job_id: str = request.path_params["job_id"]
    if not params.is_job_id(job_id):
        raise JobNotFoundError(job_id)  # no store lookup for an id that cannot exist
    return job_id


class _App(Starlette):
    """Starlette with the ``Guard`` and then ``Stamped`` (unless its server sends
    ``NOSNIFF`` itself) around its whole stack: outside its server-error layer too, which
    answers a 500 outside every middleware it is given.

    The guard sits outside that layer so that a lean route (``sqlq.http.lean``, which
    answers every error itself, a 500 included) runs with no Starlette layer between it
    and the server: the layer wraps ``send`` in a closure of its own, two calls a request
    on the hot path. Every routed request still passes through it, after the guard. What
    that gives up: a fault in the guard's own checks, or in a lean route's sending of its
    answer, reaches the server as it is (uvicorn logs it and answers a plain 500)."""

    stamped = True
    guard: Callable[[ASGIApp], ASGIApp] | None = None

    def build_middleware_stack(self) -> ASGIApp:
        app = super().build_middleware_stack()
        if self.guard is not None:
            app = self.guard(app)
        return Stamped(app) if self.stamped else app


@functools.cache
def _document() -> dict[str, Any]:
    """The OpenAPI document, made at its first request: making it walks every type's schema
    (~65 ms), which a restart would otherwise wait for before /readyz (experiment K). Made
    on a thread (``openapi``), so the event loop never stops for it."""
    return document(VERSION)


def create_app(
    runtime: Service,
    *,
    start_runtime: bool = True,
    grace_s: float = DEFAULT_GRACE_S,
    security: Security | None = None,
    ui: UiOptions | None = UiOptions(),  # noqa: B008 (frozen)
    stamped: bool = True,
    lean: bool = True,
) -> Starlette:
    """The ASGI app. Its lifespan stops the runtime (and starts it, unless the
    caller already did, as ``sqlq serve`` does so recovery finishes before the
    port opens). ``security`` defaults to a loopback server without a token;
    ``ui=None`` leaves the dashboard out (``--no-ui``). ``stamped=False``: the server
    sends ``NOSNIFF`` with every answer itself (``sqlq serve``: ``SERVED_HEADERS``).
    ``lean=False``: the job's own routes through the router too (``sqlq.http.lean``'s
    other door: the tests hold the two to the same answers)."""

    security = security or Security()
    people = security.roster()  # one roster for the API's guard and the dashboard's login
    dashboard = None
    if ui is not None:  # imported here: without the dashboard, no Jinja2 at all
        from sqlq.ui.app import Dashboard

        dashboard = Dashboard(runtime, ui, token=people, clock=runtime.clock)

    jobs = Lean(runtime)  # the job's own routes, ahead of the router (sqlq.http.lean)

    async def submit(request: Request) -> Response:
        body = await read_body(request, MAX_BODY)
        key = request.headers.get("idempotency-key")
        return _raw(await jobs.submit(principal(request.scope), key, body))

    async def submit_batch(request: Request) -> Response:
        body = await read_body(request, MAX_BATCH_BODY)
        return _raw(await jobs.submit_batch(principal(request.scope), body))

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
        job_id: str = request.path_params["job_id"]
        return _raw(await jobs.get(principal(request.scope), job_id, request.query_params))

    async def get_workflow(request: Request) -> Response:
        workflow_id: str = request.path_params["workflow_id"]
        after, limit = params.member_page(request.query_params)
        found = await runtime.workflow(workflow_id, after, limit)
        if found is None:
            raise WorkflowNotFoundError(workflow_id)
        return JSONResponse(found)

    async def cancel_workflow(request: Request) -> Response:
        """Every member not started cancelled (their cones with them), every running one
        asked to stop: ``{"cancelled", "requested"}``."""
        workflow_id: str = request.path_params["workflow_id"]
        counts = await runtime.cancel_workflow(workflow_id)
        if counts is None:
            raise WorkflowNotFoundError(workflow_id)
        return JSONResponse(CancelCounts(cancelled=counts[0], requested=counts[1]))

    async def retry_workflow(request: Request) -> Response:
        """Every dead member whose parents completed revived, with the cone its death
        cancelled, in one commit: ``{"retried": n}``."""
        workflow_id: str = request.path_params["workflow_id"]
        retried = await runtime.retry_workflow(workflow_id)
        if retried is None:
            raise WorkflowNotFoundError(workflow_id)
        return JSONResponse(Retried(retried=retried))

    async def queues(_: Request) -> Response:
        infos = await runtime.queues()
        return JSONResponse({"queues": [{"name": q, **_info(i)} for q, i in infos.items()]})

    async def put_policy(request: Request) -> Response:
        """``PUT /queues/{queue}``: its policy, whole (``{}``: none, the plain claim)."""
        name = params.queue_name(request.path_params["queue"])
        policy = decode(await read_body(request, MAX_POLICY_BODY), Policy)
        return JSONResponse({"name": name, **_info(await runtime.set_policy(name, policy))})

    async def key_policy(request: Request) -> Response:
        """``PUT`` (or ``DELETE``) ``/queues/{queue}/keys/{key}``: one key's override."""
        name = params.queue_name(request.path_params["queue"])
        key = params.fair_key(request.path_params["key"])
        override = None
        if request.method == "PUT":
            override = decode(await read_body(request, MAX_BODY), KeyPolicy)
        info = await runtime.set_key_policy(name, key, override)
        return JSONResponse({"name": name, **_info(info)})

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
        """200: cancelled before it ran; 202: it runs, and a cancel is asked for (durably;
        its attempt decides how it ends). A finished job is a 409 from the service."""
        job_id, force = _job_id(request), _force(request)
        job = await runtime.cancel(job_id, force=force)
        return JSONResponse(view(job), status_code=202 if job.state is State.RUNNING else 200)

    async def cancel_matching(request: Request) -> Response:
        """Every live job that matches; the body is required (``{}`` is every live job,
        said on purpose, never an empty POST by mistake)."""
        body = await read_body(request, MAX_BODY)
        if not body:
            raise ValidationError("body", "required: {} cancels every live job")
        spec = decode(body, CancelSpec)
        cancelled, requested = await runtime.cancel_matching(spec)
        return JSONResponse(CancelCounts(cancelled=cancelled, requested=requested))

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
        return JSONResponse(await asyncio.to_thread(_document))

    async def metrics(_: Request) -> Response:
        return Response(runtime.metrics.exposition(), media_type=METRICS_CONTENT_TYPE)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        # anyio imports its asyncio backend as its first scope is made (~10 ms here): made
        # here, at the start, not in the first long-poll claim answered (``client_gone``)
        anyio.CancelScope()
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

    routes = [  # every route behind its role's rule (sqlq.http.access.guarded)
        Route("/jobs", submit, methods=["POST"]),
        Route("/jobs", list_jobs, methods=["GET"]),
        Route("/jobs/batch", submit_batch, methods=["POST"]),
        Route("/jobs/retry", retry_matching, methods=["POST"]),
        Route("/jobs/cancel", cancel_matching, methods=["POST"]),
        Route("/jobs/{job_id}/retry", retry_job, methods=["POST"]),
        Route("/queues", queues, methods=["GET"]),
        Route("/workflows/{workflow_id}", get_workflow, methods=["GET"]),
        Route("/workflows/{workflow_id}/cancel", cancel_workflow, methods=["POST"]),
        Route("/workflows/{workflow_id}/retry", retry_workflow, methods=["POST"]),
        Route("/queues/{queue}", put_policy, methods=["PUT"]),
        Route("/queues/{queue}/keys/{key}", key_policy, methods=["PUT"]),
        Route("/queues/{queue}/keys/{key}", key_policy, methods=["DELETE"]),
        Route("/queues/{queue}/pause", pause_queue, methods=["POST"]),
        Route("/queues/{queue}/resume", pause_queue, methods=["POST"]),
        Route("/jobs/{job_id}", get_job, methods=["GET"]),
        Route("/jobs/{job_id}", cancel_job, methods=["DELETE"]),
        *schedule_routes(runtime, read_body),
        *claim_routes(runtime, read_body),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/stats", stats, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/openapi.json", openapi, methods=["GET"]),
        *([] if dashboard is None else [Mount(UI_PREFIX, routes=dashboard.routes())]),
    ]
    app = _App(
        routes=guarded(routes),
        exception_handlers=ERRORS,
        lifespan=lifespan,
    )
    app.guard = partial(
        Guard,
        security=security,
        fast=jobs.route if lean else None,
        delegated=() if dashboard is None else (UI_PREFIX,),
        roster=people,
    )
    app.stamped = stamped  # (both before the first request, which builds the stack)
    return app
