"""The dashboard's Schedules page through the ASGI app: what it shows (next run, last run
and its job, paused, the expression in words), the nav, the session, escaping, paging."""

from __future__ import annotations

import html
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from sqlq.common.models import Job
from sqlq.common.schedule import AdvanceSchedule, ScheduleSpec, tick_key
from sqlq.http.guard import Security
from sqlq.runtime.kinds import Registry, task
from sqlq.runtime.service import Service
from sqlq.ui import schedules as page
from sqlq.ui.render import when
from tests.app_helpers import app_clients

TICK = 1_800_000_000

Make = Callable[..., Any]


@pytest.fixture
async def ui() -> AsyncIterator[Make]:
    async for make in app_clients():
        yield make


async def _put(rt: Service, name: str, **spec: Any) -> None:
    await rt.schedules.put(name, ScheduleSpec(**{"kind": "sleep", **spec}))


async def _tick(rt: Service, name: str, tick: int) -> Job:
    """The job of a tick, committed with its cursor as the evaluator does."""
    current = await rt.store.get_schedule(name)
    assert current is not None
    job = Job.new(kind="sleep", args={}, now=rt.clock.time(), ready_at=rt.clock.time() + 3600,
                  idempotency_key=tick_key(name, tick))  # fmt: skip
    await rt.store.commit([AdvanceSchedule(name=name, expect_version=current.version,
                                           expect_cursor=current.cursor, cursor=tick,
                                           job=job.id), job])  # fmt: skip
    return job


async def test_the_page_shows_each_schedule_and_links_its_job(ui: Make) -> None:
    c = await ui()
    rt: Service = c.runtime
    await _put(rt, "hourly", every_s=3600)
    await _put(rt, "nightly", cron="30 2 * * *", tz="Europe/Berlin", paused=True)
    job = await _tick(rt, "hourly", TICK)
    r = await c.get("/ui/schedules")
    assert r.status_code == 200, r.text[:300]
    assert r.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-frame-options"] == "DENY"
    text = r.text
    assert '<a href="/ui/schedules" aria-current="page">Schedules</a>' in text  # in the nav
    hourly = text[text.index('id="schedule-hourly"') : text.index('id="schedule-nightly"')]
    nightly = text[text.index('id="schedule-nightly"') :]
    assert "every hour" in hourly
    assert "every_s: 3600" in hourly
    assert f'href="/ui/jobs/{job.id}"' in hourly
    assert "state-scheduled" in hourly
    assert when(TICK) in hourly  # last run
    view = await rt.schedules.get("hourly")
    assert view is not None
    assert view.next_at is not None
    assert when(view.next_at) in hourly
    assert 'href="/ui/jobs?schedule=hourly"' in hourly
    assert "30 2 * * *" in nightly
    assert "Europe/Berlin" in nightly
    assert "paused" in nightly
    berlin = await rt.schedules.get("nightly")
    assert berlin is not None
    assert html.escape(page.in_words(berlin.spec)[1]) in nightly
    assert "none yet" in nightly
    live = await c.get("/ui/schedules", headers={"hx-request": "true"})
    assert live.text.lstrip().startswith('<div id="live"')
    assert "hourly" in live.text
    for other in ("/ui/", "/ui/jobs", "/ui/queues"):
        assert 'href="/ui/schedules"' in (await c.get(other)).text


async def test_a_schedules_job_shows_it_and_the_jobs_page_filters_on_it(ui: Make) -> None:
    c = await ui()
    rt: Service = c.runtime
    await _put(rt, "hourly", every_s=3600)
    await _put(rt, "hourly2", every_s=3600)
    job = await _tick(rt, "hourly", TICK)
    other = await _tick(rt, "hourly2", TICK)
    r = await c.get(f"/ui/jobs/{job.id}")
    assert 'id="job-schedule" href="/ui/jobs?schedule=hourly"' in r.text
    assert f"tick {when(TICK)}" in r.text
    listed = (await c.get("/ui/jobs?schedule=hourly")).text
    assert f'id="job-{job.id}"' in listed
    assert f'id="job-{other.id}"' not in listed
    assert 'name="schedule" value="hourly"' in listed  # the filter form keeps it
    bad = await c.get("/ui/jobs?schedule=a:b")
    assert bad.status_code == 422
    assert "schedule" in bad.text


async def test_what_a_schedule_carries_is_escaped(ui: Make) -> None:
    evil = "<script>alert(1)</script>"
    kinds = Registry()

    @task(name=evil, registry=kinds)
    def hostile(args: Any) -> Any:
        return None

    c = await ui(kinds=kinds)
    await _put(c.runtime, "evil", kind=evil, every_s=60)
    text = (await c.get("/ui/schedules")).text
    assert evil not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text


async def test_the_page_needs_a_session_when_there_is_a_token(ui: Make) -> None:
    c = await ui(security=Security(token="t0ken-for-the-tests"))
    r = await c.get("/ui/schedules")
    assert r.status_code == 303
    assert "/ui/login?next=/ui/schedules" in r.headers["location"]


async def test_pages_of_fifty_in_name_order(ui: Make) -> None:
    c = await ui()
    rt: Service = c.runtime
    names = [f"s{i:03d}" for i in range(page.PAGE_SIZE + 3)]
    for name in names:
        await _put(rt, name, every_s=60)
    first = (await c.get("/ui/schedules")).text
    assert f'id="schedule-{names[page.PAGE_SIZE - 1]}"' in first
    assert f'id="schedule-{names[page.PAGE_SIZE]}"' not in first
    assert f'href="/ui/schedules?after={names[page.PAGE_SIZE - 1]}" rel="next"' in first
    rest = (await c.get(f"/ui/schedules?after={names[page.PAGE_SIZE - 1]}")).text
    assert [n for n in names if f'id="schedule-{n}"' in rest] == names[page.PAGE_SIZE :]
    assert 'rel="next"' not in rest
    bad = await c.get("/ui/schedules?after=a:b")
    assert bad.status_code == 422


def test_the_words_are_ticks_describe() -> None:
    assert page.in_words(ScheduleSpec(kind="k", every_s=3600)) == ("every_s: 3600", "every hour")
    spec = ScheduleSpec(kind="k", cron="0 9 * * 1-5", tz="Europe/Berlin")
    assert page.in_words(spec) == ("0 9 * * 1-5", "At 09:00, Monday through Friday")
