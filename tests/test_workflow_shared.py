"""Workflows on PostgreSQL shared by many nodes: a child is released in its last parent's
outcome transaction, once, however the parents' outcomes race across nodes.

On a real PostgreSQL 15. The race is run many times: the last two parents of a fan-in,
each held by another node, completed at the same instant (``gather``); the child's row
lock serializes the two cascades, so exactly one of them releases it. Then whole nodes:
two services on one database run fan-ins and a diamond, each child exactly once.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any

import asyncpg
import pytest

from sqlq.common.errors import IllegalTransitionError
from sqlq.common.models import Job, State
from sqlq.common.specs import MemberSpec
from sqlq.common.store import Cascaded, Fence
from sqlq.common.workflow import Flow
from sqlq.engines.postgres.store import PostgresStore
from sqlq.runtime.kinds import JobContext, Registry, task
from sqlq.runtime.spawn import Spawn
from tests import shared_helpers
from tests.helpers import NOW, final, finals, wait_for
from tests.shared_helpers import Node

nodes = shared_helpers.nodes  # the fixtures, by their names
stores = shared_helpers.stores


def _fan_in(parents: int) -> list[Job]:
    """``parents`` roots, then one child after all of them (in the order a submit makes)."""
    workflow = f"{0:032x}"
    roots = [Job.new(kind="sleep", args={"n": i}, now=NOW, flow=Flow(workflow_id=workflow))
             for i in range(parents)]  # fmt: skip
    flow = Flow(workflow_id=workflow, parents=tuple(r.id for r in roots), deps_pending=parents)
    return [*roots, Job.new(kind="sleep", args={}, now=NOW, flow=flow)]


async def _done(node: PostgresStore, held: Job, at: float) -> None:
    """``held`` completed by the node that holds it, fenced as an outcome is."""
    await node.commit_fenced([held.complete(at, at)], Fence(holder=node.node, lease_from=at))


async def test_the_last_two_parents_completed_on_two_nodes_at_once_release_the_child_once(
    stores: Any,
) -> None:
    a, b = await stores(), await stores()
    released: list[str] = []

    def told(moves: Sequence[Cascaded]) -> None:
        released.extend(m.after.id for m in moves if m.after.state is State.SCHEDULED)

    a.observe_cascade(told)
    b.observe_cascade(told)
    for round_ in range(25):
        *parents, child = _fan_in(2)
        await a.commit([*parents, child])
        [held_a] = await a.claim(1, NOW, NOW + 60, {}, only=None)
        [held_b] = await b.claim(1, NOW, NOW + 60, {})
        assert {held_a.id, held_b.id} == {p.id for p in parents}, round_
        await asyncio.gather(_done(a, held_a, NOW + 1), _done(b, held_b, NOW + 1))
        got = await a.get(child.id)
        assert got is not None
        assert got.flow is not None
        assert (got.state, got.flow.deps_pending, got.epoch) == (State.SCHEDULED, 0, 0), round_
        assert released.count(child.id) == 1, round_
        [again] = await a.claim(1, NOW + 2, NOW + 60, {})  # claimable, and only once
        assert again.id == child.id
        assert await b.claim(1, NOW + 2, NOW + 60, {}) == []
        await a.commit_fenced(
            [again.complete(0, NOW + 3)], Fence(holder=a.node, lease_from=NOW + 3)
        )


def _counting(started: Counter[str]) -> Registry:
    reg = Registry()

    @task("step", registry=reg)
    async def step(args: dict[str, Any], ctx: JobContext) -> str:
        started[args["name"]] += 1
        await asyncio.sleep(0)
        if args.get("fail") and started[args["name"]] == 1:  # (its first attempt only)
            raise RuntimeError("first try")
        return str(args["name"])

    return reg


def _spec(name: str, *after: str, **more: Any) -> MemberSpec:
    return MemberSpec(kind="step", args={"name": name}, ref=name, depends_on=after, **more)


async def test_two_nodes_run_fan_ins_and_each_child_runs_once(nodes: Node) -> None:
    started: Counter[str] = Counter()
    one = nodes(kinds_=_counting(started), workers=4)
    two = nodes(kinds_=_counting(started), workers=4)
    await one.start()
    await two.start()
    for round_ in range(5):
        parents = [f"r{round_}p{i}" for i in range(20)]
        child = f"r{round_}child"
        specs = [*(_spec(p) for p in parents), _spec(child, *parents)]
        jobs, _ = await one.submit(specs, batch=True, workflow=True)
        done = await finals(two, jobs, 120)
        assert {j.state for j in done.values()} == {State.COMPLETED}
        assert started[child] == 1
        last = done[child]
        assert last.started_at is not None
        assert last.started_at >= max(done[p].updated_at for p in parents)
    assert set(started.values()) == {1}


async def test_a_diamond_on_a_node_and_a_dead_root_cancels_its_cone_then_retries(
    nodes: Node,
) -> None:
    started: Counter[str] = Counter()
    rt = nodes(kinds_=_counting(started), workers=4)
    await rt.start()
    diamond = [_spec("a"), _spec("b", "a"), _spec("c", "a"), _spec("d", "b", "c")]
    jobs, _ = await rt.submit(diamond, batch=True, workflow=True)
    done = await finals(rt, jobs, 120)
    assert {ref: j.state for ref, j in done.items()} == dict.fromkeys("abcd", State.COMPLETED)
    assert started == Counter("abcd")
    assert jobs[0].flow is not None
    view = await rt.workflow(jobs[0].flow.workflow_id)
    assert view is not None
    assert (view.state, [m.ref for m in view.jobs]) == ("completed", list("abcd"))
    dying = [MemberSpec(kind="step", args={"name": "x", "fail": True}, ref="a", max_attempts=1),
             *diamond[1:]]  # fmt: skip
    jobs, _ = await rt.submit(dying, batch=True, workflow=True)
    done = await finals(rt, jobs, 120)
    assert done["a"].state is State.DEAD
    for ref in "bcd":
        flow = done[ref].flow
        assert flow is not None
        assert (done[ref].state, flow.cancel_reason) == (State.CANCELLED, "upstream_dead")
    await rt.retry(jobs[0].id)
    done = await finals(rt, jobs, 120)
    assert {ref: j.state for ref, j in done.items()} == dict.fromkeys("abcd", State.COMPLETED)
    assert (started["x"], started["d"]) == (2, 2)  # the root twice; d once in this graph


async def test_spawns_on_two_nodes_land_in_their_completions_commits(nodes: Node) -> None:
    """``sqlq.spawn`` on PostgreSQL: each of 20 fanning members, run on either node,
    spawns a chord of 5 into a sum, stored with its completion (fenced on its node's
    lease) and run across both nodes, each spawned job once."""
    started: Counter[str] = Counter()
    reg = _counting(started)

    @task("fan", registry=reg)
    async def fan(args: dict[str, Any], ctx: JobContext) -> Spawn:
        name = args["name"]
        started[name] += 1
        steps = [{"kind": "step", "args": {"name": f"{name}.{i}"}, "ref": f"{name}.{i}"}
                 for i in range(5)]  # fmt: skip
        total = {"kind": "step", "args": {"name": f"{name}.sum"}, "ref": f"{name}.sum",
                 "depends_on": [s["ref"] for s in steps]}  # fmt: skip
        return Spawn(jobs=[*steps, total], result=name)

    one, two = nodes(kinds_=reg, workers=4), nodes(kinds_=reg, workers=4)
    await one.start()
    await two.start()
    specs = [MemberSpec(kind="fan", args={"name": f"f{i}"}, ref=f"f{i}") for i in range(20)]
    jobs, _ = await one.submit(specs, batch=True, workflow=True)
    await finals(two, jobs, 120)
    assert jobs[0].flow is not None
    members = await one.store.workflow(jobs[0].flow.workflow_id)
    assert len(members) == 20 * (1 + 5 + 1)
    done = [await final(two, j.id, 120) for j in members]
    assert {j.state for j in done} == {State.COMPLETED}
    assert (set(started.values()), len(started)) == ({1}, 20 * 7)
    by_ref = {j.flow.ref: j for j in done if j.flow}
    for i in range(20):
        total = by_ref[f"f{i}.sum"]
        assert total.started_at is not None
        assert total.started_at >= max(by_ref[f"f{i}.{k}"].updated_at for k in range(5))
        first = by_ref[f"f{i}.0"].flow
        assert first is not None
        assert first.parents == (by_ref[f"f{i}"].id,)


@pytest.mark.parametrize("parents", [1000])
async def test_a_fan_in_of_a_thousand_over_two_nodes_hands_the_child_every_result(
    nodes: Node, parents: int
) -> None:
    seen: dict[str, Any] = {}
    reg = _counting(Counter())

    @task("merge", registry=reg)
    async def merge(args: dict[str, Any], ctx: JobContext) -> int:
        seen.update({ref: p.result for ref, p in ctx.parents.items()})
        return len(ctx.parents)

    one, two = nodes(kinds_=reg, workers=8), nodes(kinds_=reg, workers=8)
    await one.start()
    await two.start()
    names = [f"p{i}" for i in range(parents)]
    specs = [*(_spec(p) for p in names), MemberSpec(kind="merge", ref="m", depends_on=tuple(names))]
    jobs, _ = await one.submit(specs, batch=True, workflow=True)
    last = await final(two, jobs[-1].id, 300)
    assert (last.state, last.result) == (State.COMPLETED, parents)
    assert seen == {p: p for p in names}


async def test_cancelling_a_waiting_member_on_a_node_cancels_its_cone(nodes: Node) -> None:
    gate = asyncio.Event()
    reg = Registry()

    @task("held", registry=reg)
    async def held(args: dict[str, Any], ctx: JobContext) -> None:
        await gate.wait()

    rt = nodes(kinds_=reg, workers=2)
    await rt.start()
    specs = [MemberSpec(kind="held", ref="a"), MemberSpec(kind="held", ref="b", depends_on=("a",)),
             MemberSpec(kind="held", ref="c", depends_on=("b",))]  # fmt: skip
    (a, b, c), _ = await rt.submit(specs, batch=True, workflow=True)
    cancelled = await rt.cancel(b.id)
    assert cancelled.state is State.CANCELLED
    gate.set()
    assert (await final(rt, a.id, 60)).state is State.COMPLETED
    b_now, c_now = await final(rt, b.id, 60), await final(rt, c.id, 60)
    assert b_now.flow is not None
    assert c_now.flow is not None
    assert (b_now.state, b_now.flow.cancel_reason) == (State.CANCELLED, "user")
    assert (c_now.state, c_now.flow.cancel_reason) == (State.CANCELLED, "upstream_cancelled")


def _child(parent: Job, round_: int, pending: int) -> Job:
    """The appended child of ``parent``, counted as ``pending``, with an id of its own."""
    assert parent.flow is not None
    flow = Flow(workflow_id=parent.flow.workflow_id, parents=(parent.id,), deps_pending=pending)
    return Job.new(kind="sleep", args={}, now=NOW, flow=flow, job_id=f"{round_:031x}c")


async def test_an_append_racing_its_parents_completion_is_counted_once(stores: Any) -> None:
    """Node a completes p while node b appends c after p, counted from a read made while p
    ran (pending 1), each sent first in turn. Whichever commits first, c is released once:
    after the append, by p's end; or, p first, the append is refused and counted again
    (pending 0: due at once). (Here the completion, whose first statement locks p, has won
    every run measured; the append taking p first is the contract suite's sequential case,
    and its FOR SHARE then holds the completion until the edge is there to be found.)"""
    a, b = await stores(), await stores()
    released: list[str] = []
    a.observe_cascade(lambda moves: released.extend(m.after.id for m in moves))
    orders: Counter[str] = Counter()
    for round_ in range(25):
        p = Job.new(kind="sleep", args={}, now=NOW, flow=Flow(workflow_id=f"{round_:032x}"))
        await a.commit([p])
        [held] = await a.claim(1, NOW, NOW + 60, {})
        sides = [_done(a, held, NOW + 1), b.commit([_child(p, round_, 1)])]
        if round_ % 2:  # each side sent first in turn
            sides.reverse()
        ends: list[BaseException | None] = await asyncio.gather(*sides, return_exceptions=True)
        done, appended = ends if round_ % 2 == 0 else ends[::-1]
        assert done is None
        if isinstance(appended, IllegalTransitionError):
            orders["completed first"] += 1
            await b.commit([_child(p, round_, 0)])  # counted again, as the runtime does
        else:
            assert appended is None
            orders["appended first"] += 1
        got = await b.get(f"{round_:031x}c")
        assert got is not None
        assert got.flow is not None
        assert (got.state, got.flow.deps_pending) == (State.SCHEDULED, 0), round_
        assert released.count(got.id) == (1 if appended is None else 0), round_
        [c] = await b.claim(1, NOW + 2, NOW + 60, {})
        await _done(b, c, NOW + 3)
    assert sum(orders.values()) == 25, orders


async def test_two_cones_cancelled_on_two_nodes_at_once_do_not_deadlock(stores: Any) -> None:
    """P and Q die on two nodes; their cones share B and A, which each would lock in an
    order of its own (P: A, then Z's B; Q: B, then A). A third connection holds Z until
    both wait, so they overlap: one workflow's writes take turns (``lock_workflows``), and
    both commit, with no deadlock for PostgreSQL to break."""
    one, two = await stores(), await stores()

    def member(ref: str, job_id: str, *parents: str) -> Job:
        flow = Flow(workflow_id="e" * 32, ref=ref, parents=parents, deps_pending=len(parents))
        return Job.new(kind="sleep", args={}, now=NOW, flow=flow, max_attempts=1, job_id=job_id)

    p, q = member("P", "f" * 32), member("Q", "e" * 32)
    z = member("Z", "2" * 32, p.id)
    b = member("B", "3" * 32, z.id, q.id)
    a = member("A", "1" * 32, p.id, b.id)
    await one.commit([p, q, z, b, a])
    [first_held] = await one.claim(1, NOW, NOW + 60, {})
    [second_held] = await two.claim(1, NOW, NOW + 60, {})
    held = {first_held.id: first_held, second_held.id: second_held}
    held_p, held_q = held[p.id], held[q.id]
    blocker = await asyncpg.connect(one.dsn)
    watcher = await asyncpg.connect(one.dsn)

    async def waiting() -> int:
        sql = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        return int(await watcher.fetchval(sql))

    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", z.id)
        first = asyncio.ensure_future(one.commit([held_p.bury("boom", NOW + 2)]))
        await wait_for(lambda: waiting_at_least(waiting, 1), what="the first cascade waits")
        second = asyncio.ensure_future(two.commit([held_q.bury("boom", NOW + 2)]))
        await wait_for(lambda: waiting_at_least(waiting, 2), what="both wait")
        await tx.rollback()
        ends = await asyncio.gather(first, second, return_exceptions=True)
        assert list(ends) == [None, None]
    finally:
        await blocker.close()
        await watcher.close()
    for job in (z, b, a):
        got = await one.get(job.id)
        assert got is not None
        assert got.state is State.CANCELLED, job.flow


async def waiting_at_least(count: Any, n: int) -> bool:
    return bool(await count() >= n)
