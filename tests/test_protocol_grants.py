"""A claim's grant carries its job without the fields at their defaults (``GrantedJob``):
what a decoder fills in by itself is not sent. Every reader reads the same job as before:
``JobView`` (what ``sqlq.Worker``'s client decodes) comes back field for field equal to the
job's full view, a grant's JSON has no null, no false, no empty list and no ``default``
queue, and a field away from its default is still sent (a checkpoint, a queue, a cancel
asked for, an error's history). Over HTTP, a real claim answers so, and the answer is read
back by the protocol's own decoder into the full job."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest

from sqlq.common.engine.memory import MemoryStore
from sqlq.common.models import Job, State
from sqlq.common.protocol import ClaimAnswer, GrantedJob
from sqlq.common.running import AttemptError
from sqlq.common.wire import JobView, job_view
from sqlq.http.app import create_app
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.service import Service

NOW = 1_700_000_000.0


def _running(**fields: Any) -> Job:
    return Job(id="a" * 32, kind="mail.send", args={"to": "x"}, state=State.RUNNING, attempts=1,
               ready_at=NOW, created_at=NOW, updated_at=NOW, started_at=NOW,
               holder="worker:box-1", lease_until=NOW + 30, **fields)  # fmt: skip


def _nothing_default(value: Any) -> bool:
    """No null, false, empty list or ``default`` queue anywhere in ``value``'s top level."""
    return all(v not in (None, False, [], "default") for v in value.values())


def test_a_grant_sends_no_default_and_reads_back_as_the_whole_view() -> None:
    job = _running()
    body = msgspec.json.encode(job_view(job, tracebacks=False, view=GrantedJob))
    sent = msgspec.json.decode(body)
    assert _nothing_default(sent)
    assert set(sent) == {"id", "kind", "args", "ready_at", "created_at", "updated_at",
                         "state", "attempts", "attempts_total", "started_at", "holder",
                         "lease_until"}  # fmt: skip
    full = job_view(job, tracebacks=False)
    assert msgspec.json.decode(body, type=JobView) == full
    assert len(body) < len(msgspec.json.encode(full)) * 0.6  # (~440 bytes of ~700)


def test_a_field_away_from_its_default_is_sent() -> None:
    failed = AttemptError(attempt=1, error="boom", at=NOW, traceback="tb")
    job = _running(queue="mail", epoch=2, checkpoint={"page": 3}, priority=-1,
                   cancel_requested_at=NOW + 1, max_attempts=7, attempts_total=3,
                   errors=(failed,))  # fmt: skip
    sent = msgspec.json.decode(msgspec.json.encode(job_view(job, tracebacks=False,
                                                            view=GrantedJob)))  # fmt: skip
    assert (sent["queue"], sent["epoch"], sent["checkpoint"], sent["priority"]) == (
        "mail", 2, {"page": 3}, -1)  # fmt: skip
    assert (sent["cancel_requested"], sent["max_attempts"], sent["attempts_total"]) == (True, 7, 4)
    assert sent["errors"] == [{"attempt": 1, "error": "boom", "at": NOW}]  # (no traceback)
    read = msgspec.convert(sent, JobView)
    assert read == job_view(job, tracebacks=False)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    rt = Service(MemoryStore(), RuntimeConfig(workers=0, seed=1))
    await rt.start()
    app = create_app(rt, start_runtime=False, ui=None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://localhost") as http:  # fmt: skip
        yield http
    await rt.stop()


async def test_a_real_claim_answers_grants_without_defaults(client: httpx.AsyncClient) -> None:
    r = await client.post("/jobs/batch", json={"jobs": [
        {"kind": "mail.send", "args": {"to": "x"}},
        {"kind": "mail.send", "queue": "other", "priority": 5, "max_attempts": 9},
    ]})  # fmt: skip
    assert r.status_code == 201, r.text
    r = await client.post("/claims", json={"queues": ["default", "other"], "worker": "box-1",
                                           "max": 2})  # fmt: skip
    assert r.status_code == 200, r.text
    claims = r.json()["claims"]
    assert len(claims) == 2
    for granted in claims:
        assert _nothing_default(granted["job"]), granted["job"]
        assert granted["job"]["state"] == "running"
        assert granted["job"]["holder"] == "worker:box-1"
    by_queue = {g["job"].get("queue", "default"): g["job"] for g in claims}
    assert (by_queue["other"]["priority"], by_queue["other"]["max_attempts"]) == (5, 9)
    assert "priority" not in by_queue["default"]
    # what the worker's client reads: the whole job, as GET /jobs/{id} shows it
    answer = msgspec.json.decode(r.content, type=ClaimAnswer)
    for g in answer.claims:
        shown = msgspec.convert((await client.get(f"/jobs/{g.job.id}")).json(), JobView)
        assert msgspec.structs.asdict(g.job) == msgspec.structs.asdict(shown)


def test_only_what_every_job_has_is_required_of_a_grant() -> None:
    """Every field ``GrantedJob`` may leave out has a default in ``JobView`` (the one a
    decoder fills in), its fields are ``JobView``'s, and only the six a job always has are
    required."""
    fields = msgspec.structs.fields(GrantedJob)
    assert [f.name for f in fields] == [f.name for f in msgspec.structs.fields(JobView)]
    required = {f.name for f in fields if f.required}
    assert required == {"id", "kind", "args", "ready_at", "created_at", "updated_at"}
