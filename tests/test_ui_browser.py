"""The dashboard in a real browser: Debian's chromium, driven by Playwright, against a
real ``sqlq serve``.

Jobs go in through the JSON API (httpx); what is checked is what the page shows
and what its buttons do. Every wait is Playwright's ``expect`` (it polls the
page until a deadline) or ``wait_for`` on the API; nothing sleeps and hopes.

``SQLQ_SCREENSHOTS=docs pytest tests/test_ui_browser.py -k screenshots`` writes
the README's screenshots (``docs/``); otherwise they go to a temporary folder.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from sqlq.bench.client.server import ServerProcess
from tests import ui_browser_helpers
from tests.ui_browser_helpers import TOKEN, _server, api, state_of, submit, until

browser = ui_browser_helpers.browser  # the fixture, by its name
page = ui_browser_helpers.page  # the fixture, by its name
server = ui_browser_helpers.server  # the fixture, by its name

pytestmark = pytest.mark.slow


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
    # Every attempt it made, and each one's error, outlive the retry.
    expect(page.locator("#job-attempts-total")).to_have_text("2 (through operator retries)")
    expect(page.locator("#job-errors tbody tr")).to_have_count(2)
    expect(page.locator("#job-errors")).to_contain_text("injected failure")


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
