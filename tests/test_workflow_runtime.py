"""Workflows through the service and the HTTP API: a graph submitted in one batch runs each
job once, after its parents; a bad graph is a 422 naming the job."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sqlq.common import query
from sqlq.common.errors import IllegalTransitionError, ValidationError
from sqlq.common.models import Job, State
from sqlq.common.specs import MemberSpec, RetrySpec
from sqlq.common.workflow import CancelReason, Flow, OnParentFailure, RunIf
from sqlq.engines.registry import make_store
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.kinds import JobContext, Registry, task
from tests.helpers import NOW, ServiceFactory, app_client, final, finals

Started = list[str]


def _recording(started: Started, failing: set[str] | None = None) -> Registry:
    """A kind ``step`` that records each start; it fails if its args say ``fail``, or while
    its name is in ``failing``."""
    kinds = Registry()

    @task("step", registry=kinds)
    async def step(args: dict[str, Any], ctx: JobContext) -> dict[str, Any]:
        started.append(args["name"])
        if args.get("fail") or (failing is not None and args["name"] in failing):
            raise RuntimeError(f"{args['name']} failed")
        return {"name": args["name"]}

    return kinds


def _spec(name: str, *after: str, **more: Any) -> MemberSpec:
    fail = more.pop("fail", False)
    args = {"name": name, "fail": fail}
    return MemberSpec(kind="step", args=args, ref=name, depends_on=after, **more)


DIAMOND = [_spec("a"), _spec("b", "a"), _spec("c", "a"), _spec("d", "b", "c")]


async def test_a_diamond_runs_each_job_once_after_its_parents(services: ServiceFactory) -> None:
    started: Started = []
    rt = services(kinds=_recording(started), workers=4)
    await rt.start()
    jobs, _ = await rt.submit(DIAMOND, batch=True, workflow=True)
    assert [j.state for j in jobs] == [State.SCHEDULED] + [State.WAITING] * 3
    done = await finals(rt, jobs)
    assert {ref: j.state for ref, j in done.items()} == dict.fromkeys("abcd", State.COMPLETED)
    assert sorted(started) == ["a", "b", "c", "d"]  # each once
    assert started[0] == "a"
    assert started[-1] == "d"
    d_started = done["d"].started_at
    assert d_started is not None
    assert d_started >= max(done["b"].updated_at, done["c"].updated_at)
    assert rt.stats()["jobs"]["completed"] == 4


async def test_a_dead_root_cancels_the_diamond_as_upstream_dead(services: ServiceFactory) -> None:
    started: Started = []
    rt = services(kinds=_recording(started), workers=4)
    await rt.start()
    specs = [_spec("a", fail=True, max_attempts=1), *DIAMOND[1:]]
    jobs, _ = await rt.submit(specs, batch=True, workflow=True)
    done = await finals(rt, jobs)
    assert done["a"].state is State.DEAD
    for ref in "bcd":
        assert done[ref].state is State.CANCELLED
        flow = done[ref].flow
        assert flow is not None
        assert flow.cancel_reason is CancelReason.UPSTREAM_DEAD
    assert started == ["a"]
    assert rt.stats()["jobs"].get("waiting", 0) == 0


async def test_retrying_the_dead_root_runs_the_whole_diamond_to_completed(
    services: ServiceFactory,
) -> None:
    started: Started = []
    failing = {"a"}
    rt = services(kinds=_recording(started, failing), workers=4)
    await rt.start()
    specs = [_spec("a", max_attempts=1), *DIAMOND[1:]]
    jobs, _ = await rt.submit(specs, batch=True, workflow=True)
    assert (await final(rt, jobs[3].id)).state is State.CANCELLED
    assert (await final(rt, jobs[0].id)).state is State.DEAD
    failing.clear()  # fixed
    assert (await rt.retry(jobs[0].id)).state is State.SCHEDULED
    done = await finals(rt, jobs)
    assert {ref: j.state for ref, j in done.items()} == dict.fromkeys("abcd", State.COMPLETED)
    assert started == ["a", "a", *started[2:4], "d"]
    assert sorted(started[2:4]) == ["b", "c"]
    assert rt.stats()["jobs"]["waiting"] == 0


async def test_a_workflow_retry_revives_its_dead_and_their_cones_and_leaves_the_users() -> None:
    """Over HTTP: a dies (max_attempts 1) and its cone is cancelled; e, which a user
    cancelled (its queue paused, so it never started), stays so after the retry."""
    config = RuntimeConfig(workers=2, seed=1, fault_injection=True)
    async with app_client(config) as client:
        assert (await client.post("/queues/held/pause")).status_code == 200
        fail = {"kind": "sleep", "ref": "a", "args": {"fail_prob": 1}, "max_attempts": 1}
        jobs = [fail, {"kind": "sleep", "ref": "b", "depends_on": ["a"]},
                {"kind": "sleep", "ref": "e", "queue": "held"}]  # fmt: skip
        r = await client.post("/jobs/batch", json={"workflow": True, "jobs": jobs})
        a, b, e = r.json()["ids"]
        workflow_id = r.json()["workflow_id"]
        assert (await client.delete(f"/jobs/{e}")).json()["state"] == "cancelled"
        assert (await client.get(f"/jobs/{b}?wait=30")).json()["state"] == "cancelled"
        assert (await client.get(f"/jobs/{a}?wait=30")).json()["state"] == "dead"
        view = (await client.get(f"/workflows/{workflow_id}")).json()
        assert view["retryable"] == 1  # a; b comes back with it, e (a user's cancel) does not
        r = await client.post(f"/workflows/{workflow_id}/retry")
        assert (r.status_code, r.json()) == (200, {"retried": 1})
        b_now = (await client.get(f"/jobs/{b}")).json()  # waiting for a again (or, a having
        # failed again already, as it always does here, cancelled for it again)
        assert (b_now["state"], b_now["flow"]["deps_pending"]) in (("waiting", 1), ("cancelled", 0))
        assert (await client.get(f"/jobs/{a}?wait=30")).json()["attempts_total"] == 2
        e_now = (await client.get(f"/jobs/{e}")).json()
        assert (e_now["state"], e_now["flow"]["cancel_reason"]) == ("cancelled", "user")
        r = await client.post(f"/workflows/{'0' * 32}/retry")
        assert (r.status_code, r.json()["error"]) == (404, "not_found")


async def test_cancelling_a_waiting_member_cancels_its_cone(services: ServiceFactory) -> None:
    rt = services(workers=0)
    await rt.start()
    jobs, _ = await rt.submit(DIAMOND, batch=True, workflow=True)
    cancelled = await rt.cancel(jobs[1].id)
    assert cancelled.state is State.CANCELLED
    d = await rt.get(jobs[3].id)
    assert d is not None
    assert d.state is State.CANCELLED
    assert d.flow is not None
    assert d.flow.cancel_reason is CancelReason.UPSTREAM_CANCELLED
    c = await rt.get(jobs[2].id)
    assert c is not None
    assert c.state is State.WAITING


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with app_client(RuntimeConfig(workers=0, seed=1)) as c:
        yield c


async def test_a_workflow_batch_over_http_shows_each_members_flow(
    client: httpx.AsyncClient,
) -> None:
    body = {
        "workflow": True,
        "jobs": [
            {"kind": "sleep", "ref": "a"},
            {"kind": "sleep", "ref": "b", "depends_on": ["a"], "on_parent_failure": "run"},
            {"kind": "sleep", "depends_on": ["a", "b"], "run_if": "all_finished"},
        ],
    }
    r = await client.post("/jobs/batch", json=body)
    assert r.status_code == 201, r.text
    ids = r.json()["ids"]
    views = [(await client.get(f"/jobs/{i}")).json() for i in ids]
    assert [v["state"] for v in views] == ["scheduled", "waiting", "waiting"]
    flows = [v["flow"] for v in views]
    assert len({f["workflow_id"] for f in flows}) == 1
    assert flows[1]["parents"] == [ids[0]]
    assert flows[1]["on_parent_failure"] == "run"
    assert flows[2]["parents"] == ids[:2]
    assert (flows[2]["deps_pending"], flows[2]["run_if"]) == (2, "all_finished")


@pytest.mark.parametrize(
    ("jobs", "field", "words"),
    [
        ([{"kind": "sleep", "ref": "a", "depends_on": ["b"]},
          {"kind": "sleep", "ref": "b", "depends_on": ["a"]}], "jobs[0].depends_on", "cycle"),
        ([{"kind": "sleep", "depends_on": ["nope"]}], "jobs[0].depends_on", "nope"),
        ([{"kind": "sleep", "ref": "a"}, {"kind": "sleep", "ref": "a"}], "jobs[1].ref", "too"),
        ([{"kind": "sleep", "ref": "a", "idempotency_key": "k1"}],
         "jobs[0].idempotency_key", "no key"),
        ([{"kind": "sleep", "run_if": "sometimes"}], "jobs[0].run_if", "sometimes"),
    ],
)  # fmt: skip
async def test_a_bad_graph_is_a_422_naming_the_job(
    client: httpx.AsyncClient, jobs: list[dict[str, Any]], field: str, words: str
) -> None:
    r = await client.post("/jobs/batch", json={"workflow": True, "jobs": jobs})
    assert r.status_code == 422, r.text
    assert r.json()["field"] == field
    assert words in r.json()["message"]
    assert (await client.get("/stats")).json()["submitted"] == 0


async def test_a_graph_outside_a_workflow_is_a_422(client: httpx.AsyncClient) -> None:
    r = await client.post("/jobs", json={"kind": "sleep", "depends_on": ["a"]})
    assert (r.status_code, r.json()["field"]) == (422, "body")  # an unknown field: its object
    assert "depends_on" in r.json()["message"]
    r = await client.post("/jobs/batch", json={"jobs": [{"kind": "sleep", "ref": "a"}]})
    assert (r.status_code, r.json()["field"]) == (422, "jobs[0].ref")


async def test_a_workflow_reads_back_with_its_state_counts_and_what_blocks_each_job(
    client: httpx.AsyncClient,
) -> None:
    jobs = [
        {"kind": "sleep", "ref": "a"},
        {"kind": "sleep", "ref": "b", "depends_on": ["a"]},
        {"kind": "sleep", "ref": "c", "depends_on": ["a"]},
        {"kind": "sleep", "ref": "d", "depends_on": ["b", "c"]},
    ]
    r = await client.post("/jobs/batch", json={"workflow": True, "jobs": jobs})
    a, b, c, d = ids = r.json()["ids"]
    workflow_id = (await client.get(f"/jobs/{a}")).json()["flow"]["workflow_id"]
    r = await client.get(f"/workflows/{workflow_id}")
    assert r.status_code == 200, r.text
    view = r.json()
    assert (view["id"], view["state"], view["retryable"]) == (workflow_id, "running", 0)
    assert view["counts"] == {"scheduled": 1, "waiting": 3}
    assert [m["id"] for m in view["jobs"]] == ids
    members = {m["ref"]: m for m in view["jobs"]}
    assert members["d"]["parents"] == [b, c]
    assert members["d"]["blocked_by"] == [b, c]
    assert members["a"]["blocked_by"] == []
    assert (await client.delete(f"/jobs/{a}")).status_code == 200
    view = (await client.get(f"/workflows/{workflow_id}")).json()
    assert (view["state"], view["counts"]) == ("cancelled", {"cancelled": 4})
    assert {m["ref"]: m["cancel_reason"] for m in view["jobs"]} == {
        "a": "user", "b": "upstream_cancelled", "c": "upstream_cancelled",
        "d": "upstream_cancelled",
    }  # fmt: skip
    for missing in ("0" * 32, "not-an-id", d):  # (a job's id names no workflow)
        r = await client.get(f"/workflows/{missing}")
        assert (r.status_code, r.json()["error"]) == (404, "not_found")


async def test_a_workflows_members_are_listed_a_page_at_a_time_its_counts_over_all(
    client: httpx.AsyncClient,
) -> None:
    jobs = [{"kind": "sleep", "ref": "root"}] + [
        {"kind": "sleep", "ref": f"c{i}", "depends_on": ["root"]} for i in range(2_499)
    ]
    r = await client.post("/jobs/batch", json={"workflow": True, "jobs": jobs})
    assert r.status_code == 201, r.text
    ids, workflow_id = r.json()["ids"], r.json()["workflow_id"]
    r = await client.post("/jobs/batch", json={"workflow": True, "jobs": [{"kind": "sleep"}]})
    other = r.json()["ids"][0]
    first = (await client.get(f"/workflows/{workflow_id}")).json()
    assert len(first["jobs"]) == 1_000  # the default page: every page's at most
    assert first["counts"] == {"scheduled": 1, "waiting": 2_499}  # over every member
    assert first["state"] == "running"
    seen, after, pages = [m["id"] for m in first["jobs"]], first["next"], 1
    while after is not None:
        r = await client.get(f"/workflows/{workflow_id}", params={"after": after, "limit": 700})
        assert r.status_code == 200, r.text
        page = r.json()
        assert page["counts"] == first["counts"]
        assert len(page["jobs"]) <= 700
        seen += [m["id"] for m in page["jobs"]]
        after, pages = page["next"], pages + 1
    assert seen == ids  # each once, in the order stored
    assert pages == 4  # 1,000, then 700, 700 and the last 100: no empty page at the end
    last = (await client.get(f"/workflows/{workflow_id}", params={"limit": 2_500})).status_code
    assert last == 422
    for bad, field in (
        ({"limit": "0"}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"after": "nonsense"}, "after"),
        ({"after": query.cursor("f" * 32)}, "after"),  # a job id, but no member of it
        ({"after": query.cursor(other)}, "after"),  # another workflow's member
        ({"page": "2"}, "page"),
    ):
        r = await client.get(f"/workflows/{workflow_id}", params=bad)
        assert (r.status_code, r.json()["field"]) == (422, field), (bad, r.text)


async def test_a_large_workflows_view_is_made_on_a_thread(
    services: ServiceFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from sqlq.runtime import service as service_module

    made_on: list[threading.Thread] = []
    from sqlq.common.wire import workflow_view as real

    def spy(*args: Any) -> Any:
        made_on.append(threading.current_thread())
        return real(*args)

    monkeypatch.setattr(service_module, "workflow_view", spy)
    rt = services(workers=0)
    await rt.start()
    for n in (3, service_module.VIEW_ON_LOOP + 1):
        specs = [MemberSpec(kind="sleep", ref="root")] + [
            MemberSpec(kind="sleep", depends_on=("root",)) for _ in range(n - 1)
        ]
        jobs, _ = await rt.submit(specs, batch=True, workflow=True)
        assert jobs[0].flow is not None
        workflow_id = jobs[0].flow.workflow_id
        view = await rt.workflow(workflow_id)
        assert view is not None
        assert sum(view.counts.values()) == n
    small, large = made_on
    with pytest.raises(ValidationError) as refused:  # (the service's own bound, not HTTP's)
        await rt.workflow(workflow_id, limit=0)
    assert refused.value.field == "limit"
    assert small is threading.current_thread()
    assert large is not threading.current_thread()


async def test_a_member_waiting_behind_a_dead_parent_reads_stuck(services: ServiceFactory) -> None:
    started: Started = []
    rt = services(kinds=_recording(started), workers=2)
    await rt.start()
    specs = [
        _spec("a", fail=True, max_attempts=1),
        _spec("b", "a", on_parent_failure=OnParentFailure.WAIT),
    ]
    jobs, _ = await rt.submit(specs, batch=True, workflow=True)
    assert (await final(rt, jobs[0].id)).state is State.DEAD
    flow = jobs[0].flow
    assert flow is not None
    view = await rt.workflow(flow.workflow_id)
    assert view is not None
    assert view.state == "stuck"
    assert view.jobs[1].blocked_by == [jobs[0].id]


async def test_cancelling_a_workflow_cancels_what_has_not_started_and_asks_the_rest() -> None:
    async with app_client(RuntimeConfig(workers=0, seed=1, remote_queues=frozenset({"r"}))) as c:
        jobs = [
            {"kind": "k", "queue": "r", "ref": "a"},
            {"kind": "k", "queue": "r", "ref": "b", "depends_on": ["a"]},
            {"kind": "k", "queue": "r", "ref": "c", "depends_on": ["b"]},
            {"kind": "k", "queue": "r", "ref": "side"},
        ]
        r = await c.post("/jobs/batch", json={"workflow": True, "jobs": jobs})
        workflow_id = r.json()["workflow_id"]
        ids = r.json()["ids"]
        claim = {"queues": ["r"], "worker": "w1", "max": 1, "wait_s": 0}
        [held] = (await c.post("/claims", json=claim)).json()["claims"]
        assert held["job"]["id"] == ids[0]  # a runs; b and c wait; side is scheduled
        r = await c.post(f"/workflows/{workflow_id}/cancel")
        assert r.status_code == 200, r.text
        assert r.json() == {"cancelled": 3, "requested": 1}
        states = [(await c.get(f"/jobs/{i}")).json()["state"] for i in ids]
        assert states == ["running", "cancelled", "cancelled", "cancelled"]
        a = (await c.get(f"/jobs/{ids[0]}")).json()
        assert a["cancel_requested"] is True
        r = await c.post(f"/workflows/{'0' * 32}/cancel")
        assert r.status_code == 404


async def test_a_bulk_retry_of_cancelled_jobs_revives_a_cone_through_its_root(
    services: ServiceFactory,
) -> None:
    """The root a user cancelled is retried; its cone, cancelled for it, comes back with it
    (not by its own retry, which would run it before its parents)."""
    started: Started = []
    rt = services(kinds=_recording(started), workers=0)
    await rt.start()
    jobs, _ = await rt.submit(DIAMOND, batch=True, workflow=True)
    await rt.cancel(jobs[0].id)
    assert [(await final(rt, j.id)).state for j in jobs] == [State.CANCELLED] * 4
    assert await rt.retry_matching(RetrySpec(state="cancelled")) == 1  # the root alone
    states = [(await rt.get(j.id)) for j in jobs]
    assert [j.state if j else None for j in states] == [State.SCHEDULED] + [State.WAITING] * 3
    with pytest.raises(IllegalTransitionError, match="it is waiting"):
        await rt.retry(jobs[3].id)  # d waits: it is no dead or cancelled job to retry now


@pytest.mark.parametrize("remote", [False, True])
async def test_a_child_released_at_recovery_is_due_once(
    services: ServiceFactory, tmp_path: Path, remote: bool
) -> None:
    """A parent that was running on its last attempt is buried at recovery, in a commit
    whose cascade releases its child (``run``): the child is due once, not twice."""
    queue = "r" if remote else "default"
    store = make_store("walq", tmp_path)
    await store.open()
    parent_flow = Flow(workflow_id="f" * 32, ref="p")
    parent = Job.new(kind="step", args={"name": "p"}, now=NOW, max_attempts=1, queue=queue,
                     flow=parent_flow)  # fmt: skip
    child_flow = Flow(workflow_id="f" * 32, ref="c", parents=(parent.id,), deps_pending=1,
                      on_parent_failure=OnParentFailure.RUN)  # fmt: skip
    child = Job.new(kind="step", args={"name": "c"}, now=NOW, queue=queue, flow=child_flow)
    await store.commit([parent, child])
    await store.commit([parent.start(NOW + 1)])
    await store.close()  # as a kill leaves it: the parent running
    config: dict[str, Any] = {"remote_queues": frozenset({queue})} if remote else {}
    rt = services(make_store("walq", tmp_path), kinds=_recording([]), workers=0, **config)
    await rt.start()
    assert (await rt.get(parent.id)).state is State.DEAD  # type: ignore[union-attr]
    assert (await rt.get(child.id)).state is State.SCHEDULED  # type: ignore[union-attr]
    assert (await rt.queues())[queue].depth == 1


async def test_appending_to_a_workflow_counts_each_parent_as_it_stands(
    services: ServiceFactory,
) -> None:
    """x joins after a while a runs: it waits, and a's end releases it; y joins after a
    completed: due at once. A parent that failed and a member it could not run after is
    refused (409), and so is a name that is no ref here and no member's id (422)."""
    import asyncio

    gate = asyncio.Event()
    kinds = Registry()

    @task("held", registry=kinds)
    async def held(args: dict[str, Any], ctx: JobContext) -> str:
        if args.get("fail"):
            raise RuntimeError("no")
        await gate.wait()
        return "ok"

    rt = services(kinds=kinds, workers=2)
    await rt.start()
    (a,), _ = await rt.submit([MemberSpec(kind="held", ref="a")], batch=True, workflow=True)
    assert a.flow is not None
    wf = a.flow.workflow_id
    (x,), _ = await rt.submit(
        [MemberSpec(kind="sleep", ref="x", depends_on=(a.id,))], batch=True, workflow=wf
    )
    assert x.flow is not None
    assert (x.state, x.flow.deps_pending, x.flow.workflow_id) == (State.WAITING, 1, wf)
    gate.set()
    assert (await final(rt, x.id)).state is State.COMPLETED
    (y, z), _ = await rt.submit(
        [MemberSpec(kind="sleep", ref="y", depends_on=(a.id, x.id)),
         MemberSpec(kind="sleep", ref="z", depends_on=("y",))],
        batch=True, workflow=wf,
    )  # fmt: skip
    assert (y.state, z.state) == (State.SCHEDULED, State.WAITING)
    assert (await final(rt, z.id)).state is State.COMPLETED
    view = await rt.workflow(wf)
    assert view is not None
    assert ([m.ref for m in view.jobs], view.state) == (["a", "x", "y", "z"], "completed")
    (bad,), _ = await rt.submit(
        [MemberSpec(kind="held", args={"fail": True}, ref="bad", max_attempts=1)],
        batch=True, workflow=wf,
    )  # fmt: skip
    assert (await final(rt, bad.id)).state is State.DEAD
    with pytest.raises(IllegalTransitionError, match="has failed; retry it first"):
        await rt.submit([MemberSpec(kind="sleep", depends_on=(bad.id,))], batch=True, workflow=wf)
    with pytest.raises(ValidationError, match="nor the workflow a member") as caught:
        await rt.submit([MemberSpec(kind="sleep", depends_on=("q",))], batch=True, workflow=wf)
    assert caught.value.field == "jobs[0].depends_on"
    with pytest.raises(ValidationError, match="no workflow") as caught:
        await rt.submit([MemberSpec(kind="sleep")], batch=True, workflow="0" * 32)
    assert caught.value.field == "workflow"
    with pytest.raises(ValidationError, match="has a member 'a'") as caught:
        await rt.submit([MemberSpec(kind="sleep", ref="a")], batch=True, workflow=wf)
    assert caught.value.field == "jobs[0].ref"
    (hook,), _ = await rt.submit(  # an on-failure hook after parents that all completed
        [MemberSpec(kind="held", ref="hook", depends_on=(a.id, x.id), run_if=RunIf.ANY_FAILED)],
        batch=True, workflow=wf,
    )  # fmt: skip
    assert hook.flow is not None
    assert (hook.state, hook.flow.cancel_reason) == (State.CANCELLED, "condition_false")
    assert rt.live.get(hook.id) is None  # judged at birth: never live, never run


async def test_appending_over_http_answers_the_workflows_id(client: httpx.AsyncClient) -> None:
    r = await client.post("/jobs/batch", json={"workflow": True, "jobs": [{"kind": "sleep"}]})
    wf, (root,) = r.json()["workflow_id"], r.json()["ids"]
    more = {"workflow": wf, "jobs": [{"kind": "sleep", "depends_on": [root]}]}
    r = await client.post("/jobs/batch", json=more)
    assert (r.status_code, r.json()["workflow_id"]) == (201, wf)
    r = await client.post("/jobs/batch", json={**more, "workflow": "not-an-id"})
    assert (r.status_code, r.json()["field"]) == (422, "workflow")
