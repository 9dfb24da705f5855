"""The dashboard in Chromium: phone and laptop sizes, contrast, the keyboard; screenshots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from sqlq.bench.client.server import ServerProcess
from tests import ui_browser_helpers
from tests.helpers import ROOT
from tests.ui_browser_helpers import CONTRAST, _traffic, api, count, state_of, submit, until

browser = ui_browser_helpers.browser  # the fixture, by its name
page = ui_browser_helpers.page  # the fixture, by its name
server = ui_browser_helpers.server  # the fixture, by its name

pytestmark = pytest.mark.slow


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
