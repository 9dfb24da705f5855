"""The dashboard without a browser: its pure parts on injected time, and its pages and
actions through the ASGI app (sessions, CSRF, read-only, --no-ui, escaping).

What needs a browser (the live refresh, the clicks, layout, contrast, the cookie as a
browser keeps it) is in ``test_ui_browser.py``.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.engine.memory import MemoryStore
from sqlq.common.store import JobStore
from sqlq.engines.postgres.store import PostgresStore
from sqlq.http.app import create_app
from sqlq.http.guard import Security
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.kinds import Registry, task
from sqlq.runtime.service import Service
from sqlq.ui.charts import line_chart, nice_ceiling, short
from sqlq.ui.history import History, Sample, quantile
from sqlq.ui.options import UiOptions
from sqlq.ui.overview import SAMPLE_EVERY_S, Sampler
from sqlq.ui.session import MAX_FAILURES, SESSION_S, Sessions
from tests.helpers import ROOT, ServiceFactory, StoreFactory, submit, wait_for

INF = float("inf")
BOUNDS = (0.001, 0.01, 0.1, 1.0, INF)
FORM = {"content-type": "application/x-www-form-urlencoded"}
TOKEN = "t0ken-for-tests"

# -- history: rates and percentiles from cumulative samples ---------------------------------


def _sample(at: float, counts: tuple[int, ...], wait: tuple[float, ...] = (0,) * 5) -> Sample:
    return Sample(at=at, counts=counts, wait=wait, run=(0,) * 5, commit=(0,) * 5)


def test_quantile_interpolates_within_a_bucket_like_prometheus() -> None:
    # 10 observations in (0.001, 0.01], 10 in (0.01, 0.1]
    assert quantile(0.5, BOUNDS, [0, 10, 10, 0, 0]) == pytest.approx(0.01)
    assert quantile(0.75, BOUNDS, [0, 10, 10, 0, 0]) == pytest.approx(0.01 + 0.09 * 0.5)
    assert quantile(0.99, BOUNDS, [0, 0, 0, 0, 5]) == 1.0  # past the last edge: that edge
    assert quantile(0.5, BOUNDS, [0, 0, 0, 0, 0]) is None


def test_rates_are_differences_between_samples_per_second() -> None:
    h = History(BOUNDS)
    h.add(_sample(10.0, (0, 0, 0, 0)))
    h.add(_sample(11.0, (100, 50, 2, 1)))
    h.add(_sample(11.0, (999, 999, 999, 999)))  # no time passed: ignored
    h.add(_sample(13.0, (300, 250, 2, 1)))
    rates = h.rates()
    assert rates["submitted"] == [(2.0, 100.0), (0.0, 100.0)]  # (seconds ago, per second)
    assert rates["dead"] == [(2.0, 1.0), (0.0, 0.0)]
    assert h.latest_rates(window_s=10) == {
        "submitted": 100.0, "completed": 250 / 3, "failed": 2 / 3, "dead": 1 / 3,
    }  # fmt: skip
    assert h.age() == 3.0


def test_percentiles_cover_only_the_window() -> None:
    h = History(BOUNDS)
    # cumulative bucket counts (le 0.001, 0.01, 0.1, 1, +Inf) since start
    h.add(_sample(0.0, (0,) * 4))
    h.add(_sample(50.0, (0,) * 4, wait=(0, 0, 0, 100, 100)))  # 100 slow ones, long ago
    h.add(_sample(100.0, (0,) * 4, wait=(0, 0, 0, 100, 100)))
    h.add(_sample(130.0, (0,) * 4, wait=(10, 20, 20, 120, 120)))  # then 10 + 10 fast
    p = h.percentiles("wait", window_s=60.0)
    assert p.count == 20
    assert p.p50 == pytest.approx(0.001)
    assert p.p99 is not None
    assert p.p99 < 0.01
    everything = h.percentiles("wait", window_s=1000.0)
    assert everything.count == 120
    assert everything.p50 is not None
    assert everything.p50 > 0.1


def test_an_empty_or_single_sample_history_has_nothing_to_say() -> None:
    h = History(BOUNDS)
    assert h.rates()["submitted"] == []
    assert h.percentiles("run").p50 is None
    h.add(_sample(1.0, (5, 5, 5, 5)))
    assert h.latest_rates()["submitted"] == 0.0
    assert h.percentiles("run").count == 0


def test_history_keeps_only_the_last_samples() -> None:
    h = History(BOUNDS, keep=3)
    for t in range(10):
        h.add(_sample(float(t), (t, 0, 0, 0)))
    assert len(h) == 3
    assert h.age() == 2.0


# -- charts ---------------------------------------------------------------------------------


def test_chart_scale_and_labels() -> None:
    assert [nice_ceiling(v) for v in (0, 0.7, 1, 3, 26, 4100)] == [1, 1, 1, 5, 50, 5000]
    assert [short(v) for v in (0, 950, 1200, 36_000, 1_500_000)] == [
        "0", "950", "1.2k", "36k", "1.5M",
    ]  # fmt: skip


def test_a_chart_draws_each_series_and_escapes_its_label() -> None:
    svg = str(line_chart(
        {"submitted": [(60.0, 10.0), (0.0, 20.0)], "dead": [(0.0, 1.0)]},
        span_s=120, unit="jobs/s", label="<b>rates</b>",
    ))  # fmt: skip
    assert svg.count("<polyline") == 1  # a series needs two points to be a line
    assert 'class="line series-submitted" points="300.0,80.0 600.0,0.0"' in svg
    assert "&lt;b&gt;rates&lt;/b&gt;" in svg
    assert "<b>" not in svg
    assert "<span>20</span>" in svg
    assert "-2 min" in svg


# -- sessions on a fake clock ---------------------------------------------------------------


def test_a_session_cookie_is_not_the_token_and_runs_out() -> None:
    clock = FakeClock()
    s = Sessions(TOKEN, clock=clock, secret=b"k" * 32)
    assert s.required
    assert not s.valid(None)
    assert not s.valid("junk")
    assert not s.valid("1.2")
    assert s.login("wrong") is None
    cookie = s.login(TOKEN)
    assert cookie is not None
    assert TOKEN not in cookie
    assert s.valid(cookie)
    expires, mac = cookie.split(".")
    assert not s.valid(f"{int(expires) + 1}.{mac}")  # the expiry is signed
    clock.now += SESSION_S + 1
    assert not s.valid(cookie)
    # Another token (a restart with a new --token) ends every session.
    assert not Sessions("other", clock=clock).valid(s.login(TOKEN))


def test_csrf_values_are_per_session_and_per_process() -> None:
    s = Sessions(TOKEN, clock=FakeClock(), secret=b"k" * 32)
    a, b = s.login(TOKEN), "1.x"
    assert s.csrf_ok(a, s.csrf(a))
    assert not s.csrf_ok(a, s.csrf(b))
    assert not s.csrf_ok(a, None)
    restarted = Sessions(TOKEN, clock=FakeClock(), secret=b"j" * 32)
    assert not restarted.csrf_ok(a, s.csrf(a))
    anonymous = Sessions(None, secret=b"k" * 32)
    assert anonymous.valid(None)
    assert anonymous.csrf_ok(None, anonymous.csrf("anything"))


def test_failed_logins_are_throttled_for_a_minute() -> None:
    clock = FakeClock()
    s = Sessions(TOKEN, clock=clock)
    for _ in range(MAX_FAILURES):
        assert not s.throttled()
        s.login("guess")
    assert s.throttled()
    clock.mono += 61
    assert not s.throttled()


# -- the pages through the ASGI app ----------------------------------------------------------

Client = Callable[..., Any]


@pytest.fixture
async def ui() -> AsyncIterator[Client]:
    """``await ui(**create_app options)``: a client on a fresh memory service."""
    made: list[tuple[Service, httpx.AsyncClient]] = []

    async def make(kinds: Registry | None = None, **options: Any) -> httpx.AsyncClient:
        config = RuntimeConfig(workers=2, seed=1, fault_injection=True)
        rt = Service(MemoryStore(), config, kinds=kinds)
        await rt.start()
        app = create_app(rt, start_runtime=False, **options)
        c = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost")
        c.runtime = rt  # type: ignore[attr-defined]
        made.append((rt, c))
        return c

    yield make
    for rt, c in made:
        await c.aclose()
        await rt.stop(0)


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
    first = (await c.get("/ui/jobs?queue=bulk")).text
    shown = re.findall(r'href="/ui/jobs/([0-9a-f]+)"', first)
    assert shown == ids[:50]
    [next_url] = re.findall(r'href="(/ui/jobs\?[^"]+)" rel="next"', first)
    second = (await c.get(next_url.replace("&amp;", "&"))).text
    assert re.findall(r'href="/ui/jobs/([0-9a-f]+)"', second) == ids[50:]
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


def test_the_vendored_htmx_is_the_pinned_one() -> None:
    static = ROOT / "sqlq" / "ui" / "static"
    pinned = re.search(r"`htmx.min.js` \| htmx \| ([\d.]+) .*?`([0-9a-f]{64})`",
                       (static / "VENDORED.md").read_text())  # fmt: skip
    assert pinned, "VENDORED.md names htmx's version and hash"
    digest = hashlib.sha256((static / "htmx.min.js").read_bytes()).hexdigest()
    assert digest == pinned.group(2)
    assert f'version:"{pinned.group(1)}"' in (static / "htmx.min.js").read_text()


def test_templates_and_assets_are_package_data() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"sqlq.ui" = ["templates/*.html", "static/*"]' in pyproject
    assert any(Path(ROOT, "sqlq/ui/templates").glob("*.html"))


async def test_the_overview_shows_the_last_compaction(
    durable_factory: StoreFactory, services: ServiceFactory
) -> None:
    rt = services(durable_factory(), compact_every_s=0.05)
    await rt.start()
    await submit(rt, delay_ms=60_000)
    app = create_app(rt, start_runtime=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
        seen: list[str] = [""]

        async def compacted() -> bool:
            seen[0] = (await c.get("/ui/")).text
            return "none since start" not in seen[0]

        await wait_for(compacted, what="a compaction on the overview")
    assert re.search(r" ago: pruned \d+, [\d.]+ \w*B → [\d.]+ \w*B in [\d.]+ s", seen[0])


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


async def test_the_sampler_waits_on_the_injected_clock(services: ServiceFactory) -> None:
    clock = FakeClock()
    rt = services(clock=clock)
    await rt.start()
    sampler = Sampler(rt, clock)

    async def turns() -> None:  # the sampler's task runs on the loop's next turns
        for _ in range(3):
            await asyncio.sleep(0)

    sampler.start()
    try:
        await turns()
        assert len(sampler.history) == 1  # one at the start
        for n in (2, 3, 4):
            clock.advance(SAMPLE_EVERY_S)  # fires the sampler's sleep; no real second passes
            await turns()
            assert len(sampler.history) == n
    finally:
        await sampler.stop()


async def test_in_shared_mode_the_overview_reads_the_census_the_claimer_keeps(
    pg_db: str, services: ServiceFactory
) -> None:
    store = PostgresStore(pg_db)
    rt = services(store)
    await rt.start()
    await submit(rt, delay_ms=60_000, queue="mail")
    await wait_for(lambda: ("scheduled", "mail") in rt.claims.census(), what="a census")
    here = asyncio.current_task()  # the ASGI transport runs the app in this task
    asked: list[str] = []
    for name in ("census", "paused_queues", "nodes", "list_jobs", "get"):
        real = getattr(store, name)

        def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
            if asyncio.current_task() is here:  # not the claimer's own census loop
                asked.append(_name)
            return _real(*args)

        setattr(store, name, counted)
    app = create_app(rt, start_runtime=False)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as c:
        for _ in range(3):
            live = (await c.get("/ui/", headers={"hx-request": "true"})).text
    assert asked == []
    assert ">mail<" in live
    assert 'id="count-scheduled">1<' in live


async def test_every_engine_fills_the_overviews_store_fields(store: JobStore) -> None:
    """Disk size and the last compaction are common fields the dashboard reads by name;
    ``/stats`` keeps each engine's own keys for them."""
    assert store.stats().last_compaction is None
    report = await store.compact()
    stats = store.stats()
    assert stats.last_compaction is not None
    assert stats.last_compaction[1] == report
    if store.name in ("walq", "sqlite"):
        assert stats.disk_bytes is not None
        assert stats.disk_bytes > 0
    else:
        assert stats.disk_bytes is None  # no files of its own
    keys = set(stats.to_dict())
    assert ("disk_bytes" in keys) == (store.name == "sqlite")
    assert ({"log_bytes", "last_compaction"} <= keys) == (store.name == "walq")
