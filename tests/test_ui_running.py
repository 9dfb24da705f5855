"""The dashboard and a running job: the job page's progress bar, checkpoint, snoozes,
every attempt and the errors table; the jobs table's progress column; and the cancel
buttons of a running job (ask it to stop; force), through the ASGI app.

A page is rendered from a job as the store holds it, so the job is put in front of the
page (``Service.get``/``list_jobs``) with every field set; what the buttons do goes
through the real ``Service.cancel``."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest

from sqlq.common.models import Job, State
from sqlq.common.running import AttemptError, Progress
from sqlq.http.app import create_app
from sqlq.runtime.service import Service
from tests import operations_helpers
from tests.helpers import NOW, ServiceFactory, final, submit, wait_for
from tests.operations_helpers import STARTED, kinds


@pytest.fixture
async def ui(services: ServiceFactory) -> AsyncIterator[tuple[Service, httpx.AsyncClient]]:
    operations_helpers.GATE = asyncio.Event()  # an Event binds to its loop: one per test
    STARTED.clear()
    rt = services(kinds=kinds())
    await rt.start()
    app = create_app(rt, start_runtime=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://localhost") as c:  # fmt: skip
        yield rt, c
    operations_helpers.GATE.set()


def _running(**changes: Any) -> Job:
    job = Job(
        id="a" * 32, kind="gate", args={}, state=State.RUNNING, attempts=2, max_attempts=5,
        attempts_total=3, ready_at=NOW, created_at=NOW - 60, updated_at=NOW, started_at=NOW - 5,
        progress=Progress(percent=42.0, message="page 42 of 100", at=NOW - 1),
        checkpoint={"page": 41, "pad": "x" * 2000}, snoozes=2,
        errors=(AttemptError(attempt=1, error="ValueError: <first>", at=NOW - 30),
                AttemptError(attempt=2, error="TimeoutError: second", at=NOW - 20)),
    )  # fmt: skip
    return msgspec.structs.replace(job, **changes) if changes else job


def _shown(monkeypatch: pytest.MonkeyPatch, rt: Service, job: Job) -> None:
    async def get(_: str) -> Job:
        return job

    async def list_jobs(_: Any) -> list[Job]:
        return [job]

    monkeypatch.setattr(rt, "get", get)
    monkeypatch.setattr(rt, "list_jobs", list_jobs)


def _text(html: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}"[^>]*>(.*?)</', html, re.S)
    assert found, f"no #{element_id} on the page"
    return re.sub(r"\s+", " ", found.group(1)).strip()


async def test_the_job_page_shows_what_a_running_job_carries(
    ui: tuple[Service, httpx.AsyncClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, c = ui
    job = _running(cancel_requested_at=NOW - 2)
    _shown(monkeypatch, rt, job)
    html = (await c.get(f"/ui/jobs/{job.id}")).text
    assert re.search(r'<progress id="job-progress" max="100" value="42.0"', html)
    assert _text(html, "job-progress-text") == "42% page 42 of 100"
    assert "reported" in _text(html, "job-progress-at")
    assert _text(html, "job-attempts") == "2 of 5"
    assert _text(html, "job-attempts-total").startswith("5")  # every attempt: 3 before, 2 now
    assert _text(html, "job-snoozes") == "2"
    assert _text(html, "job-checkpoint") == "saved, 2.0 KiB of JSON"
    assert "x" * 100 not in html  # its size, never its content
    errors = html.split('id="job-errors"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr><td class=\"num\">(\d+)</td><td>([^<]+)</td>", errors)
    assert [r[0] for r in rows] == ["1", "2"]
    assert "ValueError: &lt;first&gt;" in errors  # escaped
    assert "TimeoutError: second" in errors
    assert "A cancel was asked for" in _text(html, "cancel-requested")
    assert f"/ui/confirm/cancel-running?job={job.id}" in html
    assert f"/ui/confirm/force-cancel?job={job.id}" in html
    # The refresh (htmx's live block) carries the bar too: it moves without a reload.
    live = (await c.get(f"/ui/jobs/{job.id}", headers={"hx-request": "true"})).text
    assert 'id="job-progress"' in live


async def test_a_job_without_progress_or_history_says_so(
    ui: tuple[Service, httpx.AsyncClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, c = ui
    job = _running(progress=Progress(percent=None, message=None, at=NOW), checkpoint=None,
                   errors=(), attempts_total=0, attempts=1)  # fmt: skip
    _shown(monkeypatch, rt, job)
    html = (await c.get(f"/ui/jobs/{job.id}")).text
    assert re.search(r'<progress id="job-progress" max="100" aria-label', html)  # no value
    assert _text(html, "job-checkpoint") == "none"
    assert 'id="job-errors"' not in html
    assert 'id="cancel-requested"' not in html
    finished = _running(state=State.COMPLETED, progress=None)
    _shown(monkeypatch, rt, finished)
    html = (await c.get(f"/ui/jobs/{job.id}")).text
    assert 'id="job-progress"' not in html
    assert "/ui/confirm/cancel" not in html
    assert "force-cancel" not in html


async def test_the_jobs_table_has_a_progress_column_for_running_jobs(
    ui: tuple[Service, httpx.AsyncClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, c = ui
    job = _running()
    _shown(monkeypatch, rt, job)
    html = (await c.get("/ui/jobs")).text
    assert re.search(rf'<progress id="progress-{job.id}" max="100" value="42.0"', html)
    assert f'href="/ui/confirm/cancel-running?job={job.id}"' in html
    _shown(monkeypatch, rt, _running(state=State.SCHEDULED))
    assert "<progress" not in (await c.get("/ui/jobs")).text  # only while it runs


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no CSRF field on the page"
    return found.group(1)


async def test_cancel_a_running_job_from_the_dashboard(
    ui: tuple[Service, httpx.AsyncClient],
) -> None:
    rt, c = ui
    job = await submit(rt, kind="gate", args={"name": "g"})
    await wait_for(lambda: "g" in STARTED, 10, "the gate job to start")
    page = (await c.get(f"/ui/confirm/cancel-running?job={job.id}")).text
    assert f"Ask running job {job.id} to stop?" in page
    assert (await rt.get(job.id)).state is State.RUNNING  # type: ignore[union-attr]
    r = await c.post("/ui/do/cancel-running", data={"job": job.id, "csrf": _csrf(page)})
    assert r.status_code == 200, r.text
    assert f"Cancel of job {job.id} asked for: it is still running" in r.text
    assert (await final(rt, job.id)).state is State.CANCELLED


async def test_force_cancel_passes_force(
    ui: tuple[Service, httpx.AsyncClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, c = ui
    asked: list[bool] = []

    async def cancel(job_id: str, *, force: bool = False) -> Job:
        asked.append(force)
        return _running(id=job_id, cancel_requested_at=NOW)

    monkeypatch.setattr(rt, "cancel", cancel)
    page = (await c.get(f"/ui/confirm/force-cancel?job={'a' * 32}")).text
    assert "cut its attempt off" in page
    r = await c.post("/ui/do/force-cancel", data={"job": "a" * 32, "csrf": _csrf(page)})
    assert r.status_code == 200, r.text
    assert "cuts it off" in r.text
    r = await c.post("/ui/do/cancel-running", data={"job": "a" * 32, "csrf": _csrf(page)})
    assert asked == [True, False]
    assert "cuts it off" not in r.text
