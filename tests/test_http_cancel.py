"""``DELETE /jobs/{id}`` and ``POST /jobs/cancel`` in-process: a job cancelled before it
ran (200), a running one asked to stop (202), a finished one (409), ``?force``, the bulk
form's counts and every refusal as a JSON body naming the field; and the job as the API
shows it (``JobView``): every attempt, its errors, no request hash."""

from __future__ import annotations

import re
from typing import Any

import pytest

from sqlq.common.models import State
from sqlq.common.specs import CancelSpec
from sqlq.runtime.service import Service
from tests import operations_helpers
from tests.helpers import final, wait_for
from tests.operations_helpers import STARTED, Client

api = operations_helpers.api  # the fixture, by its name


async def _running(rt: Service, c: Any, name: str = "g") -> str:
    """A ``gate`` job, once its handler runs (it waits until the test's gate opens)."""
    job_id: str = (await c.post("/jobs", json={"kind": "gate", "args": {"name": name}})).json()[
        "id"
    ]
    await wait_for(lambda: name in STARTED, 10, "the gate job to start")
    return job_id


async def test_a_job_that_has_not_started_is_cancelled(api: Client) -> None:
    _rt, c = await api()
    job = (await c.post("/jobs", json={"kind": "record", "args": {"name": "x"},
                                       "delay_ms": 60_000})).json()  # fmt: skip
    r = await c.delete(f"/jobs/{job['id']}")
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["state"], body["cancel_requested"], body["cancel_requested_at"]) == (
        "cancelled", False, None,
    )  # fmt: skip


async def test_a_running_job_is_asked_to_stop_and_ends_cancelled(api: Client) -> None:
    rt, c = await api()
    job_id = await _running(rt, c)
    r = await c.delete(f"/jobs/{job_id}")
    assert r.status_code == 202, r.text
    body = r.json()
    assert (body["state"], body["cancel_requested"]) == ("running", True)
    assert body["cancel_requested_at"] is not None
    done = await final(rt, job_id)  # the async handler's task is cancelled
    assert (done.state, done.attempts) == (State.CANCELLED, 1)
    shown = (await c.get(f"/jobs/{job_id}")).json()
    assert (shown["state"], shown["cancel_requested"]) == ("cancelled", True)


async def test_a_finished_job_is_a_409_that_says_why(api: Client) -> None:
    rt, c = await api()
    job = (await c.post("/jobs", json={"kind": "record", "args": {"name": "x"}})).json()
    await final(rt, job["id"])
    r = await c.delete(f"/jobs/{job['id']}")
    assert r.status_code == 409
    assert r.json()["error"] == "conflict"
    # Why: it has finished (the service says "completed", or that only a live job can be).
    assert re.search(r"completed|live job", r.json()["message"]), r.text
    for missing in ("f" * 32, "ffff"):  # no such job; no such id at all
        r = await c.delete(f"/jobs/{missing}")
        assert (r.status_code, r.json()["error"]) == (404, "not_found")


@pytest.mark.parametrize(
    ("query", "force"),
    [("", False), ("?force=1", True), ("?force=true", True), ("?force=0", False),
     ("?force=false", False)],
)  # fmt: skip
async def test_force_is_passed_to_the_service(
    api: Client, monkeypatch: pytest.MonkeyPatch, query: str, force: bool
) -> None:
    rt, c = await api()
    job = (await c.post("/jobs", json={"kind": "record", "args": {"name": "x"},
                                       "delay_ms": 60_000})).json()  # fmt: skip
    asked: list[bool] = []
    cancel = rt.cancel

    async def spy(job_id: str, *, force: bool = False) -> Any:
        asked.append(force)
        return await cancel(job_id, force=force)

    monkeypatch.setattr(rt, "cancel", spy)
    r = await c.delete(f"/jobs/{job['id']}{query}")
    assert (r.status_code, asked) == (200, [force])


@pytest.mark.parametrize("query", ["force=yes", "force=", "force=True", "force=2",
                                   "force=1&force=0"])  # fmt: skip
async def test_a_bad_force_is_a_422_naming_it(api: Client, query: str) -> None:
    _rt, c = await api()
    job = (await c.post("/jobs", json={"kind": "record", "args": {"name": "x"},
                                       "delay_ms": 60_000})).json()  # fmt: skip
    r = await c.delete(f"/jobs/{job['id']}?{query}")
    assert r.status_code == 422, r.text
    assert (r.json()["error"], r.json()["field"]) == ("invalid", "force")
    assert (await c.get(f"/jobs/{job['id']}")).json()["state"] == "scheduled"  # untouched


async def test_force_on_a_running_job_cuts_it_off(api: Client) -> None:
    """The handler ignores the request (``gate`` waits on its event, catches nothing) and is
    cancelled anyway, within the grace."""
    rt, c = await api(cancel_grace_s=0.05)
    job_id = await _running(rt, c)
    r = await c.delete(f"/jobs/{job_id}?force=1")
    assert (r.status_code, r.json()["cancel_requested"]) == (202, True)
    done = await final(rt, job_id)
    assert done.state is State.CANCELLED


async def test_bulk_cancel_counts_what_it_cancelled_and_what_it_asked(api: Client) -> None:
    rt, c = await api()
    running = await _running(rt, c)
    waiting = [
        (await c.post("/jobs", json={"kind": "record", "args": {"name": str(i)},
                                     "delay_ms": 60_000, "queue": q})).json()["id"]
        for i, q in enumerate(("a", "a", "b"))
    ]  # fmt: skip
    r = await c.post("/jobs/cancel", json={"state": "scheduled", "queue": "a"})
    assert (r.status_code, r.json()) == (200, {"cancelled": 2, "requested": 0})
    r = await c.post("/jobs/cancel", json={"kind": "nope"})
    assert r.json() == {"cancelled": 0, "requested": 0}
    r = await c.post("/jobs/cancel", json={})  # every live job: the last waiting and the gate
    assert r.json() == {"cancelled": 1, "requested": 1}
    assert (await final(rt, running)).state is State.CANCELLED
    for job_id in waiting:
        assert (await c.get(f"/jobs/{job_id}")).json()["state"] == "cancelled"


async def test_bulk_cancel_passes_the_spec(api: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    rt, c = await api()
    seen: list[CancelSpec] = []

    async def spy(spec: CancelSpec) -> tuple[int, int]:
        seen.append(spec)
        return 3, 4

    monkeypatch.setattr(rt, "cancel_matching", spy)
    r = await c.post("/jobs/cancel", json={"state": "running", "kind": "k", "queue": "q"})
    assert (r.status_code, r.json()) == (200, {"cancelled": 3, "requested": 4})
    assert seen == [CancelSpec(state="running", kind="k", queue="q")]


@pytest.mark.parametrize(
    ("body", "headers", "status", "field"),
    [
        (b'{"state": "completed"}', {}, 422, "state"),
        (b'{"state": "dead"}', {}, 422, "state"),
        (b'{"kind": ""}', {}, 422, "kind"),
        (b'{"kind": "' + b"k" * 129 + b'"}', {}, 422, "kind"),
        (b'{"queue": "no spaces"}', {}, 422, "queue"),
        (b'{"queue": 7}', {}, 422, "queue"),
        (b'{"surprise": 1}', {}, 422, "body"),
        (b"[]", {}, 422, "body"),
        (b"", {}, 422, "body"),  # no body is not "everything": {} says that on purpose
        (b"{nope", {}, 400, "body"),
        (b'{"kind": "' + b"k" * (1 << 20) + b'"}', {}, 413, "body"),
        (b"state=running", {"content-type": "application/x-www-form-urlencoded"}, 415,
         "content-type"),
    ],
)  # fmt: skip
async def test_bulk_cancel_refusals_name_the_field(
    api: Client, body: bytes, headers: dict[str, str], status: int, field: str
) -> None:
    _rt, c = await api()
    kept = (await c.post("/jobs", json={"kind": "record", "args": {"name": "x"},
                                        "delay_ms": 60_000})).json()  # fmt: skip
    sent = {"content-type": "application/json", **headers}
    r = await c.post("/jobs/cancel", content=body, headers=sent)
    assert r.status_code == status, r.text
    assert r.json()["field"] == field
    assert (await c.get(f"/jobs/{kept['id']}")).json()["state"] == "scheduled"


async def test_the_job_shows_every_attempt_and_its_errors_but_no_request_hash(
    api: Client,
) -> None:
    """The issue's bar: a dead job that used 2 attempts shows attempts_total 2 and two
    entries in errors; after an operator retry and two more, 4 (and 4 errors)."""
    rt, c = await api()
    r = await c.post("/jobs", json={"kind": "boom", "max_attempts": 2},
                     headers={"Idempotency-Key": "k-1"})  # fmt: skip
    assert "request_hash" not in r.json()
    job_id = r.json()["id"]
    await final(rt, job_id)
    shown = (await c.get(f"/jobs/{job_id}")).json()
    assert (shown["state"], shown["attempts"], shown["attempts_total"]) == ("dead", 2, 2)
    assert [e["attempt"] for e in shown["errors"]] == [1, 2]
    assert all("boom" in e["error"] and e["at"] > 0 for e in shown["errors"])
    assert "request_hash" not in shown
    assert (shown["progress"], shown["checkpoint"], shown["snoozes"]) == (None, None, 0)
    await c.post(f"/jobs/{job_id}/retry")
    await final(rt, job_id)
    shown = (await c.get(f"/jobs/{job_id}")).json()
    assert (shown["attempts"], shown["attempts_total"], len(shown["errors"])) == (2, 4, 4)
    listed = (await c.get("/jobs?state=dead")).json()["jobs"]
    assert [(j["attempts_total"], "request_hash" in j) for j in listed] == [(4, False)]
