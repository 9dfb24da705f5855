"""The pull protocol's routes: bodies decoded by the protocol's structs (a bad value is a
422 naming the field), each route's body limit, the single outcomes' answers (200,
409 fenced, 422 invalid, 403 forbidden), and tokens only ever in bodies.

These hold the routes to what they hand the runtime and what they make of its
answers, on a stand-in ``Remote``; then, on the real one (``sqlq.runtime.remote``), that
a claim, its heartbeats and each outcome go through HTTP end to end, a stale report is
a 409, a worker is held to its queues, and ``GET /queues`` and ``/workers`` show the
remote side."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import msgspec
import pytest
from click.testing import CliRunner

from sqlq.cli import main
from sqlq.common.protocol import (
    MAX_ITEMS,
    CheckpointIn,
    ClaimRequest,
    CompleteIn,
    FailIn,
    HeartbeatRequest,
    OutcomesRequest,
    ReleaseIn,
    Reported,
    SnoozeIn,
    WorkerList,
    WorkerView,
)
from sqlq.common.running import MAX_CHECKPOINT_BYTES, MAX_PROGRESS_MESSAGE
from sqlq.http.claims import (
    LOOK_AFTER_S,
    MAX_CHECKPOINT_BODY,
    MAX_CLAIM_BODY,
    MAX_HEARTBEAT_BODY,
    MAX_OUTCOME_BODY,
    MAX_OUTCOMES_BODY,
)
from sqlq.http.openapi import document
from sqlq.settings import ServeSettings
from tests.helpers import spawn_server, start_ready, wait_for
from tests.remote_http_helpers import Make, auth, security, served

__all__ = ["served"]  # the fixture, by its name

TOKEN = "0" * 32 + ".1.30000." + "A" * 22  # a token's shape (the stand-in reads none)


async def test_a_claim_hands_the_runtime_the_decoded_request(served: Make) -> None:
    s = await served()
    body = {"queues": ["mail", "video"], "worker": "box-1.pid-7", "kinds": ["send"], "max": 5,
            "wait_s": 0, "lease_s": 60}  # fmt: skip
    r = await s.client.post("/claims", json=body)
    assert r.status_code == 200, r.text
    assert r.json() == {"claims": []}
    [(what, req, _)] = s.remote.calls
    assert what == "claim"
    assert req == ClaimRequest(queues=["mail", "video"], worker="box-1.pid-7", kinds=["send"],
                               max=5, wait_s=0.0, lease_s=60.0)  # fmt: skip


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"worker": "w"}, "queues"),
        ({"queues": [], "worker": "w"}, "queues"),
        ({"queues": ["bad queue"], "worker": "w"}, "queues[0]"),
        ({"queues": ["q"] * 101, "worker": "w"}, "queues"),
        ({"queues": ["q"]}, "worker"),
        ({"queues": ["q"], "worker": "has space"}, "worker"),
        ({"queues": ["q"], "worker": "w", "max": 0}, "max"),
        ({"queues": ["q"], "worker": "w", "max": 101}, "max"),
        ({"queues": ["q"], "worker": "w", "wait_s": 30.5}, "wait_s"),
        ({"queues": ["q"], "worker": "w", "wait_s": -1}, "wait_s"),
        ({"queues": ["q"], "worker": "w", "lease_s": 4}, "lease_s"),
        ({"queues": ["q"], "worker": "w", "lease_s": 3601}, "lease_s"),
        ({"queues": ["q"], "worker": "w", "kinds": []}, "kinds"),
        ({"queues": ["q"], "worker": "w", "kinds": ["k" * 129]}, "kinds[0]"),
        ({"queues": ["q"], "worker": "w", "token": TOKEN}, "body"),  # no such field: its object
    ],
)
async def test_a_bad_claim_is_422_naming_the_field(
    served: Make, body: dict[str, Any], field: str
) -> None:
    s = await served()
    r = await s.client.post("/claims", json=body)
    assert r.status_code == 422, r.text
    assert (r.json()["error"], r.json()["field"]) == ("invalid", field)
    assert not s.remote.calls  # refused before the runtime


async def test_a_heartbeat_carries_every_item_with_its_progress(served: Make) -> None:
    s = await served()
    items = [
        {"token": TOKEN},
        {"token": TOKEN + "x", "progress": {"percent": 50, "message": "half"}},
    ]
    r = await s.client.post("/claims/heartbeat", json={"items": items})
    assert r.status_code == 200, r.text
    assert [b["token"] for b in r.json()["items"]] == [TOKEN, TOKEN + "x"]
    [(_, req, _)] = s.remote.calls
    assert isinstance(req, HeartbeatRequest)
    progress = req.items[1].progress
    assert progress is not None
    assert (progress.percent, progress.message) == (50, "half")
    for bad, field in [
        ({"items": [{"token": ""}]}, "items[0].token"),
        ({"items": [{"token": "t" * 257}]}, "items[0].token"),
        ({"items": [{"token": TOKEN, "progress": {"percent": 101}}]}, "items[0].progress.percent"),
        ({"items": [{"token": TOKEN, "progress": {"at": 1}}]}, "items[0].progress"),  # unknown
        ({"items": [{"token": TOKEN}] * (MAX_ITEMS + 1)}, "items"),
        ({}, "items"),
    ]:
        r = await s.client.post("/claims/heartbeat", json=bad)
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["field"] == field, r.json()


SINGLE: list[tuple[str, dict[str, Any], Any]] = [
    ("complete", {"result": {"rows": [1, 2]}}, CompleteIn(result={"rows": [1, 2]})),
    ("complete", {}, CompleteIn(result=None)),
    ("fail", {"error": "boom", "retry": False}, FailIn(error="boom", retry=False)),
    ("fail", {"retry_in_s": 5}, FailIn(retry_in_s=5.0)),
    ("snooze", {"delay_s": 30}, SnoozeIn(delay_s=30.0)),
    ("checkpoint", {"data": {"page": 3}}, CheckpointIn(data={"page": 3})),
    ("release", {}, ReleaseIn()),
]


@pytest.mark.parametrize(("name", "body", "said"), SINGLE)
async def test_a_single_outcome_hands_the_runtime_what_it_says_without_the_token(
    served: Make, name: str, body: dict[str, Any], said: Any
) -> None:
    s = await served()
    s.remote.reported = Reported(token="", state="running" if name == "checkpoint" else "done")
    r = await s.client.post(f"/claims/{name}", json={"token": TOKEN, **body})
    assert r.status_code == 200, r.text
    assert r.json() == {"token": TOKEN, "state": s.remote.reported.state}
    [(_, (token, what), _)] = s.remote.calls
    assert token == TOKEN
    assert type(what) is type(said)  # the *In struct, not the body with its token
    assert what == said


@pytest.mark.parametrize(
    ("name", "body", "field"),
    [
        ("complete", {"result": 1}, "token"),
        ("complete", {"token": TOKEN, "results": 1}, "body"),  # an unknown field: its object
        ("fail", {"token": TOKEN, "error": "e" * 4097}, "error"),
        ("fail", {"token": TOKEN, "retry_in_s": -1}, "retry_in_s"),
        ("snooze", {"token": TOKEN}, "delay_s"),
        ("snooze", {"token": TOKEN, "delay_s": 366 * 86400 + 1}, "delay_s"),
        ("checkpoint", {"token": TOKEN}, "data"),
        ("release", {"token": TOKEN, "data": 1}, "body"),
        ("release", {"token": 7}, "token"),
    ],
)
async def test_a_bad_single_outcome_is_422_naming_the_field(
    served: Make, name: str, body: dict[str, Any], field: str
) -> None:
    s = await served()
    r = await s.client.post(f"/claims/{name}", json=body)
    assert r.status_code == 422, r.text
    assert (r.json()["error"], r.json()["field"]) == ("invalid", field)
    assert not s.remote.calls


@pytest.mark.parametrize(
    ("reported", "status", "body"),
    [
        (Reported(token="", error="fenced", detail="the lease ran out"), 409,
         {"error": "fenced", "message": "the lease ran out", "field": "token"}),
        (Reported(token="", error="invalid", detail="token: not a claim token"), 422,
         {"error": "invalid", "message": "not a claim token", "field": "token"}),
        (Reported(token="", error="invalid", detail="data: the checkpoint is 70000 bytes"), 422,
         {"error": "invalid", "message": "the checkpoint is 70000 bytes", "field": "data"}),
        (Reported(token="", error="invalid", detail="no field named here"), 422,
         {"error": "invalid", "message": "no field named here", "field": "body"}),
        (Reported(token="", error="forbidden", detail="w-mail may not report on queue 'x'"),
         403, {"error": "forbidden", "message": "w-mail may not report on queue 'x'"}),
    ],
)  # fmt: skip
async def test_a_refused_single_outcome_is_an_error_body(
    served: Make, reported: Reported, status: int, body: dict[str, Any]
) -> None:
    s = await served()
    s.remote.reported = reported
    for name in ("complete", "release"):
        r = await s.client.post(f"/claims/{name}", json={"token": TOKEN})
        assert r.status_code == status, r.text
        assert r.json() == body


async def test_the_batch_answers_one_reported_per_item_in_order(served: Make) -> None:
    s = await served()
    s.remote.reported = Reported(token="", error="fenced", detail="moved on")
    outcomes = [{"token": f"t{i}", "complete": {"result": i}} for i in range(3)]
    outcomes.append({"token": "t3", "complete": {}, "fail": {}})  # two: the runtime's to refuse
    r = await s.client.post("/claims/outcomes", json={"outcomes": outcomes})
    assert r.status_code == 200, r.text  # whatever each item's fate
    assert [o["token"] for o in r.json()["outcomes"]] == ["t0", "t1", "t2", "t3"]
    assert {o["error"] for o in r.json()["outcomes"]} == {"fenced"}
    [(_, req, _)] = s.remote.calls
    assert isinstance(req, OutcomesRequest)
    assert req.outcomes[1].what() == CompleteIn(result=1)
    for bad, field in [
        ({"outcomes": []}, "outcomes"),
        ({"outcomes": [{"complete": {}}]}, "outcomes[0].token"),
        ({"outcomes": [{"token": "t", "finish": {}}]}, "outcomes[0]"),
        ({"outcomes": [{"token": "t", "snooze": {"delay_s": -1}}]}, "outcomes[0].snooze.delay_s"),
        ({"outcomes": [{"token": "t", "release": {}}] * (MAX_ITEMS + 1)}, "outcomes"),
    ]:
        r = await s.client.post("/claims/outcomes", json=bad)
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["field"] == field


async def test_get_workers_lists_what_the_runtime_saw(served: Make) -> None:
    s = await served()
    view = WorkerView(name="box-1", principal="w-mail", role="worker", last_seen=1.5e9, held=2,
                      queues=["mail"])  # fmt: skip
    s.remote.seen = WorkerList(workers=[view])
    r = await s.client.get("/workers")
    assert r.status_code == 200
    assert msgspec.convert(r.json(), WorkerList) == s.remote.seen


# -- body limits ------------------------------------------------------------------------------


async def test_the_largest_heartbeat_and_batch_fit_their_limits(served: Make) -> None:
    s = await served()
    message = "é" * MAX_PROGRESS_MESSAGE  # escaped on the wire: six bytes a character
    progress = {"percent": 1, "message": message}
    tokens = [f"{i:04}".ljust(256, "t") for i in range(MAX_ITEMS)]  # (each once a heartbeat)
    items = [{"token": token, "progress": progress} for token in tokens]
    raw = msgspec.json.encode({"items": items}).replace("é".encode(), b"\\u00e9")
    assert len(raw) <= MAX_HEARTBEAT_BODY
    r = await s.client.post("/claims/heartbeat", content=raw,
                            headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 200, r.text[:300]
    assert len(r.json()["items"]) == MAX_ITEMS
    batch = [{"token": "t" * 256, "fail": {"error": "e" * 4096}}] * MAX_ITEMS
    raw = msgspec.json.encode({"outcomes": batch})
    assert len(raw) <= MAX_OUTCOMES_BODY
    r = await s.client.post("/claims/outcomes", content=raw,
                            headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 200, r.text[:300]


async def test_a_checkpoint_of_64_kib_fits_and_a_larger_body_is_413(served: Make) -> None:
    s = await served()
    data = "x" * (MAX_CHECKPOINT_BYTES - 2)  # its JSON: exactly the checkpoint's bound
    r = await s.client.post("/claims/checkpoint", json={"token": "t" * 256, "data": data})
    assert r.status_code == 200, r.text[:300]
    r = await s.client.post(
        "/claims/checkpoint", json={"token": TOKEN, "data": "x" * MAX_CHECKPOINT_BODY}
    )
    assert r.status_code == 413
    assert (r.json()["error"], r.json()["field"]) == ("too_large", "body")


@pytest.mark.parametrize(
    ("path", "limit"),
    [("/claims", MAX_CLAIM_BODY), ("/claims/heartbeat", MAX_HEARTBEAT_BODY),
     ("/claims/complete", MAX_OUTCOME_BODY), ("/claims/outcomes", MAX_OUTCOMES_BODY)],
)  # fmt: skip
async def test_every_claims_route_refuses_a_body_past_its_limit(
    served: Make, path: str, limit: int
) -> None:
    s = await served()
    r = await s.client.post(path, content=b" " * (limit + 1),
                            headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 413, r.text
    assert not s.remote.calls


# -- tokens only in bodies ------------------------------------------------------------------


def test_no_claims_route_takes_a_parameter_so_no_token_is_ever_in_a_url() -> None:
    paths = document("x")["paths"]
    claims = {p: ops for p, ops in paths.items() if p.startswith("/claims") or p == "/workers"}
    assert set(claims) == {"/claims", "/claims/heartbeat", "/claims/complete", "/claims/fail",
                           "/claims/snooze", "/claims/checkpoint", "/claims/release",
                           "/claims/outcomes", "/claims/parents", "/workers"}  # fmt: skip
    for path, ops in claims.items():
        for op in ops.values():
            assert "parameters" not in op, path
            assert "{" not in path


async def test_a_worker_token_reaches_the_routes_and_nothing_else(served: Make) -> None:
    s = await served(security())
    r = await s.client.post("/claims/release", json={"token": TOKEN}, headers=auth("w-mail"))
    assert r.status_code == 200, r.text
    others = [("POST", "/jobs/x/retry"), ("DELETE", "/jobs/" + "0" * 32),
              ("POST", "/queues/mail/pause"), ("GET", "/jobs"), ("GET", "/workers")]  # fmt: skip
    for method, path in others:
        r = await s.client.request(method, path, headers=auth("w-mail"))
        assert r.status_code == 403, (method, path)


# -- against the real Remote ------------------------------------------------------------------

REMOTE = {"remote_queues": frozenset({"mail", "video"})}


async def _job(c: httpx.AsyncClient, queue: str = "mail", **spec: Any) -> str:
    r = await c.post("/jobs", json={"kind": "anything.at.all", "queue": queue, **spec},
                     headers=auth("ops"))  # fmt: skip
    assert r.status_code == 201, r.text  # a remote queue takes any kind name
    job_id: str = r.json()["id"]
    return job_id


async def _claim(c: httpx.AsyncClient, who: str = "w-mail", **req: Any) -> list[dict[str, Any]]:
    body = {"queues": ["mail"], "worker": "box-1", **req}
    r = await c.post("/claims", json=body, headers=auth(who))
    assert r.status_code == 200, r.text
    claims: list[dict[str, Any]] = r.json()["claims"]
    return claims


async def test_a_claimed_members_parents_over_http_and_a_stale_token_is_409(
    served: Make,
) -> None:
    s = await served(security(), fake=False, **REMOTE)
    c = s.client
    batch = {"workflow": True, "jobs": [
        {"kind": "k", "queue": "mail", "ref": "a"},
        {"kind": "k", "queue": "mail", "ref": "b", "depends_on": ["a"]},
    ]}  # fmt: skip
    r = await c.post("/jobs/batch", json=batch, headers=auth("ops"))
    assert r.status_code == 201, r.text
    a_id, _ = r.json()["ids"]
    [a] = await _claim(c)
    r = await c.post("/claims/parents", json={"token": a["token"]}, headers=auth("w-mail"))
    assert r.json() == {"parents": [], "next": None, "total": 0}  # a root has none
    r = await c.post("/claims/complete", json={"token": a["token"], "result": [1]},
                     headers=auth("w-mail"))  # fmt: skip
    assert r.status_code == 200, r.text
    [b] = await _claim(c)
    r = await c.post("/claims/parents", json={"token": b["token"], "start": 0},
                     headers=auth("w-mail"))  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json() == {"parents": [{"job_id": a_id, "ref": "a", "state": "completed",
                                     "result": [1]}], "next": None, "total": 1}  # fmt: skip
    r = await c.post("/claims/parents", json={"token": a["token"]}, headers=auth("w-mail"))
    assert r.status_code == 409, r.text  # a's attempt is over: its token reads nothing
    assert (r.json()["error"], r.json()["field"]) == ("fenced", "token")
    r = await c.post("/claims/parents", json={"token": b["token"], "start": -1},
                     headers=auth("w-mail"))  # fmt: skip
    assert (r.status_code, r.json()["field"]) == (422, "start")


async def test_a_complete_over_http_spawns_in_its_commit_and_a_bad_spawn_is_named(
    served: Make,
) -> None:
    s = await served(security(), fake=False, **REMOTE)
    c = s.client
    r = await c.post("/jobs/batch", headers=auth("ops"), json={"workflow": True, "jobs": [
        {"kind": "k", "queue": "mail", "ref": "a"}, {"kind": "k", "queue": "mail", "ref": "b"},
    ]})  # fmt: skip
    assert r.status_code == 201, r.text
    a_id, _ = r.json()["ids"]
    workflow = (await c.get(f"/jobs/{a_id}", headers=auth("ops"))).json()["flow"]["workflow_id"]
    [a] = await _claim(c)
    bad: dict[str, Any]
    for bad in ({"spawn": {"kind": "k"}}, {"spawn": []}, {"spawn": [{"kind": "k"}] * 10_001}):
        r = await c.post("/claims/complete", json={"token": a["token"], **bad},
                         headers=auth("w-mail"))  # fmt: skip
        assert (r.status_code, r.json()["field"]) == (422, "spawn"), r.text
    spawn = [{"kind": "k", "queue": "mail", "ref": "x"},
             {"kind": "k", "queue": "mail", "ref": "y", "depends_on": ["x"]}]  # fmt: skip
    deep: Any = 1
    for _ in range(70):
        deep = [deep]
    r = await c.post("/claims/complete", headers=auth("w-mail"),
                     json={"token": a["token"], "result": deep, "spawn": spawn})  # fmt: skip
    assert r.json() == {"token": a["token"], "state": "scheduled"}, r.text  # failed: no spawn
    view = (await c.get(f"/workflows/{workflow}", headers=auth("ops"))).json()
    assert [m["ref"] for m in view["jobs"]] == ["a", "b"]
    [b] = await _claim(c)
    r = await c.post("/claims/complete", json={"token": b["token"], "result": 1, "spawn": spawn},
                     headers=auth("w-mail"))  # fmt: skip
    assert r.json() == {"token": b["token"], "state": "completed"}, r.text
    view = (await c.get(f"/workflows/{workflow}", headers=auth("ops"))).json()
    states = {m["ref"]: m["state"] for m in view["jobs"]}
    assert states == {"a": "scheduled", "b": "completed", "x": "scheduled", "y": "waiting"}


async def test_claim_heartbeat_complete_and_a_stale_report_is_409(served: Make) -> None:
    s = await served(security(), fake=False, **REMOTE)
    c = s.client
    job_id = await _job(c, args={"n": 1})
    [granted] = await _claim(c, lease_s=30)
    assert granted["job"]["id"] == job_id
    assert granted["job"]["holder"] == "worker:box-1"
    # every field a job shows, nulls and defaults too: a JSON client reads them by name
    # (the crash tests' worker reads ``epoch``, 0 here), so none is left out to save bytes
    shown = (await c.get(f"/jobs/{job_id}", headers=auth("ops"))).json()
    assert set(granted["job"]) == set(shown)
    assert (granted["job"]["epoch"], granted["job"]["last_error"]) == (0, None)
    token = granted["token"]
    r = await c.post("/claims/heartbeat", headers=auth("w-mail"),
                     json={"items": [{"token": token, "progress": {"percent": 40}}]})  # fmt: skip
    [beat] = r.json()["items"]
    assert (beat["token"], beat["cancel_requested"]) == (token, False)
    assert beat["lease_until"] >= granted["lease_until"]
    r = await c.post("/claims/complete", json={"token": token, "result": {"ok": True}},
                     headers=auth("w-mail"))  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json() == {"token": token, "state": "completed"}
    job = (await c.get(f"/jobs/{job_id}", headers=auth("ops"))).json()
    assert (job["state"], job["result"], job["holder"]) == ("completed", {"ok": True}, None)
    r = await c.post("/claims/complete", json={"token": token, "result": 2}, headers=auth("w-mail"))
    assert r.status_code == 409, r.text  # a definite refusal, never a silent success
    assert (r.json()["error"], r.json()["field"]) == ("fenced", "token")
    r = await c.post("/claims/heartbeat", json={"items": [{"token": token}]},
                     headers=auth("w-mail"))  # fmt: skip
    assert r.status_code == 200
    assert r.json()["items"] == [{"token": token, "error": "fenced"}]
    assert (await c.get(f"/jobs/{job_id}", headers=auth("ops"))).json()["result"] == {"ok": True}


@pytest.mark.parametrize(
    ("name", "body", "state", "attempts"),
    [
        ("fail", {"error": "boom", "retry": False}, "dead", 1),
        ("fail", {"error": "boom", "retry_in_s": 60}, "scheduled", 1),
        ("snooze", {"delay_s": 60}, "scheduled", 0),
        ("checkpoint", {"data": {"page": 7}}, "running", 1),
        ("release", {}, "scheduled", 0),
    ],
)
async def test_each_single_outcome_lands_durably_and_answers_the_state(
    served: Make, name: str, body: dict[str, Any], state: str, attempts: int
) -> None:
    s = await served(security(), fake=False, **REMOTE)
    c = s.client
    job_id = await _job(c)
    [granted] = await _claim(c)
    r = await c.post(f"/claims/{name}", json={"token": granted["token"], **body},
                     headers=auth("w-mail"))  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["state"] == state
    stored = await s.service.store.get(job_id)  # what the store holds, not a view of it
    assert stored is not None
    assert (stored.state.value, stored.attempts) == (state, attempts)
    if name == "checkpoint":
        assert stored.checkpoint == {"page": 7}


async def test_a_token_this_server_never_signed_is_422_naming_token(served: Make) -> None:
    s = await served(security(), fake=False, **REMOTE)
    c = s.client
    await _job(c)
    [granted] = await _claim(c)
    forged = granted["token"][:-2] + ("AA" if not granted["token"].endswith("AA") else "BB")
    for token in (forged, "garbage", TOKEN):
        r = await c.post("/claims/complete", json={"token": token}, headers=auth("w-mail"))
        assert r.status_code == 422, r.text
        assert (r.json()["error"], r.json()["field"]) == ("invalid", "token")
    big = "x" * (MAX_CHECKPOINT_BYTES + 1)  # within the body's limit, past the checkpoint's
    r = await c.post("/claims/checkpoint", json={"token": granted["token"], "data": big},
                     headers=auth("w-mail"))  # fmt: skip
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "data"


async def test_a_worker_is_held_to_its_queues_and_claims_only_remote_ones(served: Make) -> None:
    s = await served(security(), fake=False, **REMOTE)
    c = s.client
    await _job(c, "video")
    r = await c.post("/claims", json={"queues": ["video"], "worker": "b"}, headers=auth("w-mail"))
    assert r.status_code == 403, r.text
    assert r.json()["error"] == "forbidden"
    r = await c.post("/claims", json={"queues": ["mail", "default"], "worker": "b"},
                     headers=auth("w-all"))  # fmt: skip
    assert r.status_code == 422
    assert r.json()["field"] == "queues[1]"  # not a remote queue
    [theirs] = await _claim(c, who="w-all", queues=["video"])
    token = theirs["token"]
    r = await c.post("/claims/complete", json={"token": token}, headers=auth("w-mail"))
    assert r.status_code == 403, r.text  # a job of another queue than its own
    r = await c.post("/claims/outcomes", json={"outcomes": [{"token": token, "complete": {}}]},
                     headers=auth("w-mail"))  # fmt: skip
    assert r.status_code == 200
    assert r.json()["outcomes"][0]["error"] == "forbidden"
    r = await c.post("/claims/heartbeat", json={"items": [{"token": token}]},
                     headers=auth("w-mail"))  # fmt: skip
    assert r.json()["items"][0]["error"] == "forbidden"
    r = await c.post("/claims/complete", json={"token": token}, headers=auth("w-all"))
    assert r.json()["state"] == "completed"


async def test_the_batch_reports_many_at_once_each_with_its_fate(served: Make) -> None:
    s = await served(security(), fake=False, **REMOTE)
    c = s.client
    for _ in range(3):
        await _job(c)
    claims = await _claim(c, max=3)
    assert len(claims) == 3
    tokens = [g["token"] for g in claims]
    outcomes = [{"token": tokens[0], "complete": {"result": 1}},
                {"token": tokens[1], "fail": {"retry": False}},
                {"token": tokens[2], "release": {}, "snooze": {"delay_s": 1}},
                {"token": tokens[0], "complete": {}},
                {"token": "garbage", "complete": {}}]  # fmt: skip
    r = await c.post("/claims/outcomes", json={"outcomes": outcomes}, headers=auth("w-mail"))
    assert r.status_code == 200, r.text
    answers = r.json()["outcomes"]
    assert [a["token"] for a in answers] == [o["token"] for o in outcomes]
    assert [a.get("state") or a["error"] for a in answers] == [
        "completed", "dead", "invalid", "fenced", "invalid"]  # fmt: skip
    assert answers[2]["detail"].startswith("outcome: ")


async def test_a_claim_carries_outcomes_and_answers_both(served: Make) -> None:
    """The outcomes ride the claim that takes the next jobs: written, answered in order in
    ``outcomes``, and the claim does not wait (none left: empty at once)."""
    s = await served(security(), fake=False, **REMOTE)
    c = s.client
    for _ in range(3):
        await _job(c)
    first = await _claim(c, max=2)
    carried = [{"token": first[0]["token"], "complete": {"result": 1}},
               {"token": first[1]["token"], "fail": {"error": "e", "retry": False}},
               {"token": "garbage", "complete": {}}]  # fmt: skip
    body = {"queues": ["mail"], "worker": "box-1", "max": 5, "wait_s": 30, "outcomes": carried}
    r = await c.post("/claims", json=body, headers=auth("w-mail"))
    assert r.status_code == 200, r.text
    answer = r.json()
    assert [a.get("state") or a["error"] for a in answer["outcomes"]] == [
        "completed", "dead", "invalid"]  # fmt: skip
    [third] = answer["claims"]
    assert third["job"]["id"] not in {g["job"]["id"] for g in first}
    body = {**body, "outcomes": [{"token": third["token"], "complete": {}}]}
    r = await c.post("/claims", json=body, headers=auth("w-mail"))  # none left: no wait
    assert r.json() == {"claims": [], "outcomes": [{"token": third["token"],
                                                   "state": "completed"}]}  # fmt: skip
    r = await c.post("/claims", json={**body, "outcomes": [], "wait_s": 0}, headers=auth("w-mail"))
    assert r.json() == {"claims": []}  # (an empty list carries nothing: a plain claim)


async def test_a_refused_claim_writes_none_of_the_outcomes_it_carries(served: Make) -> None:
    s = await served(security(), fake=False, **REMOTE)
    c = s.client
    job_id = await _job(c)
    [g] = await _claim(c)
    body = {"queues": ["video"], "worker": "box-1",
            "outcomes": [{"token": g["token"], "complete": {}}]}  # fmt: skip
    r = await c.post("/claims", json=body, headers=auth("w-mail"))
    assert r.status_code == 403, r.text
    r = await c.get(f"/jobs/{job_id}", headers=auth("ops"))
    assert r.json()["state"] == "running"


async def test_get_workers_and_queues_show_the_remote_side(served: Make) -> None:
    s = await served(security(), fake=False, **REMOTE)
    c = s.client
    await _job(c)
    await _job(c, "video")
    queues = {
        q["name"]: q for q in (await c.get("/queues", headers=auth("viewer"))).json()["queues"]
    }
    assert queues["mail"]["remote"] is True
    assert "no worker" in queues["mail"]["warning"]  # jobs wait, and nobody was ever seen
    await _claim(c)
    queues = {
        q["name"]: q for q in (await c.get("/queues", headers=auth("viewer"))).json()["queues"]
    }
    assert queues["mail"]["warning"] is None  # a worker claimed from it just now
    assert queues["video"]["warning"] is not None
    r = await c.get("/workers", headers=auth("viewer"))
    [seen] = r.json()["workers"]
    shown = {k: seen[k] for k in ("name", "principal", "role", "held", "queues")}
    assert shown == {"name": "box-1", "principal": "w-mail", "role": "worker", "held": 1,
                     "queues": ["mail"]}  # fmt: skip
    r = await c.post("/jobs", json={"kind": "sleep"}, headers=auth("ops"))
    queues = {q["name"]: q for q in (await c.get("/queues", headers=auth("ops"))).json()["queues"]}
    assert (queues["default"]["remote"], queues["default"]["warning"]) == (False, None)


async def test_a_claim_long_polls_until_a_job_comes(served: Make) -> None:
    s = await served(security(), fake=False, **REMOTE)
    c = s.client
    waiting = asyncio.ensure_future(_claim(c, wait_s=20))
    await wait_for(lambda: s.service.remote.waiting() == 1)
    job_id = await _job(c)
    [granted] = await asyncio.wait_for(waiting, 10)  # woken by the submit, long before 20 s
    assert granted["job"]["id"] == job_id
    assert await _claim(c, wait_s=0.05) == []  # nothing more: an empty list after the wait


# -- a real server ----------------------------------------------------------------------------


@pytest.mark.slow  # a real sqlq serve, and a wait longer than its keep-alive timeout
def test_a_long_poll_outlives_every_server_timeout_and_no_log_holds_a_token() -> None:
    server = spawn_server("--store", "memory", "--remote-queue", "mail", "--keep-alive", "1",
                          "--access-log", "--log-level", "debug")  # fmt: skip
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=30) as c:
            started = time.monotonic()
            r = c.post("/claims", json={"queues": ["mail"], "worker": "w", "wait_s": 3})
            assert r.status_code == 200, r.text
            assert r.json() == {"claims": []}
            assert time.monotonic() - started >= 3  # held the whole wait, past --keep-alive 1
            assert c.post("/jobs", json={"kind": "k", "queue": "mail"}).status_code == 201
            [granted] = c.post("/claims", json={"queues": ["mail"], "worker": "w"}).json()["claims"]
            token = granted["token"]
            beat = c.post("/claims/heartbeat", json={"items": [{"token": token}]})
            assert beat.status_code == 200
            assert c.post("/claims/complete", json={"token": token}).status_code == 200
            assert c.post("/claims/complete", json={"token": token}).status_code == 409
        server.stop()
        assert '"POST /claims/complete HTTP/1.1" 409' in server.output  # the access log ran
        assert token not in server.output
        assert token.rsplit(".", 1)[1] not in server.output  # not even its mac
    finally:
        server.stop()


@pytest.mark.slow  # a real sqlq serve, and a client that really goes away
async def test_a_long_poll_whose_client_went_away_gives_its_jobs_back() -> None:
    """Claimed for nobody, a job would wait out its lease and then spend an attempt: the
    server sees the client gone and releases it (no attempt counted) at once."""
    server = await start_ready("--store", "memory", "--remote-queue", "mail")
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:

            async def remote() -> dict[str, Any]:
                return dict((await c.get("/stats")).json()["remote"])

            body = msgspec.json.encode({"queues": ["mail"], "worker": "gone", "wait_s": 20})
            host, port = server.url.removeprefix("http://").split(":")
            _, writer = await asyncio.open_connection(host, int(port))
            writer.write(b"POST /claims HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                         b"application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(body), body))  # fmt: skip
            await writer.drain()
            await wait_for(lambda: _is(remote(), "claims_waiting", 1))
            writer.close()  # gone while its claim long-polls
            await writer.wait_closed()
            # The server looks for a gone client only once a claim has waited LOOK_AFTER_S
            # (the rule is of time): until then, a job claimed is answered, not looked at.
            gone = time.monotonic()
            await wait_for(lambda: time.monotonic() - gone > 2 * LOOK_AFTER_S)
            job_id = (await c.post("/jobs", json={"kind": "k", "queue": "mail"})).json()["id"]
            await wait_for(lambda: _is(remote(), "release", 1))
            job = (await c.get(f"/jobs/{job_id}")).json()
            assert (job["state"], job["attempts"]) == ("scheduled", 0)
            [granted] = await _claim(c, wait_s=0)  # the next worker has it at once
            assert (granted["job"]["id"], granted["job"]["attempts"]) == (job_id, 1)
    finally:
        await asyncio.to_thread(server.stop)


async def _is(stats: Any, key: str, value: int) -> bool:
    return bool((await stats)[key] == value)


# -- the flags --------------------------------------------------------------------------------


def test_remote_queue_and_workers_0_reach_the_runtime_config() -> None:
    config = ServeSettings(remote_queues=("mail", "video")).runtime_config()
    assert config.remote_queues == frozenset({"mail", "video"})
    assert (config.is_remote("mail"), config.is_remote("default")) == (True, False)
    everything = ServeSettings(workers=0).runtime_config()
    assert everything.workers == 0
    assert everything.is_remote("any-queue-at-all")
    assert not ServeSettings().runtime_config().every_queue_remote


@pytest.mark.parametrize("bad", ["has space", "", "x" * 65, "new\nline"])
def test_a_bad_remote_queue_is_a_cli_error_naming_the_flag(bad: str) -> None:
    r = CliRunner().invoke(main, ["serve", "--store", "memory", "--remote-queue", bad])
    assert r.exit_code == 2, r.output
    assert "--remote-queue" in r.output
    assert "not a queue name" in r.output


async def test_with_workers_0_every_queue_is_claimed_over_http(served: Make) -> None:
    s = await served(fake=False, workers=0)
    c = s.client
    r = await c.post("/jobs", json={"kind": "made.elsewhere", "queue": "anything"})
    assert r.status_code == 201, r.text
    r = await c.post("/claims", json={"queues": ["anything"], "worker": "w"})
    assert [g["job"]["kind"] for g in r.json()["claims"]] == ["made.elsewhere"]
