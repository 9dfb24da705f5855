"""A running job in a real browser (Debian's chromium, Playwright) against a real
``sqlq serve``: its progress bar moves while the page is watched, without a reload, and
the Cancel button on it asks the handler to stop, and the job ends ``cancelled``.

The handler is a module the server imports (``--import``): it reports progress
(``ctx.progress``, written at most once a second) and stops when it is asked to.
Every wait is Playwright's ``expect``/``wait_for_function`` or polling the API."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from sqlq.bench.client.server import ServerProcess
from tests import ui_browser_helpers
from tests.helpers import ROOT
from tests.ui_browser_helpers import _server, api, state_of, submit, until

browser = ui_browser_helpers.browser  # the fixture, by its name
page = ui_browser_helpers.page  # the fixture, by its name

pytestmark = pytest.mark.slow

CRAWLER = '''
import time

from sqlq import task


@task(timeout=None)
def crawl(args, ctx):
    """A page a tenth of a second, for a minute at most, until asked to stop."""
    for n in range(1, 601):
        ctx.raise_if_cancelled()
        ctx.progress(percent=n / 6, message=f"page {n} of 600")
        ctx.beat()
        time.sleep(0.1)
    return "done"
'''


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "crawler.py").write_text(CRAWLER)
    s = _server(tmp_path, "--import", "crawler", store="walq",
                env={"PYTHONPATH": f"{mods}:{ROOT}"})  # fmt: skip
    yield s
    s.stop()


BAR_PAST = """([selector, v]) => {
  const bar = document.querySelector(selector);
  return bar !== null && bar.hasAttribute('value') && bar.value > v;
}"""


def test_the_progress_bar_moves_and_cancel_stops_the_running_job(
    server: ServerProcess, page: Page
) -> None:
    with api(server) as c:
        job = submit(c, kind="crawl")
        until(lambda: state_of(c, job) == "running", "the crawl to start")
        page.goto(server.url + "/ui/jobs")
        page.wait_for_function(BAR_PAST, arg=[f"#progress-{job}", 0])  # the table's column
        page.goto(server.url + f"/ui/jobs/{job}")
        loads = page.evaluate("performance.getEntriesByType('navigation').length")
        page.wait_for_function(BAR_PAST, arg=["#job-progress", 0])
        first = page.locator("#job-progress").evaluate("bar => bar.value")
        page.wait_for_function(BAR_PAST, arg=["#job-progress", first])  # it moved
        expect(page.locator("#job-progress-text")).to_contain_text(re.compile(r"page \d+ of 600"))
        assert page.evaluate("performance.getEntriesByType('navigation').length") == loads
        page.locator("#cancel-job").click()
        expect(page.locator("#question")).to_contain_text(f"Ask running job {job} to stop?")
        assert state_of(c, job) == "running"  # the confirmation changed nothing
        page.get_by_role("button", name=re.compile("Yes")).click()
        expect(page.locator("#message")).to_contain_text(f"Cancel of job {job} asked for")
        until(lambda: state_of(c, job) == "cancelled", "the crawl to end cancelled")
        shown = c.get(f"/jobs/{job}").json()
        assert (shown["attempts"], shown["cancel_requested"]) == (1, True)
        assert 0 < shown["progress"]["percent"] < 100
        page.goto(server.url + f"/ui/jobs/{job}")
        expect(page.locator(".badge").first).to_have_text("cancelled")
        expect(page.locator("#cancel-requested")).to_contain_text("A cancel was asked for")
