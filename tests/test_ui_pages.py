"""The dashboard's pages and actions through the ASGI app: sessions, CSRF, read-only,
--no-ui, escaping."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from sqlq.common.clock import FakeClock
from sqlq.http.guard import Security
from sqlq.runtime.kinds import Registry, task
from sqlq.runtime.service import Service
from sqlq.ui.options import UiOptions
from sqlq.ui.overview import Sampler
from sqlq.ui.session import MAX_FAILURES
from tests.app_helpers import app_clients
from tests.helpers import submit, wait_for

FORM = {"content-type": "application/x-www-form-urlencoded"}
TOKEN = "t0ken-for-tests"


# -- the pages through the ASGI app ----------------------------------------------------------

Client = Callable[..., Any]


@pytest.fixture
async def ui() -> AsyncIterator[Client]:
    """``await ui(**create_app options)``: a client on a fresh memory service."""
    async for make in app_clients(2, fault_injection=True):
        yield make


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


async def test_every_page_renders_and_carries_the_security_headers(ui: Client) -> None:
    c = await ui()
    rt: Service = c.runtime
    job = await submit(rt, delay_ms=60_000, queue="mail")
    pages = ("/ui/", "/ui/jobs", "/ui/dead", "/ui/queues", f"/ui/jobs/{job.id}",
             "/ui/jobs?state=scheduled&queue=mail", "/ui/confirm/pause?queue=mail")  # fmt: skip
    for path in pages:
        r = await c.get(path)
        assert r.status_code == 200, (path, r.text[:300])
        assert r.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in r.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"]
        assert r.headers["x-frame-options"] == "DENY"
    assert (await c.get("/ui")).headers["location"].endswith("/ui/")


async def test_a_refresh_gets_only_the_live_part(ui: Client) -> None:
    c = await ui()
    page = (await c.get("/ui/")).text
    live = (await c.get("/ui/", headers={"hx-request": "true"})).text
    assert page.startswith("<!doctype html>")
    assert "<h1>Overview</h1>" in page
    assert live.lstrip().startswith('<div id="live"')
    assert "<h1>" not in live
    assert 'id="count-scheduled"' in live


async def test_the_jobs_table_pages_with_the_api_cursor(ui: Client) -> None:
    c = await ui()
    rt: Service = c.runtime
    ids = sorted([(await submit(rt, delay_ms=60_000, queue="bulk")).id for _ in range(60)])
    first = (await c.get("/ui/jobs?queue=bulk")).text  # newest first (test_ui_listing)
    shown = re.findall(r'href="/ui/jobs/([0-9a-f]+)"', first)
    assert shown == ids[:9:-1]
    [next_url] = re.findall(r'href="(/ui/jobs\?[^"]+)" rel="next"', first)
    second = (await c.get(next_url.replace("&amp;", "&"))).text
    assert re.findall(r'href="/ui/jobs/([0-9a-f]+)"', second) == ids[9::-1]
    assert 'rel="next"' not in second


async def test_a_bad_filter_is_a_page_naming_it(ui: Client) -> None:
    c = await ui()
    r = await c.get("/ui/jobs?state=bogus")
    assert r.status_code == 422
    assert "state:" in r.text
    r = await c.get("/ui/jobs?after=not-a-cursor")
    assert r.status_code == 422
    assert "after:" in r.text
    r = await c.get("/ui/jobs/" + "f" * 32)
    assert r.status_code == 404
    assert "No such job" in r.text


async def test_what_a_job_carries_is_escaped(ui: Client) -> None:
    evil = "<script>alert(1)</script>"
    kinds = Registry()

    @task(name="hostile", registry=kinds)
    def hostile(args: Any) -> Any:
        raise RuntimeError(evil)

    c = await ui(kinds=kinds)
    rt: Service = c.runtime
    job = await submit(rt, "hostile", args={"x": evil}, max_attempts=1)
    await wait_for(lambda: rt.live.get(job.id) is None, what="the job to die")
    for path in (f"/ui/jobs/{job.id}", "/ui/dead", "/ui/jobs?state=dead"):
        html = (await c.get(path)).text
        assert evil not in html, path
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html, path


async def test_actions_need_the_csrf_field_and_a_form(ui: Client) -> None:
    c = await ui()
    rt: Service = c.runtime
    job = await submit(rt, delay_ms=60_000)
    csrf = _csrf((await c.get(f"/ui/confirm/cancel?job={job.id}")).text)
    assert (await c.get(f"/jobs/{job.id}")).json()["state"] == "scheduled"  # GET changed nothing
    r = await c.post("/ui/do/cancel", data={"job": job.id})
    assert r.status_code == 403
    assert "CSRF" in r.text
    r = await c.post("/ui/do/cancel", data={"job": job.id, "csrf": "0" * 64})
    assert r.status_code == 403
    r = await c.post("/ui/do/cancel", json={"job": job.id, "csrf": csrf})
    assert r.status_code == 415
    r = await c.post("/ui/do/cancel", content=b"job=" + b"x" * 20_000, headers=FORM)
    assert r.status_code == 413
    r = await c.post("/ui/do/cancel", data={"job": job.id, "csrf": csrf},
                     headers={"origin": "http://evil.example"})  # fmt: skip
    assert r.status_code == 403
    assert r.json()["error"] == "cross_origin"
    assert (await c.get(f"/jobs/{job.id}")).json()["state"] == "scheduled"
    r = await c.post("/ui/do/cancel", data={"job": job.id, "csrf": csrf})
    assert r.status_code == 200
    assert f"Job {job.id} is cancelled." in r.text
    r = await c.post("/ui/do/cancel", data={"job": job.id, "csrf": csrf})
    assert r.status_code == 409  # a second cancel is refused, and says so
    r = await c.post("/ui/do/nuke", data={"csrf": csrf})
    assert r.status_code == 404


async def test_pause_and_resume_from_the_dashboard(ui: Client) -> None:
    c = await ui()
    rt: Service = c.runtime
    await submit(rt, delay_ms=60_000, queue="mail")  # so the queue is listed when running
    csrf = _csrf((await c.get("/ui/confirm/pause?queue=mail")).text)
    r = await c.post("/ui/do/pause", data={"queue": "mail", "csrf": csrf})
    assert r.status_code == 200
    assert (await rt.queues())["mail"].paused
    r = await c.post("/ui/do/resume", data={"queue": "mail", "csrf": csrf})
    assert r.status_code == 200
    assert not (await rt.queues())["mail"].paused
    r = await c.post("/ui/do/pause", data={"queue": "bad name!", "csrf": csrf})
    assert r.status_code == 422
    assert "queue:" in r.text


async def test_read_only_shows_no_action_and_refuses_every_one(ui: Client) -> None:
    c = await ui(ui=UiOptions(read_only=True))
    rt: Service = c.runtime
    job = await submit(rt, delay_ms=60_000, queue="mail")
    for path in ("/ui/jobs", f"/ui/jobs/{job.id}", "/ui/queues", "/ui/dead"):
        html = (await c.get(path)).text
        assert "/ui/confirm/" not in html
        assert "read-only" in html
    assert (await c.get(f"/ui/confirm/cancel?job={job.id}")).status_code == 403
    r = await c.post("/ui/do/cancel", data={"job": job.id})  # before any form or CSRF check
    assert r.status_code == 403
    assert "read-only (--ui-read-only)" in r.text
    assert (await c.get(f"/jobs/{job.id}")).json()["state"] == "scheduled"


async def test_no_ui_removes_the_dashboard(ui: Client) -> None:
    c = await ui(ui=None)
    assert (await c.get("/ui/")).status_code == 404
    assert (await c.get("/ui/static/htmx.min.js")).status_code == 404
    r = await c.post("/ui/do/pause", data={"queue": "q"})
    assert r.status_code == 415  # without the dashboard, /ui is just another JSON path


async def test_with_a_token_the_dashboard_asks_for_it_once(ui: Client) -> None:
    c = await ui(security=Security(token=TOKEN))
    r = await c.get("/ui/queues?x=1")
    assert r.status_code == 303
    assert r.headers["location"] == "/ui/login?next=/ui/queues%3Fx%3D1"
    login = await c.get("/ui/login?next=/ui/queues")
    csrf = _csrf(login.text)
    r = await c.post("/ui/login", data={"token": "nope", "csrf": csrf, "next": "/ui/queues"})
    assert r.status_code == 401
    assert "not the server&#39;s token" in r.text
    r = await c.post("/ui/login", data={"token": TOKEN, "csrf": csrf, "next": "//evil.example/"})
    assert r.status_code == 303
    assert r.headers["location"] == "/ui/"
    cookie = r.headers["set-cookie"]
    for attribute in ("HttpOnly", "SameSite=strict", "Path=/ui", "Max-Age="):
        assert attribute.lower() in cookie.lower()
    assert TOKEN not in cookie
    assert "secure" not in cookie.lower()  # plain HTTP: a Secure cookie would not be kept
    assert (await c.get("/ui/queues")).status_code == 200  # the client kept the cookie
    assert (await c.get("/queues")).status_code == 401  # the API wants the bearer token
    r = await c.post("/ui/logout", data={"csrf": _csrf((await c.get("/ui/")).text)})
    assert r.status_code == 303
    assert (await c.get("/ui/queues")).status_code == 303


async def test_guessing_the_token_on_the_login_form_is_throttled(ui: Client) -> None:
    c = await ui(security=Security(token=TOKEN))
    csrf = _csrf((await c.get("/ui/login")).text)
    codes = [
        (await c.post("/ui/login", data={"token": f"g{i}", "csrf": csrf})).status_code
        for i in range(MAX_FAILURES + 1)
    ]
    assert codes == [401] * MAX_FAILURES + [429]
    r = await c.post("/ui/login", data={"token": TOKEN, "csrf": csrf})
    assert r.status_code == 429  # even the right token waits out the minute


async def test_the_sampler_reads_the_services_totals(ui: Client) -> None:
    c = await ui()
    rt: Service = c.runtime
    clock = FakeClock()
    sampler = Sampler(rt, clock)
    sampler.take()
    for _ in range(5):
        await submit(rt, delay_ms=60_000)
    clock.mono += 2.0
    sampler.take()
    assert sampler.history.latest_rates()["submitted"] == 2.5
    html = (await c.get("/ui/")).text  # the app's own sampler has not run: still a page
    assert 'id="count-scheduled">5<' in html


async def test_behind_a_tls_proxy_the_cookie_can_be_marked_secure(ui: Client) -> None:
    c = await ui(security=Security(token=TOKEN), ui=UiOptions(secure_cookie=True))
    csrf = _csrf((await c.get("/ui/login")).text)
    r = await c.post("/ui/login", data={"token": TOKEN, "csrf": csrf})
    assert r.status_code == 303
    assert "; secure" in r.headers["set-cookie"].lower()


def test_dashboard_flags_without_the_dashboard_are_a_usage_error() -> None:
    from click.testing import CliRunner

    from sqlq.cli import main

    for flag in ("--ui-read-only", "--ui-secure-cookie"):
        r = CliRunner().invoke(main, ["serve", "--no-ui", flag])
        assert r.exit_code == 2
        assert f"{flag} is for the dashboard, which --no-ui removes" in r.output


async def test_a_workflows_page_draws_its_graph_and_its_actions_act(ui: Client) -> None:
    from sqlq.common.specs import MemberSpec

    c = await ui()
    rt: Service = c.runtime
    specs = [MemberSpec(kind="sleep", args={"fail_prob": 1}, ref="a<b>", max_attempts=1),
             MemberSpec(kind="sleep", ref="b", depends_on=("a<b>",))]  # fmt: skip
    (a, b), _ = await rt.submit(specs, batch=True, workflow=True)
    assert a.flow is not None
    wf = a.flow.workflow_id
    await wait_for(lambda: rt.live.get(b.id) is None, what="b cancelled with a")
    r = await c.get(f"/ui/workflows/{wf}")
    assert r.status_code == 200, r.text[:300]
    assert 'id="workflow-graph"' in r.text
    assert r.text.count('<line class="edge"') == 1
    assert "a&lt;b&gt;" in r.text
    assert "a<b>" not in r.text
    assert f'href="/ui/jobs/{b.id}"' in r.text
    assert 'id="retry-workflow"' in r.text
    assert "Retry its 1 dead job<" in r.text
    page = await c.get(f"/ui/jobs/{b.id}")
    assert f'href="/ui/workflows/{wf}"' in page.text
    confirm = await c.get(f"/ui/confirm/retry-workflow?workflow={wf}")
    assert confirm.status_code == 200
    done = await c.post("/ui/do/retry-workflow", data={"workflow": wf, "csrf": _csrf(confirm.text)},
                        headers=FORM)  # fmt: skip
    assert done.status_code == 200, done.text[:300]
    assert "Retried 1 dead job" in done.text
    assert (await c.get(f"/ui/workflows/{'0' * 32}")).status_code == 404


async def test_a_large_workflows_page_lists_its_first_thousand_of_all(ui: Client) -> None:
    from sqlq.common.specs import MemberSpec

    c = await ui()
    rt: Service = c.runtime
    specs = [MemberSpec(kind="sleep", ref="root", args={"work_ms": 60_000})] + [
        MemberSpec(kind="sleep", depends_on=("root",)) for _ in range(1_199)
    ]
    jobs, _ = await rt.submit(specs, batch=True, workflow=True)
    assert jobs[0].flow is not None
    r = await c.get(f"/ui/workflows/{jobs[0].flow.workflow_id}")
    assert r.status_code == 200, r.text[:300]
    assert r.text.count('href="/ui/jobs/') == 1_000
    assert "The first 1000 of 1200." in r.text
    state = r.text.split('<p id="workflow-state">', 1)[1].split("</p>", 1)[0]
    assert "1200 jobs:" in state  # every member counted, not the page listed
    assert "Not drawn: more than 300 jobs" in r.text


async def test_the_queues_page_shows_a_queues_policy(ui: Client) -> None:
    """#37: a policy in a line under its queue's name, escaped as everything the page shows."""
    from sqlq.common.fair import KeyPolicy, Policy, Rate

    c = await ui()
    rt: Service = c.runtime
    policy = Policy(key_concurrency=2, rate=Rate(per_s=10.0, burst=3),
                    keys={"vip": KeyPolicy(weight=4)})  # fmt: skip
    await rt.set_policy("api", policy)
    html = (await c.get("/ui/queues")).text
    assert 'id="queue-policy-api"' in html
    assert "2 at once per key; 10/s (burst 3) per key; 1 key override; fair between keys" in html
