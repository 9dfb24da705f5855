"""``sqlq.spawn``: a handler's end adds jobs to its workflow in its completion's commit,
on every engine; a spawn the server refuses fails the attempt and stores nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import sqlq
from sqlq.common.models import Job, State
from sqlq.common.specs import JobSpec, MemberSpec
from sqlq.common.store import JobQuery
from sqlq.engines.registry import make_store
from sqlq.runtime.kinds import JobContext, Registry, task
from sqlq.runtime.service import Service
from tests.helpers import ServiceFactory, final

Seen = dict[str, Any]


def _kinds(seen: Seen) -> Registry:
    """``fan`` spawns what its args say: a chord of ``leaf`` jobs into ``total`` (the
    default), or the raw jobs ``args["jobs"]``; ``total`` sums its parents' results."""
    kinds = Registry()

    @task(registry=kinds)
    async def leaf(n: int) -> int:
        return n * n

    @task(registry=kinds)
    async def total(ctx: JobContext) -> int:
        seen["total"] = {ref: p.result for ref, p in ctx.parents.items()}
        return sum(p.result for p in ctx.parents.values())

    @task(registry=kinds)
    async def fan(ctx: JobContext, n: int = 3, jobs: list[Any] | None = None) -> sqlq.Spawn:
        seen["fan"] = dict(ctx.parents)
        if jobs is not None:
            return sqlq.Spawn(jobs=jobs, result="raw")
        return sqlq.spawn(sqlq.chord([leaf.s(n=i) for i in range(n)], total.s()), result="fanned")

    @task(registry=kinds)
    async def after() -> str:
        return "after"

    return kinds


async def _members(rt: Service, workflow_id: str) -> list[Job]:
    return [await final(rt, j.id, 60) for j in await rt.store.workflow(workflow_id)]


@pytest.mark.parametrize("engine", ["memory", "walq", "sqlite"])
async def test_a_spawn_joins_the_workflow_in_the_completions_commit(
    services: ServiceFactory, tmp_path: Path, engine: str
) -> None:
    seen: Seen = {}
    rt = services(make_store(engine, tmp_path), kinds=_kinds(seen), workers=4)
    await rt.start()
    specs = [MemberSpec(kind="fan", ref="fan"), MemberSpec(kind="after", depends_on=("fan",))]
    (fan, after), _ = await rt.submit(specs, batch=True, workflow=True)
    done = await final(rt, fan.id, 60)
    assert (done.state, done.result) == (State.COMPLETED, "fanned")
    assert fan.flow is not None
    members = {j.id: j for j in await _members(rt, fan.flow.workflow_id)}
    assert len(members) == 2 + 3 + 1  # the spawned jobs were stored with its completion
    assert {j.state for j in members.values()} == {State.COMPLETED}
    leaves = [j for j in members.values() if j.kind == "leaf"]
    [summed] = [j for j in members.values() if j.kind == "total"]
    assert [j.flow.parents if j.flow else () for j in leaves] == [(fan.id,)] * 3  # its children
    assert summed.flow is not None
    assert set(summed.flow.parents) == {j.id for j in leaves}
    assert summed.result == 0 + 1 + 4
    assert sorted(seen["total"].values()) == [0, 1, 4]
    assert members[after.id].state is State.COMPLETED  # released by fan's own completion
    view = await rt.workflow(fan.flow.workflow_id)
    assert view is not None
    assert view.state == "completed"
    refs = {j.flow.ref if j.flow else "" for j in leaves}
    assert len(refs) == 3
    assert all(r and r.startswith("leaf#") for r in refs)


async def test_a_job_in_no_workflow_spawns_a_new_one(services: ServiceFactory) -> None:
    seen: Seen = {}
    rt = services(kinds=_kinds(seen), workers=2)
    await rt.start()
    [fan], _ = await rt.submit([JobSpec(kind="fan", args={"n": 2})])
    done = await final(rt, fan.id, 60)
    assert (done.state, done.flow) == (State.COMPLETED, None)
    leaves = [j for j in await rt.store.list_jobs(JobQuery()) if j.kind != "fan"]
    assert len(leaves) == 3
    workflows = {j.flow.workflow_id for j in leaves if j.flow}
    assert len(workflows) == 1
    members = await _members(rt, workflows.pop())
    assert {j.state for j in members} == {State.COMPLETED}
    assert sorted(j.flow.parents == () for j in members if j.flow) == [False, True, True]


@pytest.mark.parametrize(
    ("jobs", "why"),
    [
        ([{"kind": "nope"}], "spawn[0].kind"),
        ([{"kind": "leaf", "args": {"n": "x"}}], "spawn[0].args.n"),
        (
            [
                {"kind": "leaf", "ref": "a", "depends_on": ["b"]},
                {"kind": "leaf", "ref": "b", "depends_on": ["a"]},
            ],
            "cycle",
        ),
        ([{"kind": "leaf", "ref": "fan"}], "spawn[0].ref"),  # its workflow has that ref
        ([{"kind": "leaf", "surprise": 1}], "spawn[0]: Object contains unknown field `surprise`"),
        ([], "spawn"),
    ],
)
async def test_a_spawn_the_server_refuses_fails_the_attempt_and_stores_nothing(
    services: ServiceFactory, jobs: list[Any], why: str
) -> None:
    """A spawn that can never pass is final: dead after its one attempt, not retried."""
    rt = services(kinds=_kinds({}), workers=2)
    await rt.start()
    spec = MemberSpec(kind="fan", ref="fan", args={"jobs": jobs}, max_attempts=3)
    [fan], _ = await rt.submit([spec], batch=True, workflow=True)
    done = await final(rt, fan.id, 60)
    assert (done.state, done.attempts) == (State.DEAD, 1)
    error = done.errors[-1].error
    assert error.startswith("spawn refused: "), error
    assert why in error, error
    assert fan.flow is not None
    assert [j.id for j in await rt.store.workflow(fan.flow.workflow_id)] == [fan.id]
    assert rt.stats()["spawns_refused"] == 1


def test_spawn_takes_a_step_steps_or_a_graph_and_makes_its_own_refs_unique() -> None:
    @task(registry=Registry())
    def one(n: int) -> int:
        return n

    single = sqlq.spawn(one.s(n=1))
    assert [j["kind"] for j in single.jobs] == ["one"]
    several = sqlq.spawn([one.s(n=1), one.s(n=2)], result={"k": 1})
    assert (several.result, len(several.jobs)) == ({"k": 1}, 2)
    graph = sqlq.chain(one.s(n=1), one.s(n=2))
    first, second = sqlq.spawn(graph).jobs, sqlq.spawn(graph).jobs
    assert first[1]["depends_on"] == [first[0]["ref"]]
    assert first[0]["ref"] != second[0]["ref"]  # made up: unique per spawn
    wf = sqlq.workflow()
    a = wf.add(one.s(n=1), ref="a")
    wf.add(one.s(n=2), after=[a])
    named = sqlq.spawn(wf).jobs
    assert (named[0]["ref"], named[1]["depends_on"]) == ("a", ["a"])  # given: kept
    with pytest.raises(ValueError, match="needs a step"):
        sqlq.spawn([])


async def test_a_spawn_of_no_list_fails_in_the_handler_and_the_worker_runs_on(
    services: ServiceFactory,
) -> None:
    kinds = Registry()

    @task(registry=kinds)
    async def broken() -> sqlq.Spawn:
        return sqlq.Spawn(jobs=None)  # type: ignore[arg-type]

    @task(registry=kinds)
    async def fine() -> int:
        return 1

    rt = services(kinds=kinds, workers=1)
    await rt.start()
    [bad], _ = await rt.submit([JobSpec(kind="broken", max_attempts=1)])
    failed = await final(rt, bad.id, 60)
    assert failed.state is State.DEAD
    assert "takes a list of jobs" in failed.errors[-1].error
    [good], _ = await rt.submit([JobSpec(kind="fine")])
    assert (await final(rt, good.id, 60)).result == 1  # the one worker lives on
