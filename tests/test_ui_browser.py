"""The dashboard in a real browser: Debian's chromium, driven by Playwright, against a
real ``sqlq serve``.

Jobs go in through the JSON API (httpx); what is checked is what the page shows
and what its buttons do. Every wait is Playwright's ``expect`` (it polls the
page until a deadline) or ``wait_for`` on the API; nothing sleeps and hopes.

``SQLQ_SCREENSHOTS=docs pytest tests/test_ui_browser.py -k screenshots`` writes
the README's screenshots (``docs/``); otherwise they go to a temporary folder.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from sqlq.bench.client.server import ServerProcess
from tests.helpers import ROOT, spawn_server, unavailable

pytestmark = pytest.mark.slow


CHROMIUM = os.environ.get("SQLQ_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
TOKEN = "s3cret-token-for-the-ui-test"
WAIT_MS = 15_000  # the longest any page condition may take


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        unavailable(f"no chromium at {CHROMIUM} (.ci/run installs Debian's package)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


def _server(tmp: Path, *flags: str, env: dict[str, str] | None = None) -> ServerProcess:
    server = spawn_server(
        "--store", "sqlite", "--data", str(tmp / "data"), "--fault-injection",
        "--retry-base-ms", "1", *flags, env=env,
    )  # fmt: skip
    server.wait_ready()
    return server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    s = _server(tmp_path)
    yield s
    s.stop()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh browser context; fails the test on any script error or CSP violation."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    p = context.new_page()
    problems: list[str] = []
    p.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    p.on("pageerror", lambda e: problems.append(str(e)))
    expect.set_options(timeout=WAIT_MS)
    yield p
    context.close()
    assert not problems, f"the page logged errors: {problems}"


def api(server: ServerProcess, token: str | None = None) -> httpx.Client:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=10)


def submit(c: httpx.Client, **spec: Any) -> str:
    r = c.post("/jobs", json={"kind": "sleep", **spec})
    assert r.status_code == 201, r.text
    job_id: str = r.json()["id"]
    return job_id


def state_of(c: httpx.Client, job_id: str) -> str:
    state: str = c.get(f"/jobs/{job_id}").json()["state"]
    return state


def until(predicate: Callable[[], bool], what: str, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what}")
        time.sleep(0.02)


def count(page: Page, state: str) -> int:
    return int(page.locator(f"#count-{state}").inner_text())


def test_the_overview_counts_change_without_a_reload(server: ServerProcess, page: Page) -> None:
    page.goto(server.url + "/ui/")
    expect(page.locator("h1")).to_have_text("Overview")
    expect(page.locator("#count-scheduled")).to_have_text("0")
    loads = page.evaluate("performance.getEntriesByType('navigation').length")
    with api(server) as c:
        for _ in range(3):
            submit(c, delay_ms=600_000)  # stay scheduled
        done = [submit(c) for _ in range(4)]
        until(lambda: all(state_of(c, j) == "completed" for j in done), "the jobs to complete")
    expect(page.locator("#count-scheduled")).to_have_text("3")
    expect(page.locator("#count-completed")).to_have_text("4")
    # The rate legend moved off zero, and the page was never reloaded to show any of it.
    expect(page.locator(".legend")).to_contain_text(re.compile(r"submitted [1-9]"))
    assert page.evaluate("performance.getEntriesByType('navigation').length") == loads
    assert page.evaluate("window.sqlqLive.sent()") > 0


def test_refreshing_stops_while_the_tab_is_hidden(server: ServerProcess, page: Page) -> None:
    page.goto(server.url + "/ui/")
    expect(page.locator("h1")).to_have_text("Overview")
    page.wait_for_function("() => typeof htmx !== 'undefined' && window.sqlqLive !== undefined")
    hide = "h => Object.defineProperty(document, 'hidden', {value: h, configurable: true})"
    page.evaluate(hide, True)
    before = page.evaluate("window.sqlqLive.sent()")
    assert page.evaluate("window.sqlqLive.tick()") is False
    assert page.evaluate("window.sqlqLive.sent()") == before  # a tick while hidden sends nothing
    page.evaluate(hide, False)
    assert page.evaluate("window.sqlqLive.tick()") is True
    # (htmx drops a tick that finds the last refresh still in flight: the next one sends)
    page.wait_for_function("n => window.sqlqLive.sent() > n", arg=before)


def test_a_failed_job_is_a_dead_letter_and_retrying_it_from_the_page_schedules_it(
    server: ServerProcess, page: Page
) -> None:
    page.goto(server.url + "/ui/dead")
    expect(page.locator("table.jobs")).to_contain_text("No jobs match.")
    with api(server) as c:
        job = submit(c, queue="flaky", max_attempts=2, args={"fail_prob": 1.0})
        until(lambda: state_of(c, job) == "dead", "the job to die")
        # The page shows it without a reload, with the error the attempt ended in.
        row = page.locator("table.jobs tr", has=page.locator(f"a[href$='/jobs/{job}']"))
        expect(row).to_contain_text("dead")
        expect(row).to_contain_text("injected failure")
        # Pause its queue so that the retried job stays where the retry puts it.
        assert c.post("/queues/flaky/pause").status_code == 200
        row.get_by_role("link", name="Retry").click()
        expect(page.locator("#question")).to_contain_text(f"Run job {job} again?")
        assert state_of(c, job) == "dead"  # the confirmation page changed nothing
        page.get_by_role("button", name=re.compile("Yes")).click()
        expect(page.locator("#message")).to_have_text(f"Job {job} is scheduled again.")
        assert state_of(c, job) == "scheduled"
    page.goto(server.url + f"/ui/jobs/{job}")
    expect(page.locator(".badge").first).to_have_text("scheduled")
    expect(page.locator("main")).to_contain_text("2 before the last retry")


def test_retry_all_that_match_a_filter(server: ServerProcess, page: Page) -> None:
    with api(server) as c:
        assert c.post("/queues/a/pause").status_code == 200
        dead_a = [submit(c, queue="a", max_attempts=1, args={"fail_prob": 1.0}) for _ in range(3)]
        dead_b = submit(c, queue="b", max_attempts=1, args={"fail_prob": 1.0})
        # Paused queue a never runs them: resume it only for the run that kills them.
        assert c.post("/queues/a/resume").status_code == 200
        until(lambda: all(state_of(c, j) == "dead" for j in [*dead_a, dead_b]), "four deaths")
        assert c.post("/queues/a/pause").status_code == 200
        page.goto(server.url + "/ui/dead")
        page.get_by_label("Queue").fill("a")
        page.get_by_role("button", name="Filter").click()
        expect(page.locator("table.jobs tbody tr")).to_have_count(3)
        page.locator("#retry-all").click()
        expect(page.locator("#question")).to_contain_text("Retry every dead job with queue a?")
        page.get_by_role("button", name=re.compile("Yes")).click()
        expect(page.locator("#message")).to_have_text("Retried 3 dead jobs with queue a.")
        assert [state_of(c, j) for j in dead_a] == ["scheduled"] * 3
        assert state_of(c, dead_b) == "dead"


def test_cancel_a_scheduled_job_from_its_page(server: ServerProcess, page: Page) -> None:
    with api(server) as c:
        job = submit(c, delay_ms=600_000)
        page.goto(server.url + f"/ui/jobs/{job}")
        page.locator("#cancel-job").click()
        page.get_by_role("button", name=re.compile("Yes")).click()
        expect(page.locator("#message")).to_have_text(f"Job {job} is cancelled.")
        assert state_of(c, job) == "cancelled"


def test_pausing_a_queue_from_the_page_stops_its_jobs(server: ServerProcess, page: Page) -> None:
    with api(server) as c:
        first = submit(c, queue="mail")
        until(lambda: state_of(c, first) == "completed", "the first mail job")
        page.goto(server.url + "/ui/queues")
        page.get_by_label("Pause a queue by name").fill("mail")
        page.get_by_role("button", name="Pause…").click()
        page.get_by_role("button", name=re.compile("Yes")).click()
        expect(page.locator("#message")).to_contain_text("Queue mail is paused")
        held = [submit(c, queue="mail") for _ in range(5)]
        other = submit(c, queue="other")  # submitted after them, on a queue that runs
        until(lambda: state_of(c, other) == "completed", "the other queue's job")
        assert [state_of(c, j) for j in held] == ["scheduled"] * 5
        page.goto(server.url + "/ui/queues")
        row = page.locator("#queue-mail")
        expect(row).to_contain_text("paused")
        expect(row.locator("td").first).to_have_text("5")
        row.get_by_role("link", name="Resume").click()
        page.get_by_role("button", name=re.compile("Yes")).click()
        expect(page.locator("#message")).to_have_text("Queue mail runs again.")
        until(lambda: all(state_of(c, j) == "completed" for j in held), "the held jobs to run")


def test_the_token_prompt_keeps_an_unauthenticated_browser_out(
    browser: Browser, tmp_path: Path
) -> None:
    server = _server(tmp_path, env={"SQLQ_TOKEN": TOKEN})
    context = browser.new_context()
    page = context.new_page()
    try:
        with api(server, TOKEN) as c:
            job = submit(c, delay_ms=600_000, args={"work_ms": 1})
        for path in ("/ui/", "/ui/jobs", f"/ui/jobs/{job}", "/ui/dead", "/ui/queues"):
            page.goto(server.url + path)
            expect(page.locator("h1")).to_have_text("Sign in")
            expect(page.locator("table, .badge, .cards")).to_have_count(0)  # nothing shown
        # An action without a session is refused, whatever it carries.
        refused = page.request.post(server.url + "/ui/do/cancel", form={"job": job, "csrf": "x"})
        assert refused.status == 401
        page.get_by_label("Token").fill("wrong")
        page.get_by_role("button", name="Sign in").click()
        expect(page.locator("#error")).to_have_text("That is not the server's token.")
        page.get_by_label("Token").fill(TOKEN)
        page.get_by_role("button", name="Sign in").click()
        expect(page.locator("h1")).to_have_text("Queues")  # back where the prompt came up
        [cookie] = context.cookies()
        assert cookie["httpOnly"]
        assert cookie["sameSite"] == "Strict"
        assert cookie["path"] == "/ui"
        assert TOKEN not in cookie["value"]  # the browser keeps a session, not the token
        assert page.evaluate("document.cookie") == ""  # no script can read it
        page.goto(server.url + f"/ui/jobs/{job}")
        expect(page.locator("h1")).to_contain_text(job)
        # The cookie opens the dashboard only: the JSON API still wants the bearer token.
        assert page.request.get(server.url + "/jobs").status == 401
        page.get_by_role("button", name="Sign out").click()
        expect(page.locator("h1")).to_have_text("Sign in")
        page.goto(server.url + "/ui/queues")
        expect(page.locator("h1")).to_have_text("Sign in")
    finally:
        context.close()
        server.stop()


def test_a_cross_site_post_without_the_csrf_defence_is_refused(
    server: ServerProcess, browser: Browser
) -> None:
    context = browser.new_context()  # not ``page``: the refusals are console errors here
    page = context.new_page()
    # A page on another site whose form posts to the dashboard, as an attacker's would.
    attack = (
        f'<form id="f" method="post" action="{server.url}/ui/do/pause">'
        '<input name="queue" value="default"></form>'
        '<button id="go" onclick="document.getElementById(\'f\').submit()">go</button>'
    )
    page.route("http://attacker.test/", lambda r: r.fulfill(body=attack, content_type="text/html"))
    page.goto("http://attacker.test/")
    with page.expect_navigation():
        page.locator("#go").click()
    assert "cross-origin requests are refused" in page.content()
    # Without an Origin header (not a browser), the missing CSRF field is what refuses it.
    no_csrf = page.request.post(server.url + "/ui/do/pause", form={"queue": "default"})
    assert no_csrf.status == 403
    assert "CSRF" in no_csrf.text()
    context.close()
    with api(server) as c:
        assert {q["name"]: q["paused"] for q in c.get("/queues").json()["queues"]}.get(
            "default", False
        ) is False


def test_the_pages_fit_a_phone_and_a_laptop(server: ServerProcess, browser: Browser) -> None:
    with api(server) as c:
        job = submit(c, max_attempts=1, args={"fail_prob": 1.0})
        until(lambda: state_of(c, job) == "dead", "a dead job")
    for width in (390, 1280):
        context = browser.new_context(viewport={"width": width, "height": 800})
        page = context.new_page()
        for path in ("/ui/", "/ui/jobs", "/ui/dead", "/ui/queues", f"/ui/jobs/{job}"):
            page.goto(server.url + path)
            expect(page.locator("main h1")).to_be_visible()
            overflow = page.evaluate(
                "document.documentElement.scrollWidth - document.documentElement.clientWidth"
            )
            assert overflow <= 0, f"{path} at {width} px scrolls sideways by {overflow} px"
        page.goto(server.url + "/ui/dead")  # the action needs no sideways scrolling either
        expect(page.locator(f"#retry-{job}")).to_be_in_viewport()
        context.close()


CONTRAST = """() => {
  const lum = c => {
    const [r, g, b] = c.match(/[\\d.]+/g).slice(0, 3).map(Number).map(v => {
      v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const background = el => {
    for (; el; el = el.parentElement) {
      const bg = getComputedStyle(el).backgroundColor;
      const alpha = bg.startsWith('rgba') ? Number(bg.match(/[\\d.]+/g)[3]) : 1;
      if (alpha > 0) return bg;
    }
    return 'rgb(255, 255, 255)';
  };
  const worst = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!n.textContent.trim() || !el.checkVisibility() || el.closest('svg, .skip, .sr')) continue;
    const style = getComputedStyle(el);
    const [a, b] = [lum(style.color), lum(background(el))];
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    const large = parseFloat(style.fontSize) >= 24 ||
      (parseFloat(style.fontSize) >= 18.66 && Number(style.fontWeight) >= 700);
    const text = n.textContent.trim().slice(0, 30);
    if (ratio < (large ? 3 : 4.5)) worst.push(`${text}: ${ratio.toFixed(2)}`);
  }
  return worst;
}"""


def test_text_has_enough_contrast_and_the_keyboard_reaches_everything(
    server: ServerProcess, page: Page
) -> None:
    with api(server) as c:
        job = submit(c, max_attempts=1, args={"fail_prob": 1.0})
        until(lambda: state_of(c, job) == "dead", "a dead job")
        submit(c, delay_ms=600_000)
    for path in ("/ui/", "/ui/jobs", "/ui/dead", "/ui/queues", f"/ui/jobs/{job}"):
        page.goto(server.url + path)
        expect(page.locator("main h1")).to_be_visible()
        assert page.evaluate(CONTRAST) == [], f"low contrast on {path}"
    # From the top of the dead-letter page, the keyboard alone retries the job.
    page.goto(server.url + "/ui/dead")
    page.keyboard.press("Tab")
    expect(page.locator(":focus")).to_have_text("Skip to content")
    for _ in range(40):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.id") == f"retry-{job}":
            break
    else:
        raise AssertionError("Tab never reached the Retry link")
    # A refresh swaps the table under the focus; the focus stays on the same link.
    page.evaluate("""() => { window.settled = 0;
        document.addEventListener('htmx:afterSettle', () => { window.settled += 1; }); }""")
    page.wait_for_function("() => window.sqlqLive.tick() && window.settled > 0")
    assert page.evaluate("document.activeElement.id") == f"retry-{job}"
    page.keyboard.press("Enter")
    expect(page.locator("#confirm")).to_be_focused()  # the confirmation takes the focus
    page.keyboard.press("Enter")
    expect(page.locator("#message")).to_contain_text(f"Job {job} is")


def _traffic(c: httpx.Client, seconds: float) -> None:
    """Waves of jobs, some failing, each wave finished before the next: a chart's worth."""
    end = time.monotonic() + seconds
    wave = 0
    while True:
        n = 6 + 5 * (wave % 4)
        jobs = [
            submit(c, queue=("emails", "thumbnails")[i % 2], max_attempts=3,
                   args={"work_ms": 5 + i % 20, "fail_prob": 0.15})
            for i in range(n)
        ]  # fmt: skip

        def finished(js: list[str] = jobs) -> bool:
            return all(state_of(c, j) in ("completed", "dead") for j in js)

        until(finished, "a wave")
        wave += 1
        if time.monotonic() > end:
            return


def test_screenshots(server: ServerProcess, browser: Browser, tmp_path: Path) -> None:
    """The README's pictures: a queue with traffic, failures and dead letters.

    With ``SQLQ_SCREENSHOTS`` set (the folder to write to) the traffic runs for half a
    minute first, so that the chart has a history to draw.
    """
    target = os.environ.get("SQLQ_SCREENSHOTS")
    to = Path(target or tmp_path)
    if not to.is_absolute():
        to = ROOT / to
    to.mkdir(parents=True, exist_ok=True)
    with api(server) as c:
        c.post("/queues/reports/pause")
        for i in range(12):
            submit(c, queue="reports", args={"work_ms": 20}, priority=i % 3)
        for _ in range(6):
            submit(c, queue="emails", delay_ms=600_000)
        dead = [
            submit(c, queue="thumbnails", max_attempts=2, args={"fail_prob": 1.0}) for _ in range(4)
        ]
        until(lambda: all(state_of(c, j) == "dead" for j in dead), "the dead letters")
        _traffic(c, 30.0 if target else 0.0)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(server.url + "/ui/")
    expect(page.locator("svg.chart polyline").first).to_be_attached()
    assert count(page, "dead") >= 4
    page.screenshot(path=str(to / "dashboard-overview.png"), full_page=True)
    page.goto(server.url + "/ui/dead")
    expect(page.locator("table.jobs tbody tr").nth(3)).to_be_visible()
    page.screenshot(path=str(to / "dashboard-dead-letters.png"), full_page=True)
    context.close()
    for name in ("dashboard-overview.png", "dashboard-dead-letters.png"):
        assert (to / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
