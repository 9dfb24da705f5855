"""The dashboard at ``/ui``: server-rendered pages over the same ``Service`` the API uses.

Pages are Jinja2 templates (``render``); a page's live part is the template's
``live`` block, which htmx fetches again about once a second (``static/ui.js``
ticks only while the tab is visible) from the page's own URL and swaps in place.

Every change is a plain HTML form POST in two steps (``actions``): a GET
confirmation page that says what will happen and changes nothing, then the POST,
which answers with a page saying what happened. Each POST passes, in order: the
session (``session.Sessions``), ``--ui-read-only`` (or a session of the read role,
which is read-only whatever the flag), the content type (forms only), a body limit,
and the CSRF field (``gate``). The guard in front
(``sqlq.http.guard``) still checks Host and Origin for these paths; it leaves the
token and the content type to this module because a browser cannot send a bearer
header with a link or a JSON body with a form.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, urlencode

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from sqlq.common import query as params
from sqlq.common.clock import Clock
from sqlq.common.errors import ValidationError
from sqlq.common.models import State
from sqlq.common.roles import Role, Roster
from sqlq.common.schedule import check_name
from sqlq.common.wire import job_view
from sqlq.runtime.service import Service
from sqlq.ui.actions import ACTIONS, Action
from sqlq.ui.gate import HEADERS, Refused, next_path, read_form
from sqlq.ui.graph import MAX_DRAWN, graph_svg
from sqlq.ui.options import PREFIX, UiOptions
from sqlq.ui.overview import Sampler, overview
from sqlq.ui.render import ShownArgs, ago, environment, pretty, static_files
from sqlq.ui.schedules import page as schedule_page
from sqlq.ui.session import COOKIE, SESSION_S, NotForTheDashboard, Sessions

PAGE_SIZE = 50
MEMBERS_SHOWN = 1000  # a workflow's members listed on its page, at most
Handler = Callable[[Request], Awaitable[Response]]


def _refresh(request: Request) -> bool:
    """Whether htmx asks for the page's live block only (its 1 s refresh)."""
    return request.headers.get("hx-request") == "true"


class Dashboard:
    """The pages, their actions and the sampler behind the overview's chart."""

    def __init__(
        self, runtime: Service, options: UiOptions, *, token: Roster | str | None, clock: Clock
    ) -> None:
        self.runtime = runtime
        self.options = options
        self.sessions = Sessions(token, clock=clock)
        self.sampler = Sampler(runtime, clock)
        self.clock = clock
        self.shown_args = ShownArgs()
        self.env = environment()
        self.static = static_files()
        self._compiling: asyncio.Future[None] | None = None
        self._compiled = False

    def compile_templates(self) -> None:
        """Every page's template compiled (``compiled`` runs it on a thread)."""
        for name in self.env.list_templates():
            self.env.get_template(name)

    async def compiled(self) -> None:
        """The templates, compiled on a thread at the dashboard's first request and kept.

        Not before /readyz (~65 ms of every restart), not on the event loop (~25 ms at a
        page's first view), and not by a thread started with the server either: that
        thread held the interpreter against the first jobs' loop, and experiment A at 64
        workers lost ~4 points of efficiency in the runs it overlapped. A server whose
        dashboard nobody opens never compiles them."""
        if self._compiled:
            return
        ours = self._compiling
        if ours is None or (ours.done() and (ours.cancelled() or ours.exception() is not None)):
            # (the first, or one that failed or was cancelled: its failure is its own
            # requests', and the next request starts afresh)
            ours = asyncio.ensure_future(asyncio.to_thread(self.compile_templates))
            self._compiling = ours
        await asyncio.shield(ours)  # (a request cancelled meanwhile leaves it running)
        self._compiled = True

    def routes(self) -> list[BaseRoute]:
        page, act = self._page, self._action
        return [
            Route("/", page(self.overview_page), methods=["GET"]),
            Route("/jobs", page(self.jobs_page), methods=["GET"]),
            Route("/jobs/{job_id}", page(self.job_page), methods=["GET"]),
            Route("/workflows/{workflow_id}", page(self.workflow_page), methods=["GET"]),
            Route("/dead", page(self.dead_page), methods=["GET"]),
            Route("/queues", page(self.queues_page), methods=["GET"]),
            Route("/schedules", page(self.schedules_page), methods=["GET"]),
            Route("/workers", page(self.workers_page), methods=["GET"]),
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
            await self.compiled()
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
                self._writable(request)
            form = await read_form(request)
            if not self.sessions.csrf_ok(cookie, form.get("csrf")):
                raise Refused(
                    403,
                    "Refused",
                    "The form's CSRF field is missing or stale: reload the page and try again.",
                )
            request.state.form = form
            return await handler(request)

        return self._safe(gated)

    # -- rendering -----------------------------------------------------------------------

    def render(
        self, request: Request, name: str, *, status: int = 200, **context: Any
    ) -> HTMLResponse:
        """The page, or only its ``live`` block when htmx asks for a refresh."""
        template = self.env.get_template(name)
        cookie = request.cookies.get(COOKIE)
        context.update(
            csrf=self.sessions.csrf(cookie),
            read_only=self._read_only(request),
            signed_in=self.sessions.required and self.sessions.valid(cookie),
            engine=self.runtime.store.name,
            now=self.clock.time(),
            ago=ago,
            path=request.url.path,
        )
        if _refresh(request) and "live" in template.blocks:
            body = "".join(template.blocks["live"](template.new_context(context)))
        else:
            body = template.render(context)
        return HTMLResponse(body, status_code=status)

    # -- pages ---------------------------------------------------------------------------

    async def overview_page(self, request: Request) -> Response:
        data = overview(self.runtime, self.sampler.history)
        return self.render(request, "overview.html", **data)

    async def jobs_page(self, request: Request) -> Response:
        return await self._list(request, "jobs.html", state=None)

    async def dead_page(self, request: Request) -> Response:
        return await self._list(request, "dead.html", state=State.DEAD.value)

    async def _list(self, request: Request, template: str, state: str | None) -> Response:
        """A page of jobs: the filters from the query string, paged by the API's cursor;
        newest first unless ``order=asc`` (the running job is then at the top, not below
        every retained one)."""
        given = {k: v for k, v in request.query_params.items() if v and k != "limit"}
        if state is not None:
            given["state"] = state
        try:
            query = params.job_query({"order": "desc", **given, "limit": str(PAGE_SIZE)})
        except ValidationError as exc:
            raise Refused(422, "Bad filter", f"{exc.field}: {exc.message}") from exc
        jobs = await self.runtime.list_jobs(query)
        filters = {k: v for k, v in given.items() if k != "after" and (k, v) != ("state", state)}
        more = len(jobs) == query.limit
        return self.render(
            request,
            template,
            jobs=[job_view(j) for j in jobs],
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
        view = job_view(job)  # what the API shows of it: every attempt, its errors, progress
        # The args are outside the live block: a refresh neither shows nor renders them.
        args = "" if _refresh(request) else self.shown_args.get(view)
        return self.render(request, "job.html", job=view, args=args, result=pretty(job.result))

    async def workflow_page(self, request: Request) -> Response:
        """A workflow: its state and counts, its graph (``graph``), and its members."""
        workflow_id: str = request.path_params["workflow_id"]
        view = await self.runtime.workflow(workflow_id, limit=MEMBERS_SHOWN)
        if view is None:
            raise Refused(404, "No such workflow", f"No workflow {workflow_id[:64]!r} is kept "
                          "(a finished one goes with --retention, as a whole).")  # fmt: skip
        graph = None if view.next is not None else graph_svg(view.jobs, PREFIX)
        return self.render(request, "workflow.html", workflow=view, graph=graph,
                           total=sum(view.counts.values()), max_drawn=MAX_DRAWN)  # fmt: skip

    async def queues_page(self, request: Request) -> Response:
        return self.render(request, "queues.html", queues=await self.runtime.queues())

    async def workers_page(self, request: Request) -> Response:
        """The remote workers seen (``Remote.workers``: the most recently seen first)."""
        seen = self.runtime.remote.workers().workers
        workers = sorted(seen, key=lambda w: w.last_seen, reverse=True)
        config = self.runtime.config
        remote = sorted(config.remote_queues)
        if config.every_queue_remote:
            remote = ["every queue (--workers 0)"]
        return self.render(request, "workers.html", workers=workers, remote_queues=remote)

    async def schedules_page(self, request: Request) -> Response:
        after = request.query_params.get("after") or None
        if after is not None:
            try:
                check_name(after, "after")
            except ValidationError as exc:
                raise Refused(422, "Bad page", f"{exc.field}: {exc.message}") from exc
        everything = await self.runtime.store.list_schedules()  # name order, no job reads
        rows, last = await schedule_page(everything, self.runtime.schedules.view, after)
        return self.render(request, "schedules.html", schedules=rows,
                           next_page=None if last is None else urlencode({"after": last}),
                           live_query=urlencode({"after": after} if after else {}),
                           paged=after is not None)  # fmt: skip

    async def confirm_page(self, request: Request) -> Response:
        action = self._known(request, request.path_params["action"])
        fields = action.fields(dict(request.query_params))
        return self.render(request, "confirm.html", action=action.name, fields=fields,
                           question=action.ask(fields), back=action.back(fields))  # fmt: skip

    async def login_page(self, request: Request) -> Response:
        if not self.sessions.required:
            return RedirectResponse(f"{PREFIX}/", status_code=303)
        return self.render(request, "login.html", next=next_path(request.query_params.get("next")),
                           error=None)  # fmt: skip

    async def login(self, request: Request) -> Response:
        form = await read_form(request)
        target = next_path(form.get("next"))
        if not self.sessions.required:
            return RedirectResponse(target, status_code=303)
        if not self.sessions.csrf_ok(request.cookies.get(COOKIE), form.get("csrf")):
            raise Refused(403, "Refused", "The form is stale: reload the page and try again.")
        client = request.client.host if request.client else None
        if self.sessions.throttled(client):
            raise Refused(429, "Too many attempts", "Too many wrong tokens: wait a minute.")
        try:
            cookie = self.sessions.login(form.get("token", ""), client)
        except NotForTheDashboard as exc:
            raise Refused(403, "Refused", f"That token is of the {exc.who.role.value} role: "
                          "the dashboard takes the admin and read roles.") from None  # fmt: skip
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
        headers = {"etag": f'"{etag}"', "cache-control": "no-cache"}  # (nosniff: the server's)
        if request.headers.get("if-none-match") == f'"{etag}"':
            return Response(status_code=304, headers=headers)
        return Response(body, media_type=media, headers=headers)

    # -- actions -------------------------------------------------------------------------

    async def do(self, request: Request) -> Response:
        action = self._known(request, request.path_params["action"])
        fields = action.fields(request.state.form)
        text = await action.perform(self.runtime, fields)
        return self.render(request, "message.html", title="Done", text=text,
                           back=action.back(fields))  # fmt: skip

    def _known(self, request: Request, name: str) -> Action:
        self._writable(request)
        action = ACTIONS.get(name)
        if action is None:
            raise Refused(404, "No such action", f"Actions: {', '.join(ACTIONS)}.")
        return action

    def _read_only(self, request: Request) -> bool:
        """``--ui-read-only``, or a session of the read role."""
        if self.options.read_only:
            return True
        who = self.sessions.who(request.cookies.get(COOKIE))
        return who is not None and who.role is Role.READ

    def _writable(self, request: Request) -> None:
        if self.options.read_only:
            raise Refused(403, "Read-only", "This dashboard is read-only (--ui-read-only).")
        if self._read_only(request):
            raise Refused(403, "Read-only", "This session's token is of the read role: it "
                          "may look, not change anything.")  # fmt: skip
