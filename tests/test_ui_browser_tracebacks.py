"""A failed job's tracebacks in a real browser: each attempt's folded, the newest open,
and a fold the reader changed survives the page's live refresh (which swaps the region
that holds them once a second)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from sqlq.bench.client.server import ServerProcess
from tests import ui_browser_helpers
from tests.ui_browser_helpers import api, state_of, submit, until

browser = ui_browser_helpers.browser  # the fixture, by its name
page = ui_browser_helpers.page  # the fixture, by its name
server = ui_browser_helpers.server  # the fixture, by its name

pytestmark = pytest.mark.slow

SWAPPED = """() => new Promise(done => {
  document.addEventListener("htmx:afterSettle", () => done(true), {once: true});
  window.sqlqLive.tick();
})"""


def test_tracebacks_fold_and_stay_as_the_reader_left_them(
    server: ServerProcess, page: Page
) -> None:
    with api(server) as c:
        job = submit(c, kind="sleep", args={"work_ms": 0, "fail_prob": 1.0}, max_attempts=2)
        until(lambda: state_of(c, job) == "dead", "the job to die")
    page.goto(server.url + f"/ui/jobs/{job}")
    older, newest = page.locator("#traceback-1"), page.locator("#traceback-2")
    expect(newest).to_have_attribute("open", "")
    expect(older).not_to_have_attribute("open", "")
    expect(newest.locator("pre")).to_contain_text("Traceback (most recent call last):")
    page.wait_for_function("() => typeof htmx !== 'undefined' && window.sqlqLive !== undefined")
    older.locator("summary").click()
    newest.locator("summary").click()
    expect(older).to_have_attribute("open", "")
    expect(newest).not_to_have_attribute("open", "")
    assert page.evaluate(SWAPPED) is True  # the live region was replaced
    expect(older).to_have_attribute("open", "")
    expect(newest).not_to_have_attribute("open", "")
