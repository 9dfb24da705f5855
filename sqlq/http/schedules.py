"""``/schedules``: the routes over ``Service.schedules``, thin as the jobs' are.

A schedule's name is checked before anything else (``check_name``: a 422 naming
``name``), so a name that cannot exist costs no store read and never reaches a key.
A missing schedule is a 404 body like a missing job's. What the service refuses
(``ValidationError``, ``ScheduleError``, ``StoreError``) goes through the one error
table, ``sqlq.http.errors.ERRORS``, as every other route's does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sqlq.common.schedule import check_name, decode_schedule
from sqlq.common.specs import MAX_JOB_BYTES
from sqlq.common.wire import ScheduleView, job_view
from sqlq.http.errors import JSONResponse, ScheduleNotFoundError
from sqlq.runtime.service import Service

MAX_SCHEDULE_BODY = MAX_JOB_BYTES  # a schedule holds one job's args


def _view(view: ScheduleView | None, name: str) -> Response:
    if view is None:
        raise ScheduleNotFoundError(name)
    return JSONResponse(msgspec.to_builtins(view))


def _name(request: Request) -> str:
    name: str = request.path_params["name"]
    return check_name(name)


def routes(service: Service, read_body: Callable[[Request, int], Awaitable[bytes]]) -> list[Route]:
    """The routes over ``service.schedules``; ``read_body`` is the app's bounded reader."""

    async def put(request: Request) -> Response:
        name = _name(request)
        spec = decode_schedule(await read_body(request, MAX_SCHEDULE_BODY))
        view, created = await service.schedules.put(name, spec)
        return JSONResponse(msgspec.to_builtins(view), status_code=201 if created else 200)

    async def list_all(_: Request) -> Response:
        views = await service.schedules.list()
        return JSONResponse({"schedules": msgspec.to_builtins(views)})

    async def get(request: Request) -> Response:
        name = _name(request)
        return _view(await service.schedules.get(name), name)

    async def delete(request: Request) -> Response:
        """Answers the schedule as it was, so a client sees what it removed."""
        name = _name(request)
        view = await service.schedules.get(name)
        if view is None or not await service.schedules.delete(name):
            raise ScheduleNotFoundError(name)
        return _view(view, name)

    async def pause(request: Request) -> Response:
        name = _name(request)
        schedules = service.schedules
        change = schedules.pause if request.url.path.endswith("/pause") else schedules.resume
        return _view(await change(name), name)

    async def trigger(request: Request) -> Response:
        name = _name(request)
        job = await service.schedules.trigger(name)
        if job is None:
            raise ScheduleNotFoundError(name)
        return JSONResponse(job_view(job), status_code=201)

    return [
        Route("/schedules", list_all, methods=["GET"]),
        Route("/schedules/{name}", put, methods=["PUT"]),
        Route("/schedules/{name}", get, methods=["GET"]),
        Route("/schedules/{name}", delete, methods=["DELETE"]),
        Route("/schedules/{name}/pause", pause, methods=["POST"]),
        Route("/schedules/{name}/resume", pause, methods=["POST"]),
        Route("/schedules/{name}/trigger", trigger, methods=["POST"]),
    ]
