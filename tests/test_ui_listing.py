"""The dashboard's job listings newest first (``order=asc``: oldest first), paged by the
API's cursor in either order; and a failed job's tracebacks on its page, escaped."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from sqlq.runtime.kinds import Registry, task
from sqlq.runtime.service import Service
from tests.app_helpers import app_clients
from tests.helpers import final, submit

Client = Callable[..., Any]
SHOWN = re.compile(r'href="/ui/jobs/([0-9a-f]+)"')
NEXT = re.compile(r'href="(/ui/(?:jobs|dead)\?[^"]+)" rel="next"')


@pytest.fixture
async def ui() -> AsyncIterator[Client]:
    async for make in app_clients(1):
        yield make


async def _pages(c: Any, url: str) -> list[list[str]]:
    """The ids each page shows, following "Next page" to the end."""
    pages = []
    while True:
        html = (await c.get(url)).text
        pages.append(SHOWN.findall(html))
        found = NEXT.findall(html)
        if not found:
            return pages
        url = found[0].replace("&amp;", "&")


async def test_jobs_come_newest_first_and_oldest_first_on_request(ui: Client) -> None:
    c = await ui()
    rt: Service = c.runtime
    ids = sorted([(await submit(rt, delay_ms=60_000, queue="bulk")).id for _ in range(60)])
    assert await _pages(c, "/ui/jobs?queue=bulk") == [ids[:9:-1], ids[9::-1]]
    assert await _pages(c, "/ui/jobs?queue=bulk&order=asc") == [ids[:50], ids[50:]]
    assert await _pages(c, "/ui/jobs?queue=bulk&order=desc") == [ids[:9:-1], ids[9::-1]]
    form = (await c.get("/ui/jobs?order=asc")).text
    assert re.search(r'<select name="order">\s*<option value="desc">newest first</option>\s*'
                     r'<option value="asc" selected>oldest first</option>', form)  # fmt: skip
    r = await c.get("/ui/jobs?order=sideways")
    assert r.status_code == 422
    assert "order:" in r.text


TB_KINDS = Registry()


@task(name="flaky", registry=TB_KINDS, max_attempts=2, backoff=0)
def flaky(args: Any) -> Any:
    raise KeyError("<to>")


async def test_a_failed_jobs_page_shows_each_attempts_traceback(ui: Client) -> None:
    c = await ui(kinds=TB_KINDS)
    rt: Service = c.runtime
    job = await submit(rt, "flaky")
    dead = await final(rt, job.id)
    assert [e.traceback is not None for e in dead.errors] == [True, True]
    html = (await c.get(f"/ui/jobs/{job.id}")).text
    shape = (r'<details class="traceback" id="traceback-(\d)"( open)?>'
             r"<summary>Traceback</summary><pre>(.*?)</pre></details>")  # fmt: skip
    blocks = re.findall(shape, html, re.S)
    assert [(n, opened) for n, opened, _ in blocks] == [("1", ""), ("2", " open")]
    for _, _, text in blocks:
        assert text.startswith("Traceback (most recent call last):")
        assert "in flaky" in text
        assert "KeyError: &#39;&lt;to&gt;&#39;" in text  # escaped, never markup
    assert "<to>" not in html


async def test_the_dead_letters_page_pages_newest_first_and_order_is_no_filter(
    ui: Client,
) -> None:
    c = await ui(kinds=TB_KINDS)
    rt: Service = c.runtime
    dead = sorted([(await final(rt, (await submit(rt, "flaky")).id)).id for _ in range(3)])
    page = (await c.get("/ui/dead")).text
    assert SHOWN.findall(page)[:3] == dead[::-1]
    assert ">Retry all dead jobs</a>" in page
    page = (await c.get("/ui/dead?order=asc")).text
    assert SHOWN.findall(page)[:3] == dead
    assert ">Retry all dead jobs</a>" in page  # the order is no filter: every dead job
    assert ">Retry all dead jobs that match</a>" in (await c.get("/ui/dead?kind=flaky")).text
