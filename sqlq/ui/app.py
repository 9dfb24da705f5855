"""The dashboard at ``/ui``: server-rendered pages over the same ``Service`` the API uses.

Pages are Jinja2 templates (autoescaped); a page's live part is the template's
``live`` block, which htmx fetches again about once a second (``static/ui.js``
ticks only while the tab is visible) from the page's own URL and swaps in place.

Every change is a plain HTML form POST in two steps: a GET confirmation page
that says what will happen and changes nothing, then the POST, which answers
with a page saying what happened. Each POST passes, in order: the session
(``session.Sessions``), ``--ui-read-only``, the content type (forms only), a
body limit, and the CSRF field. The guard in front (``sqlq.http.guard``)
still checks Host and Origin for these paths; it leaves the token and the
content type to this module because a browser cannot send a bearer header with
a link or a JSON body with a form.

Every response carries a Content-Security-Policy that allows only this
server's own scripts and styles (htmx's eval and inline styles are turned off
in ``base.html``) and forbids framing, so no page can be clickjacked into an
action.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode

import msgspec
from jinja2 import Environment, PackageLoader, StrictUndefined
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from sqlq.common import query as params
from sqlq.common.clock import Clock
from sqlq.common.errors import JobNotFoundError, StoreError, TransitionError, ValidationError
from sqlq.common.models import Job, State
from sqlq.common.specs import RetrySpec
from sqlq.runtime.service import Service
from sqlq.ui.options import PREFIX, UiOptions
from sqlq.ui.overview import Sampler, overview
from sqlq.ui.session import COOKIE, SESSION_S, Sessions

PAGE_SIZE = 50
MAX_FORM = 16 << 10
MAX_SHOWN_JSON = 64 << 10  # characters of args or result a job page shows
FORM_TYPE = "application/x-www-form-urlencoded"
HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "x-frame-options": "DENY",
    # not no-referrer: with it, Chrome sends "Origin: null" on the pages' own form posts
    "referrer-policy": "same-origin",
    "x-content-type-options": "nosniff",
    "cache-control": "no-store",
}
STATIC = {  # file -> media type; pinned versions in static/VENDORED.md
    "htmx.min.js": "text/javascript; charset=utf-8",
    "ui.js": "text/javascript; charset=utf-8",
    "ui.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
Handler = Callable[[Request], Awaitable[Response]]
Action = Callable[[dict[str, str]], Awaitable[str]]


class Refused(Exception):
    """A request the dashboard answers with a page that says why (status, title, text)."""

    def __init__(self, status: int, title: str, text: str) -> None:
        super().__init__(text)
        self.status, self.title, self.text = status, title, text


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def _ago(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    s = now - ts
    ahead = s < 0
    s = abs(s)
    text = f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.0f} h"
    return f"in {text}" if ahead else f"{text} ago"


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def _pretty(value: Any) -> str:
    """``value`` as indented JSON, cut to ``MAX_SHOWN_JSON`` characters (msgspec: 3 ms for
    1 MB of JSON where ``json.dumps(indent=2)`` took 128 ms of the event loop, measured)."""
    text = msgspec.json.format(msgspec.json.encode(value), indent=2).decode()
    if len(text) > MAX_SHOWN_JSON:
        return text[:MAX_SHOWN_JSON] + f"\n… ({len(text) - MAX_SHOWN_JSON} more characters)"
    return text


class ShownArgs:
    """A job's args as the job page shows them, made once per (id, epoch) and kept for
    the last ``size`` jobs shown: a page left open re-renders nothing of them."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._shown: OrderedDict[tuple[str, int], str] = OrderedDict()

    def get(self, job: Job) -> str:
        key = (job.id, job.epoch)
        text = self._shown.get(key)
        if text is None:
            text = self._shown[key] = _pretty(job.args)
            if len(self._shown) > self.size:
                self._shown.popitem(last=False)
        else:
            self._shown.move_to_end(key)
        return text


def _refresh(request: Request) -> bool:
    """Whether htmx asks for the page's live block only (its 1 s refresh)."""
    return request.headers.get("hx-request") == "true"


def _short(job_id: str) -> str:
    return job_id[:12]


class Dashboard:
    """The pages, their actions and the sampler behind the overview's chart."""

    def __init__(
        self, runtime: Service, options: UiOptions, *, token: str | None, clock: Clock
    ) -> None:
        self.runtime = runtime
        self.options = options
        self.sessions = Sessions(token, clock=clock)
        self.sampler = Sampler(runtime, clock)
        self.clock = clock
        self.shown_args = ShownArgs()
        env = Environment(
            loader=PackageLoader("sqlq.ui", "templates"),
            autoescape=True,
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            auto_reload=False,  # templates are package data: no stat() per render on the loop
        )
        env.filters.update(when=_when, size=_size, pretty=_pretty, short=_short)
        env.globals.update(prefix=PREFIX, states=[s.value for s in State])
        self.env = env
        for name in env.list_templates():  # compiled now: a first refresh costs ~25 ms more
            env.get_template(name)
        self.static = {}
        for name, media in STATIC.items():
            body = resources.files("sqlq.ui").joinpath("static", name).read_bytes()
            self.static[name] = (body, media, hashlib.sha256(body).hexdigest()[:16])
        self.actions: dict[str, Action] = {
            "retry": self._retry,
            "retry-dead": self._retry_dead,
            "cancel": self._cancel,
            "pause": self._pause,
            "resume": self._resume,
        }

    def routes(self) -> list[BaseRoute]:
        page, act = self._page, self._action
        return [
            Route("/", page(self.overview_page), methods=["GET"]),
            Route("/jobs", page(self.jobs_page), methods=["GET"]),
            Route("/jobs/{job_id}", page(self.job_page), methods=["GET"]),
            Route("/dead", page(self.dead_page), methods=["GET"]),
            Route("/queues", page(self.queues_page), methods=["GET"]),
            Route("/confirm/{action}", page(self.confirm_page), methods=["GET"]),
            Route("/do/{action}", act(self.do), methods=["POST"]),
            Route("/login", self._safe(self.login_page), methods=["GET"]),
            Route("/login", self._safe(self.login), methods=["POST"]),
            Route("/logout", act(self.logout, changes=False), methods=["POST"]),
            Route("/static/{name}", self.asset, methods=["GET"]),
        ]

    # -- the gate ------------------------------------------------------------------------

    def _safe(self, handler: Handler) -> Handler:
        """``handler`` with the dashboard's headers, and ``Refused`` drawn as a page."""

        async def wrapped(request: Request) -> Response:
            try:
                response = await handler(request)
            except Refused as exc:
                response = self.render(
                    request, "message.html", status=exc.status, title=exc.title, text=exc.text
                )
            response.headers.update(HEADERS)
            return response

        return wrapped

    def _page(self, handler: Handler) -> Handler:
        async def gated(request: Request) -> Response:
            if not self.sessions.valid(request.cookies.get(COOKIE)):
                back = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"{PREFIX}/login?next={quote(back)}", status_code=303)
            return await handler(request)

        return self._safe(gated)

    def _action(self, handler: Handler, *, changes: bool = True) -> Handler:
        """``handler`` behind the checks every POST passes (``changes``: it changes jobs
        or queues, so ``--ui-read-only`` refuses it; signing out changes neither)."""

        async def gated(request: Request) -> Response:
            cookie = request.cookies.get(COOKIE)
            if not self.sessions.valid(cookie):
                raise Refused(401, "Sign in first", "This action needs a signed-in session.")
            if changes:
                self._writable()
            form = await self.form(request)
            if not self.sessions.csrf_ok(cookie, form.get("csrf")):
                raise Refused(
                    403,
                    "Refused",
                    "The form's CSRF field is missing or stale: reload the page and try again.",
                )
            request.state.form = form
            return await handler(request)

        return self._safe(gated)

    async def form(self, request: Request) -> dict[str, str]:
        media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media != FORM_TYPE:
            raise Refused(415, "Refused", f"Actions are HTML forms ({FORM_TYPE}).")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM:
                raise Refused(413, "Refused", f"A form is at most {MAX_FORM} bytes.")
        try:
            return dict(parse_qsl(body.decode(), max_num_fields=20))
        except (UnicodeDecodeError, ValueError) as exc:
            raise Refused(400, "Refused", "The form could not be read.") from exc

    # -- rendering -----------------------------------------------------------------------

    def render(
        self, request: Request, name: str, *, status: int = 200, **context: Any
    ) -> HTMLResponse:
        """The page, or only its ``live`` block when htmx asks for a refresh."""
        template = self.env.get_template(name)
        cookie = request.cookies.get(COOKIE)
        context.update(
            csrf=self.sessions.csrf(cookie),
            read_only=self.options.read_only,
            signed_in=self.sessions.required and self.sessions.valid(cookie),
            engine=self.runtime.store.name,
            now=self.clock.time(),
            ago=_ago,
            path=request.url.path,
        )
        if _refresh(request) and "live" in template.blocks:
            body = "".join(template.blocks["live"](template.new_context(context)))
        else:
            body = template.render(context)
        return HTMLResponse(body, status_code=status)

    # -- pages ---------------------------------------------------------------------------

    async def overview_page(self, request: Request) -> Response:
        data = await overview(self.runtime, self.sampler.history)
        return self.render(request, "overview.html", **data)

    async def jobs_page(self, request: Request) -> Response:
        return await self._list(request, "jobs.html", state=None)

    async def dead_page(self, request: Request) -> Response:
        return await self._list(request, "dead.html", state=State.DEAD.value)

    async def _list(self, request: Request, template: str, state: str | None) -> Response:
        """A page of jobs: the filters from the query string, paged by the API's cursor."""
        given = {k: v for k, v in request.query_params.items() if v and k != "limit"}
        if state is not None:
            given["state"] = state
        try:
            query = params.job_query(QueryParams({**given, "limit": str(PAGE_SIZE)}))
        except ValidationError as exc:
            raise Refused(422, "Bad filter", f"{exc.field}: {exc.message}") from exc
        jobs = await self.runtime.list_jobs(query)
        filters = {k: v for k, v in given.items() if k != "after" and (k, v) != ("state", state)}
        more = len(jobs) == query.limit
        return self.render(
            request,
            template,
            jobs=jobs,
            filters=filters,
            first_page=urlencode(filters),
            next_page=urlencode({**filters, "after": params.cursor(jobs[-1].id)}) if more else None,
            live_query=urlencode(given),
            paged="after" in given,
        )

    async def job_page(self, request: Request) -> Response:
        job_id: str = request.path_params["job_id"]
        job = await self.runtime.get(job_id) if params.is_job_id(job_id) else None
        if job is None:
            raise Refused(404, "No such job", f"No job {job_id[:64]!r} (finished jobs are kept "
                          "for --retention, then pruned).")  # fmt: skip
        # The args are outside the live block: a refresh neither shows nor renders them.
        args = "" if _refresh(request) else self.shown_args.get(job)
        return self.render(request, "job.html", job=job, args=args, result=_pretty(job.result))

    async def queues_page(self, request: Request) -> Response:
        return self.render(request, "queues.html", queues=await self.runtime.queues())

    async def confirm_page(self, request: Request) -> Response:
        action = self._known(request.path_params["action"])
        fields = self._fields(action, dict(request.query_params))
        question = _QUESTIONS[action].format(**_described(fields))
        return self.render(request, "confirm.html", action=action, fields=fields,
                           question=question, back=_back(action, fields))  # fmt: skip

    async def login_page(self, request: Request) -> Response:
        if not self.sessions.required:
            return RedirectResponse(f"{PREFIX}/", status_code=303)
        return self.render(request, "login.html", next=_next(request.query_params.get("next")),
                           error=None)  # fmt: skip

    async def login(self, request: Request) -> Response:
        form = await self.form(request)
        target = _next(form.get("next"))
        if not self.sessions.required:
            return RedirectResponse(target, status_code=303)
        if not self.sessions.csrf_ok(request.cookies.get(COOKIE), form.get("csrf")):
            raise Refused(403, "Refused", "The form is stale: reload the page and try again.")
        client = request.client.host if request.client else None
        if self.sessions.throttled(client):
            raise Refused(429, "Too many attempts", "Too many wrong tokens: wait a minute.")
        cookie = self.sessions.login(form.get("token", ""), client)
        if cookie is None:
            return self.render(request, "login.html", status=401, next=target,
                               error="That is not the server's token.")  # fmt: skip
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            COOKIE, cookie, max_age=SESSION_S, path=PREFIX, httponly=True, samesite="strict",
            secure=self.options.secure_cookie or request.url.scheme == "https",
        )  # fmt: skip
        return response

    async def logout(self, _: Request) -> Response:
        response = RedirectResponse(f"{PREFIX}/login", status_code=303)
        response.delete_cookie(COOKIE, path=PREFIX, httponly=True, samesite="strict")
        return response

    async def asset(self, request: Request) -> Response:
        found = self.static.get(request.path_params["name"])
        if found is None:
            return Response("not found", status_code=404, media_type="text/plain")
        body, media, etag = found
        headers = {"etag": f'"{etag}"', "cache-control": "no-cache",
                   "x-content-type-options": "nosniff"}  # fmt: skip
        if request.headers.get("if-none-match") == f'"{etag}"':
            return Response(status_code=304, headers=headers)
        return Response(body, media_type=media, headers=headers)

    # -- actions -------------------------------------------------------------------------

    async def do(self, request: Request) -> Response:
        action = self._known(request.path_params["action"])
        fields = self._fields(action, request.state.form)
        try:
            text = await self.actions[action](fields)
        except ValidationError as exc:
            raise Refused(422, "Not done", f"{exc.field}: {exc.message}") from exc
        except JobNotFoundError as exc:
            raise Refused(404, "Not done", str(exc)) from exc
        except TransitionError as exc:
            raise Refused(409, "Not done", str(exc)) from exc
        except StoreError as exc:
            raise Refused(503, "Not done", "The store is unavailable; nothing was changed.") \
                from exc  # fmt: skip
        return self.render(request, "message.html", title="Done", text=text,
                           back=_back(action, fields))  # fmt: skip

    def _known(self, action: str) -> str:
        self._writable()
        if action not in self.actions:
            raise Refused(404, "No such action", f"Actions: {', '.join(self.actions)}.")
        return action

    def _writable(self) -> None:
        if self.options.read_only:
            raise Refused(403, "Read-only", "This dashboard is read-only (--ui-read-only).")

    def _fields(self, action: str, given: dict[str, str]) -> dict[str, str]:
        """The fields ``action`` takes, checked as the API checks them."""
        if action in ("retry", "cancel"):
            job_id = given.get("job", "")
            if not params.is_job_id(job_id):
                raise Refused(422, "Bad request", "job: a job id")
            return {"job": job_id}
        if action in ("pause", "resume"):
            try:
                return {"queue": params.queue_name(given.get("queue", ""))}
            except ValidationError as exc:
                raise Refused(422, "Bad request", f"{exc.field}: {exc.message}") from exc
        picked = {k: given[k] for k in ("kind", "queue") if given.get(k)}
        try:
            params.job_query(QueryParams(picked))
        except ValidationError as exc:
            raise Refused(422, "Bad request", f"{exc.field}: {exc.message}") from exc
        return picked

    async def _retry(self, fields: dict[str, str]) -> str:
        job = await self.runtime.retry(fields["job"])
        return f"Job {job.id} is {job.state.value} again."

    async def _retry_dead(self, fields: dict[str, str]) -> str:
        spec = msgspec.convert(fields, RetrySpec)
        n = await self.runtime.retry_matching(spec)
        return f"Retried {n} dead job{'s' if n != 1 else ''}{_matching(fields)}."

    async def _cancel(self, fields: dict[str, str]) -> str:
        job = await self.runtime.cancel(fields["job"])
        return f"Job {job.id} is {job.state.value}."

    async def _pause(self, fields: dict[str, str]) -> str:
        info = await self.runtime.pause(fields["queue"], True)
        return f"Queue {fields['queue']} is paused ({info.depth} waiting, {info.running} running)."

    async def _resume(self, fields: dict[str, str]) -> str:
        await self.runtime.pause(fields["queue"], False)
        return f"Queue {fields['queue']} runs again."


_QUESTIONS = {
    "retry": "Run job {job} again? Its attempts start over; its history is kept.",
    "retry-dead": "Retry every dead job{matching}? Each is scheduled again.",
    "cancel": "Cancel job {job}? It will not run.",
    "pause": "Pause queue {queue}? Its waiting jobs stay waiting; running ones finish.",
    "resume": "Resume queue {queue}? Its waiting jobs start to run.",
}


def _matching(fields: dict[str, str]) -> str:
    said = [f"{k} {v}" for k, v in fields.items() if k in ("kind", "queue")]
    return f" with {' and '.join(said)}" if said else ""


def _described(fields: dict[str, str]) -> dict[str, str]:
    return {"job": fields.get("job", ""), "queue": fields.get("queue", ""),
            "matching": _matching(fields)}  # fmt: skip


def _back(action: str, fields: dict[str, str]) -> str:
    if action in ("retry", "cancel"):
        return f"{PREFIX}/jobs/{fields['job']}"
    if action in ("pause", "resume"):
        return f"{PREFIX}/queues"
    return f"{PREFIX}/dead"


def _next(value: str | None) -> str:
    """Where a login goes back to: a dashboard path, never another site."""
    if value and value.startswith(f"{PREFIX}/") and not value.startswith("//"):
        return value
    return f"{PREFIX}/"
