"""The dashboard's remote side through the ASGI app: the Workers page (every worker seen,
the most recent first: its name, token, role, last seen, jobs held, queues), its link in
the nav, and the queues tables marking remote queues and their warning.

One browser test (the page as Chromium draws it, refreshed without a reload, its
colours' contrast) is at the end, in the slow tier."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect

from sqlq.bench.client.server import ServerProcess
from tests import ui_browser_helpers
from tests.remote_http_helpers import SECRETS, Make, auth, security, served
from tests.ui_browser_helpers import CONTRAST, _server, api, until

__all__ = ["served"]  # the fixture, by its name
browser = ui_browser_helpers.browser  # the fixture, by its name
page = ui_browser_helpers.page  # the fixture, by its name

REMOTE = {"remote_queues": frozenset({"mail", "video"})}


async def _claim(c: httpx.AsyncClient, worker: str, queues: list[str], who: str = "w-all") -> None:
    r = await c.post("/claims", json={"queues": queues, "worker": worker}, headers=auth(who))
    assert r.status_code == 200, r.text


async def _submit(c: httpx.AsyncClient, queue: str, kind: str = "any.kind") -> None:
    job = {"kind": kind, "queue": queue, "delay_ms": 0 if kind == "any.kind" else 60_000}
    r = await c.post("/jobs", json=job, headers=auth("ops"))
    assert r.status_code == 201, r.text


def _row(html: str, worker: str) -> str:
    found = re.search(rf'<tr id="worker-{re.escape(worker)}">(.*?)</tr>', html, re.S)
    assert found, f"no row for worker {worker}"
    return found.group(1)


async def test_the_workers_page_shows_every_worker_seen_most_recent_first(served: Make) -> None:
    s = await served(fake=False, ui=True, **REMOTE)
    c = s.client
    for _ in range(2):
        await _submit(c, "mail")
    await _claim(c, "box-1", ["mail"], who="admin")
    await _claim(c, "box-2", ["video", "mail"], who="admin")
    r = await c.get("/ui/workers")
    assert r.status_code == 200
    html = r.text
    assert html.index('id="worker-box-2"') < html.index('id="worker-box-1"')  # newest first
    one = _row(html, "box-1")
    assert one.count("<td>admin</td>") == 2  # its token and role (no token set: the admin)
    assert re.search(r'id="worker-held-box-1">1<', one)
    assert 'href="/ui/jobs?queue=mail"' in one
    assert re.search(r'id="worker-seen-box-1"[^>]*>\d+ s ago<', one)
    two = _row(html, "box-2")
    assert re.search(r'id="worker-held-box-2">1<', two)
    assert ">video</a>, <a" in two or ">mail</a>, <a" in two
    assert '<a href="/ui/workers" aria-current="page">Workers</a>' in html
    live = (await c.get("/ui/workers", headers={"hx-request": "true"})).text
    assert live.lstrip().startswith('<div id="live"')
    assert 'id="worker-box-1"' in live


async def test_the_workers_page_names_the_token_and_role_it_came_with(served: Make) -> None:
    s = await served(security(), fake=False, ui=True, **REMOTE)
    c = s.client
    await _claim(c, "box-9", ["mail"], who="w-mail")
    assert (await c.get("/ui/workers")).status_code == 303  # a session first
    login = await c.get("/ui/login")
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', login.text)
    assert csrf
    r = await c.post("/ui/login", data={"token": SECRETS["viewer"], "csrf": csrf.group(1)},
                     headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
    assert r.status_code == 303
    row = _row((await c.get("/ui/workers")).text, "box-9")
    assert "<td>w-mail</td>" in row
    assert "<td>worker</td>" in row
    assert SECRETS["w-mail"] not in (await c.get("/ui/workers")).text


async def test_with_no_worker_seen_the_page_says_which_queues_are_remote(served: Make) -> None:
    s = await served(fake=False, ui=True, **REMOTE)
    html = (await s.client.get("/ui/workers")).text
    assert "No remote worker seen yet. Queues served remotely: mail, video." in html
    s = await served(fake=False, ui=True, workers=0)
    html = (await s.client.get("/ui/workers")).text
    assert "Queues served remotely: every queue (--workers 0)." in html
    s = await served(fake=False, ui=True)
    assert "none (see --remote-queue and --workers 0)" in (await s.client.get("/ui/workers")).text


async def test_the_queues_tables_mark_remote_queues_and_warn(served: Make) -> None:
    s = await served(fake=False, ui=True, **REMOTE)
    c = s.client
    await _submit(c, "mail")
    await _submit(c, "default", "sleep")  # an in-process queue: known kinds only
    for path, at in (("/ui/queues", "queue"), ("/ui/", "overview-queue")):
        html = (await c.get(path)).text
        assert f'id="{at}-remote-mail" href="/ui/workers">remote</a>' in html, path
        warning = re.search(rf'id="{at}-warning-mail" role="status">([^<]+)<', html)
        assert warning, path
        assert "no worker" in warning.group(1)
        assert f'id="{at}-remote-default"' not in html
        assert "in process" in html
        assert f'id="{at}-warning-video"' not in html  # remote, but nothing waits: no warning
    await _claim(c, "box-1", ["mail"], who="admin")
    await _submit(c, "mail")  # waiting again, but a worker was just seen for it
    assert 'id="queue-warning-mail"' not in (await c.get("/ui/queues")).text


# -- in a browser -----------------------------------------------------------------------------


@pytest.fixture
def remote_server(tmp_path: Path) -> Iterator[ServerProcess]:
    s = _server(tmp_path, "--remote-queue", "mail", store="walq")
    yield s
    s.stop()


@pytest.mark.slow
def test_the_workers_page_in_a_browser_refreshes_and_reads_well(
    remote_server: ServerProcess, page: Page
) -> None:
    with api(remote_server) as c:
        assert c.post("/jobs", json={"kind": "any.kind", "queue": "mail"}).status_code == 201
        page.goto(remote_server.url + "/ui/queues")
        expect(page.locator("#queue-remote-mail")).to_have_text("remote")
        expect(page.locator("#queue-warning-mail")).to_contain_text("no worker")
        assert page.evaluate(CONTRAST) == []
        page.locator("#queue-remote-mail").click()
        expect(page.locator("h1")).to_have_text("Workers")
        expect(page.locator("main")).to_contain_text("No remote worker seen yet")
        loads = page.evaluate("performance.getEntriesByType('navigation').length")
        r = c.post("/claims", json={"queues": ["mail"], "worker": "box-7"})
        assert r.status_code == 200
        assert len(r.json()["claims"]) == 1
        expect(page.locator("#worker-box-7")).to_be_visible()  # the live refresh brought it
        expect(page.locator("#worker-held-box-7")).to_have_text("1")
        assert page.evaluate("performance.getEntriesByType('navigation').length") == loads
        assert page.evaluate(CONTRAST) == []
        token = r.json()["claims"][0]["token"]
        assert c.post("/claims/complete", json={"token": token}).status_code == 200
        expect(page.locator("#worker-held-box-7")).to_have_text("0")
        until(lambda: c.get("/workers").json()["workers"][0]["held"] == 0, "the API to agree")
