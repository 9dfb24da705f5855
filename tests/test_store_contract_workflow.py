"""The JobStore contract for workflows: a parent's end moves its waiting children in its own
commit, once, by each child's policy, and a reopen finds exactly what was committed.

Over every engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import msgspec
import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.errors import IllegalTransitionError
from sqlq.common.models import Job, State, Transition, new_job_id
from sqlq.common.schedule import PutSchedule
from sqlq.common.store import Cascaded, JobStore
from sqlq.common.workflow import CancelReason, Flow, OnParentFailure, RunIf
from tests.conftest import _factory
from tests.helpers import NOW, StoreFactory
from tests.schedule_records import record
from tests.store_contract_helpers import assert_reopened_holds

WORKFLOW_ENGINES = ("memory", "walq", "sqlite", "postgres")


@pytest.fixture(params=WORKFLOW_ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """The engines that store a flow: conftest's ``factory`` and ``store`` run over these."""
    return str(request.param)


class Graph:
    """Jobs made as a workflow's submission makes them, by ref."""

    def __init__(self) -> None:
        self.workflow_id = new_job_id(NOW)
        self.jobs: dict[str, Job] = {}

    def add(
        self,
        ref: str,
        after: Sequence[str] = (),
        on_parent_failure: OnParentFailure = OnParentFailure.CANCEL,
        run_if: RunIf = RunIf.ALL_COMPLETED,
        max_attempts: int = 3,
    ) -> Job:
        flow = Flow(
            workflow_id=self.workflow_id, ref=ref,
            parents=tuple(self.jobs[p].id for p in after), deps_pending=len(after),
            on_parent_failure=on_parent_failure, run_if=run_if,
        )  # fmt: skip
        job = Job.new(kind="sleep", args={}, now=NOW, flow=flow, max_attempts=max_attempts)
        self.jobs[ref] = job
        return job


def diamond(**policy: object) -> Graph:
    g = Graph()
    g.add("a")
    g.add("b", ["a"])
    g.add("c", ["a"])
    g.add("d", ["b", "c"], **policy)  # type: ignore[arg-type]
    return g


async def _submitted(store: JobStore, g: Graph) -> Graph:
    """``g``'s jobs committed as one submission."""
    await store.commit(list(g.jobs.values()))
    return g


def fan_in() -> Graph:
    """a and b, then c after both."""
    g = Graph()
    g.add("a")
    g.add("b")
    g.add("c", ["a", "b"])
    return g


class Seen:
    """What the store told of its cascades."""

    def __init__(self, store: JobStore) -> None:
        self.moves: list[Transition] = []
        self.jobs: list[tuple[Job, Job]] = []
        store.observe_cascade(self._told)

    def _told(self, moves: Sequence[Cascaded]) -> None:
        for before, after, change, _ in moves:
            assert before.apply(change) == after
            self.moves.append(change)
            self.jobs.append((before, after))


async def _get(store: JobStore, job: Job) -> Job:
    got = await store.get(job.id)
    assert got is not None
    return got


async def _flow(store: JobStore, job: Job) -> Flow:
    """``job``'s flow as stored (a member has one)."""
    flow = (await _get(store, job)).flow
    assert flow is not None
    return flow


async def _run(store: JobStore, job: Job, at: float) -> Job:
    """Start ``job`` (as stored) at ``at``; the running job."""
    job = await _get(store, job)
    t = job.start(at)
    await store.commit([t])
    return job.apply(t)


async def _complete(store: JobStore, job: Job, at: float) -> Transition:
    running = await _run(store, job, at)
    t = running.complete({"ref": running.flow and running.flow.ref}, at + 1)
    await store.commit([t])
    return t


async def _die(store: JobStore, job: Job, at: float) -> None:
    running = await _run(store, job, at)
    await store.commit([running.bury("boom", at + 1)])


async def _states(store: JobStore, g: Graph) -> dict[str, str]:
    return {ref: (await _get(store, job)).state.value for ref, job in g.jobs.items()}


async def test_a_diamond_releases_each_child_in_its_last_parents_commit(
    store: JobStore,
) -> None:
    seen = Seen(store)
    g = await _submitted(store, diamond())
    assert await _states(store, g) == {
        "a": "scheduled", "b": "waiting", "c": "waiting", "d": "waiting"
    }  # fmt: skip
    await _complete(store, g.jobs["a"], NOW + 1)
    assert await _states(store, g) == {
        "a": "completed", "b": "scheduled", "c": "scheduled", "d": "waiting"
    }  # fmt: skip
    assert sorted(t.job_id for t in seen.moves) == sorted([g.jobs["b"].id, g.jobs["c"].id])
    assert all(t.state is State.SCHEDULED for t in seen.moves)
    released = await _get(store, g.jobs["b"])
    assert released.ready_at == NOW + 2  # due at the parent's commit, not at its submission
    await _complete(store, g.jobs["b"], NOW + 3)
    d = await _get(store, g.jobs["d"])
    assert (d.state, d.flow and d.flow.deps_pending) == (State.WAITING, 1)
    await _complete(store, g.jobs["c"], NOW + 5)
    d = await _get(store, g.jobs["d"])
    assert (d.state, d.flow and d.flow.deps_pending) == (State.SCHEDULED, 0)
    assert [t.job_id for t in seen.moves].count(g.jobs["d"].id) == 2


async def test_a_second_completion_of_the_same_attempt_is_refused_and_releases_nothing(
    store: JobStore,
) -> None:
    g = fan_in()
    await _submitted(store, g)
    done = await _complete(store, g.jobs["a"], NOW + 1)
    seen = Seen(store)
    with pytest.raises(IllegalTransitionError):
        await store.commit([done])
    c = await _get(store, g.jobs["c"])
    assert (c.state, c.flow and c.flow.deps_pending) == (State.WAITING, 1)
    assert seen.moves == []


async def test_a_dead_parent_cancels_its_whole_cone_as_upstream_dead(
    store: JobStore,
) -> None:
    g = await _submitted(store, diamond())
    await _die(store, g.jobs["a"], NOW + 1)
    assert await _states(store, g) == {
        "a": "dead", "b": "cancelled", "c": "cancelled", "d": "cancelled"
    }  # fmt: skip
    for ref in "bcd":
        flow = await _flow(store, g.jobs[ref])
        assert flow.cancel_reason is CancelReason.UPSTREAM_DEAD


async def test_a_dead_roots_wide_cone_moves_in_its_commit_each_child_once(
    store: JobStore,
) -> None:
    """A root with 1,500 children (more than one set-wise statement or read holds), one of
    which runs after a failed parent, one with a child of its own, one after two of them,
    and one, run after failed parents, after two of them and a job outside the cone: its
    death moves each once for each parent that ended, in its commit, by its policy, and
    down the cone; its retry brings the cone back the same way, each counting afresh."""
    seen = Seen(store)
    g = Graph()
    g.add("root", max_attempts=1)
    g.add("alive")
    wide = [f"k{i}" for i in range(1500)]
    for ref in wide:
        g.add(ref, ["root"], on_parent_failure=OnParentFailure.RUN if ref == "k7" else
              OnParentFailure.CANCEL)  # fmt: skip
    g.add("grandchild", ["k3"])
    g.add("both", ["k5", "k1400"])
    g.add("runs", ["k5", "k1400", "alive"], on_parent_failure=OnParentFailure.RUN)
    await _submitted(store, g)
    await _die(store, g.jobs["root"], NOW + 1)
    states = await _states(store, g)
    assert (states.pop("root"), states.pop("alive")) == ("dead", "scheduled")
    assert states.pop("k7") == "scheduled"  # it runs after a failed parent
    assert states.pop("runs") == "waiting"  # for alive, its two failed parents counted once
    assert set(states.values()) == {"cancelled"}
    for ref in ("k0", "k1499", "grandchild", "both"):
        flow = await _flow(store, g.jobs[ref])
        assert flow.cancel_reason is CancelReason.UPSTREAM_DEAD, ref
    k7, runs = await _flow(store, g.jobs["k7"]), await _flow(store, g.jobs["runs"])
    assert (k7.deps_pending, k7.failed) == (0, 1)
    assert (runs.deps_pending, runs.failed) == (1, 2)
    moved = [t.job_id for t in seen.moves]
    once = [j.id for ref, j in g.jobs.items() if ref not in ("root", "alive", "runs")]
    assert sorted(moved) == sorted([*once, g.jobs["runs"].id, g.jobs["runs"].id])
    assert moved.index(g.jobs["grandchild"].id) > moved.index(g.jobs["k3"].id)
    # Its retry revives the cone (a depth at a time, each counting its parents afresh)
    del seen.moves[:]
    await store.commit([(await _get(store, g.jobs["root"])).revive(NOW + 3)])
    states = await _states(store, g)
    assert (states.pop("root"), states.pop("alive"), states.pop("k7")) == ("scheduled",) * 3
    assert set(states.values()) == {"waiting"}
    for ref, pending in (("k0", 1), ("grandchild", 1), ("both", 2), ("runs", 3)):
        flow = await _flow(store, g.jobs[ref])
        assert (flow.deps_pending, flow.failed, flow.cancel_reason) == (pending, 0, None), ref
    revived = [t.job_id for t in seen.moves]
    assert len(set(revived)) == len(g.jobs) - 3  # all but root, alive and k7
    # each once, but runs: unsettled by each of its two parents brought back
    assert (revived.count(g.jobs["runs"].id), len(revived)) == (2, len(g.jobs) - 2)


async def test_a_child_of_two_parents_cancelled_at_one_depth_moves_twice_in_order(
    store: JobStore,
) -> None:
    """root -> p1, p2 -> c, c running after failed parents: the root's death cancels p1 and
    p2 at one depth, and c is met under each (its two moves written together, in order):
    counted down, then released, with both failures counted."""
    seen = Seen(store)
    g = Graph()
    g.add("root", max_attempts=1)
    g.add("p1", ["root"])
    g.add("p2", ["root"])
    g.add("c", ["p1", "p2"], on_parent_failure=OnParentFailure.RUN)
    await _submitted(store, g)
    await _die(store, g.jobs["root"], NOW + 1)
    assert await _states(store, g) == {
        "root": "dead", "p1": "cancelled", "p2": "cancelled", "c": "scheduled"
    }  # fmt: skip
    c = await _flow(store, g.jobs["c"])
    assert (c.deps_pending, c.failed, c.cancel_reason) == (0, 2, None)
    moves = [t for t in seen.moves if t.job_id == g.jobs["c"].id]
    assert [t.state for t in moves] == [State.WAITING, State.SCHEDULED]


async def test_a_cancelled_member_cancels_its_cone_as_upstream_cancelled(
    store: JobStore,
) -> None:
    g = await _submitted(store, diamond())
    b = await _get(store, g.jobs["b"])
    await store.commit([b.cancel(NOW + 1)])
    assert await _states(store, g) == {
        "a": "scheduled", "b": "cancelled", "c": "waiting", "d": "cancelled"
    }  # fmt: skip
    reasons = {ref: (await _get(store, g.jobs[ref])).flow for ref in "bd"}
    assert reasons["b"] is not None
    assert reasons["b"].cancel_reason is CancelReason.USER
    assert reasons["d"] is not None
    assert reasons["d"].cancel_reason is CancelReason.UPSTREAM_CANCELLED


async def test_wait_holds_the_child_until_its_parent_is_retried_and_completes(
    store: JobStore,
) -> None:
    g = Graph()
    g.add("a")
    g.add("b", ["a"], on_parent_failure=OnParentFailure.WAIT)
    await _submitted(store, g)
    await _die(store, g.jobs["a"], NOW + 1)
    b = await _get(store, g.jobs["b"])
    assert (b.state, b.flow and b.flow.deps_pending) == (State.WAITING, 1)
    dead = await _get(store, g.jobs["a"])
    await store.commit([dead.revive(NOW + 3)])
    assert (await _get(store, g.jobs["b"])).state is State.WAITING
    await _complete(store, g.jobs["a"], NOW + 4)
    assert (await _get(store, g.jobs["b"])).state is State.SCHEDULED


async def test_run_and_all_finished_count_a_failed_parent_as_settled(
    store: JobStore,
) -> None:
    g = Graph()
    g.add("a")
    g.add("b")
    g.add("runs", ["a"], on_parent_failure=OnParentFailure.RUN)
    g.add("finally", ["a", "b"], run_if=RunIf.ALL_FINISHED)
    g.add("on_failure", ["a", "b"], run_if=RunIf.ANY_FAILED)
    g.add("on_success", ["b"], run_if=RunIf.ANY_FAILED)
    await _submitted(store, g)
    await _die(store, g.jobs["a"], NOW + 1)
    await _complete(store, g.jobs["b"], NOW + 3)
    states = await _states(store, g)
    assert states == {
        "a": "dead", "b": "completed", "runs": "scheduled", "finally": "scheduled",
        "on_failure": "scheduled", "on_success": "cancelled",
    }  # fmt: skip
    runs = await _flow(store, g.jobs["runs"])
    assert runs.failed == 1
    cond = await _flow(store, g.jobs["on_success"])
    assert cond.cancel_reason is CancelReason.CONDITION_FALSE


async def test_a_revived_parent_unsettles_the_children_its_failure_settled(
    store: JobStore,
) -> None:
    g = Graph()
    g.add("a")
    g.add("b")
    g.add("finally", ["a", "b"], run_if=RunIf.ALL_FINISHED)
    await _submitted(store, g)
    await _die(store, g.jobs["a"], NOW + 1)
    fin = await _flow(store, g.jobs["finally"])
    assert (fin.deps_pending, fin.failed) == (1, 1)
    await store.commit([(await _get(store, g.jobs["a"])).revive(NOW + 3)])
    fin = await _flow(store, g.jobs["finally"])
    assert (fin.deps_pending, fin.failed) == (2, 0)
    await _complete(store, g.jobs["a"], NOW + 4)
    await _complete(store, g.jobs["b"], NOW + 6)
    done = await _get(store, g.jobs["finally"])
    assert done.state is State.SCHEDULED
    assert done.flow is not None
    assert done.flow.failed == 0


@pytest.mark.parametrize("durable", ["walq", "sqlite"])
async def test_the_cascade_is_in_the_parents_commit_and_survives_a_reopen(
    tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest, durable: str
) -> None:
    """The children's moves are durable with the parent's (walq: in its own record, which
    recovery folds as written, deriving nothing; SQLite: in its transaction), so a reopen
    finds the same jobs, the waiting one with its flow and parents whole."""
    factory = _factory(durable, tmp_path, clock, request)
    store = factory()
    await store.open()
    g = await _submitted(store, diamond())
    await _complete(store, g.jobs["a"], NOW + 1)
    await _complete(store, g.jobs["b"], NOW + 3)
    expect = {job.id: await _get(store, job) for job in g.jobs.values()}
    submitted = g.jobs["d"].flow
    assert submitted is not None
    assert expect[g.jobs["d"].id].flow == msgspec.structs.replace(submitted, deps_pending=1)
    await store.close()
    reopened = factory()
    recovery = await reopened.open()
    live = {job.id: job for job in recovery.jobs}
    assert live[g.jobs["d"].id] == expect[g.jobs["d"].id]  # waiting: in the live view
    await reopened.close()
    await assert_reopened_holds(factory(), expect)
    if durable == "walq":
        log = b"".join(p.read_bytes() for p in sorted(tmp_path.rglob("*.log")))
        assert log.count(g.jobs["b"].id.encode()) >= 3  # put, released in a's record, ...


async def test_a_refused_caller_in_a_members_batch_moves_nothing_and_the_others_commit(
    store: JobStore,
) -> None:
    """Two callers in one batch: a's completion releases b and c; a stale completion of
    the same attempt is refused alone, and its cascade (none) with it."""
    seen = Seen(store)
    g = await _submitted(store, diamond())
    running = await _run(store, g.jobs["a"], NOW + 1)
    done = running.complete(None, NOW + 2)
    stale = running.complete(None, NOW + 3)
    first, second = store.commit([done]), store.commit([stale])
    await first
    with pytest.raises(IllegalTransitionError):
        await second
    assert await _states(store, g) == {
        "a": "completed", "b": "scheduled", "c": "scheduled", "d": "waiting"
    }  # fmt: skip
    assert sorted(m.job_id for m in seen.moves) == sorted(g.jobs[r].id for r in "bc")


async def test_retrying_a_dead_root_revives_its_cancelled_cone_and_the_graph_completes(
    store: JobStore,
) -> None:
    seen = Seen(store)
    g = await _submitted(store, diamond())
    await _die(store, g.jobs["a"], NOW + 1)
    await store.commit([(await _get(store, g.jobs["a"])).revive(NOW + 3)])
    assert await _states(store, g) == {
        "a": "scheduled", "b": "waiting", "c": "waiting", "d": "waiting"
    }  # fmt: skip
    for ref, pending in (("b", 1), ("c", 1), ("d", 2)):
        job = await _get(store, g.jobs[ref])
        assert job.flow is not None
        assert (job.flow.deps_pending, job.flow.cancel_reason) == (pending, None)
        assert job.epoch == 1  # a new epoch: whatever held the cancelled one is fenced
    revived = [after.id for before, after in seen.jobs if before.state is State.CANCELLED]
    assert sorted(revived) == sorted(g.jobs[r].id for r in "bcd")
    for ref in "abcd":
        await _complete(store, g.jobs[ref], NOW + 10 + ord(ref))
    assert await _states(store, g) == dict.fromkeys("abcd", "completed")


async def test_a_revival_leaves_what_a_user_cancelled_and_what_it_cannot_run_after(
    store: JobStore,
) -> None:
    g = await _submitted(store, diamond())
    await store.commit([(await _get(store, g.jobs["b"])).cancel(NOW + 1)])  # d: upstream
    await _die(store, g.jobs["a"], NOW + 2)  # c: upstream_dead
    await store.commit([(await _get(store, g.jobs["a"])).revive(NOW + 4)])
    assert await _states(store, g) == {
        "a": "scheduled", "b": "cancelled", "c": "waiting", "d": "cancelled"
    }  # fmt: skip
    b = await _get(store, g.jobs["b"])
    assert b.flow is not None
    assert b.flow.cancel_reason is CancelReason.USER


async def test_a_member_retried_on_its_own_is_refused_until_its_parents_completed(
    store: JobStore,
) -> None:
    """Its parent is dead: the retry names that parent (which revives this one itself)."""
    g = await _submitted(store, diamond())
    await _die(store, g.jobs["a"], NOW + 1)
    d = await _get(store, g.jobs["d"])
    with pytest.raises(IllegalTransitionError, match=f"its parent {g.jobs['b'].id} is cancelled"):
        await store.commit([d.revive(NOW + 2)])
    assert (await _get(store, g.jobs["d"])).state is State.CANCELLED


async def test_a_fan_in_writes_each_decrement_without_the_parents(
    tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> None:
    """A decrement's record carries the child's counts, never its 1,000 parents' ids."""
    factory = _factory("walq", tmp_path, clock, request)
    store = factory()
    await store.open()
    g = Graph()
    parents = [f"p{i}" for i in range(1000)]
    for p in parents:
        g.add(p)
    g.add("child", parents)
    await _submitted(store, g)
    log = next(iter(sorted(tmp_path.rglob("*.log"))))
    before = log.stat().st_size
    await _complete(store, g.jobs["p0"], NOW + 1)
    grew = log.stat().st_size - before
    assert grew < 4096, grew  # the start, the completion and one decrement
    child = await _get(store, g.jobs["child"])
    assert child.flow is not None
    assert (child.flow.deps_pending, len(child.flow.parents)) == (999, 1000)
    await store.close()
    await assert_reopened_holds(factory(), {child.id: child})


async def test_retention_prunes_a_workflow_as_a_unit_never_a_parent_under_a_live_child(
    factory: StoreFactory, clock: FakeClock
) -> None:
    store = factory(retention=10.0)
    await store.open()
    g = fan_in()
    other = Job.new(kind="sleep", args={}, now=NOW)  # outside every workflow
    await store.commit([*g.jobs.values(), other])
    await _complete(store, g.jobs["a"], NOW + 1)
    await store.commit([other.cancel(NOW + 1)])
    clock.advance(NOW + 100 - clock.time())
    await store.compact()
    await store.commit([])  # (walq forgets what expired between batches)
    assert await store.get(other.id) is None  # past retention, alone: pruned
    assert await store.get(g.jobs["a"].id) is not None  # c still waits on b: a stays
    await _complete(store, g.jobs["b"], NOW + 101)
    await _complete(store, g.jobs["c"], NOW + 103)
    clock.advance(NOW + 200 - clock.time())
    await store.compact()
    await store.commit([])
    for job in g.jobs.values():
        assert await store.get(job.id) is None, job.flow
    await store.close()


async def test_recovery_keeps_a_finished_parent_while_its_workflow_lives(
    tmp_path: Path, clock: FakeClock, request: pytest.FixtureRequest
) -> None:
    factory = _factory("walq", tmp_path, clock, request)
    store = factory(retention=10.0)
    await store.open()
    g = fan_in()
    await _submitted(store, g)
    await _complete(store, g.jobs["a"], NOW + 1)
    expect = {job.id: await _get(store, job) for job in g.jobs.values()}
    await store.close()
    clock.advance(NOW + 100 - clock.time())  # a is past retention; its workflow is not
    await assert_reopened_holds(factory(retention=10.0), expect)


async def test_a_member_counted_against_parents_that_moved_since_is_refused(
    store: JobStore,
) -> None:
    """An append joins a workflow counted against its parents as read: a parent that
    completed before the commit makes the count wrong, and the store refuses it (the
    runtime counts again); counted right, it waits or is due at once."""
    g = await _submitted(store, fan_in())
    await _complete(store, g.jobs["a"], NOW + 1)
    a, b = g.jobs["a"].id, g.jobs["b"].id

    def member(pending: int) -> Job:
        flow = Flow(workflow_id=g.workflow_id, ref="late", parents=(a, b), deps_pending=pending)
        return Job.new(kind="sleep", args={}, now=NOW + 2, flow=flow)

    with pytest.raises(IllegalTransitionError, match="moved while it was added"):
        await store.commit([member(2)])  # read before a completed: stale
    late = member(1)
    await store.commit([late])
    assert (await _get(store, late)).state is State.WAITING
    await _complete(store, g.jobs["b"], NOW + 3)  # b's end releases it, as it does c
    assert (await _get(store, late)).state is State.SCHEDULED
    flow = Flow(workflow_id=g.workflow_id, parents=(a, "0" * 32))
    with pytest.raises(IllegalTransitionError, match="is not kept"):
        await store.commit([Job.new(kind="sleep", args={}, now=NOW + 4, flow=flow)])


async def test_a_members_change_beside_a_schedules_in_one_batch_still_cascades(
    store: JobStore,
) -> None:
    """A tick or a put lands in the same group commit as a workflow's submission and its
    parents' outcomes: the flows are stored and the child released all the same."""
    g = fan_in()
    await asyncio.gather(
        store.commit([PutSchedule(schedule=record("s1"), expect_version=0)]),
        store.commit(list(g.jobs.values())),
    )
    c = await _flow(store, g.jobs["c"])
    assert c.parents == (g.jobs["a"].id, g.jobs["b"].id)
    a = await _run(store, g.jobs["a"], NOW + 1)
    b = await _run(store, g.jobs["b"], NOW + 1)
    await asyncio.gather(
        store.commit([PutSchedule(schedule=record("s2"), expect_version=0)]),
        store.commit([a.complete(1, NOW + 2)]),
        store.commit([b.complete(2, NOW + 2)]),
    )
    assert (await _get(store, g.jobs["c"])).state is State.SCHEDULED


async def test_an_append_and_its_parents_end_in_one_batch_release_the_child(
    store: JobStore,
) -> None:
    """The append (counted while a ran) and a's completion reach the store together: the
    completion finds the new child, whichever engine and however the batch is written;
    the other way round, the append is refused (its count is stale) and counted again."""
    g = await _submitted(store, fan_in())
    a = await _run(store, g.jobs["a"], NOW + 1)

    def child(ref: str, pending: int) -> Job:
        flow = Flow(workflow_id=g.workflow_id, ref=ref, parents=(a.id,), deps_pending=pending)
        return Job.new(kind="sleep", args={}, now=NOW + 1, flow=flow)

    first = child("first", 1)
    await asyncio.gather(store.commit([first]), store.commit([a.complete(1, NOW + 2)]))
    assert (await _get(store, first)).state is State.SCHEDULED
    b = await _run(store, g.jobs["b"], NOW + 3)
    late = Job.new(kind="sleep", args={}, now=NOW + 3, flow=Flow(
        workflow_id=g.workflow_id, ref="late", parents=(b.id,), deps_pending=1))  # fmt: skip
    done, appended = await asyncio.gather(
        store.commit([b.complete(2, NOW + 4)]), store.commit([late]), return_exceptions=True
    )
    assert done is None
    if appended is None:  # (an engine that wrote the append first: released by b's end)
        assert (await _get(store, late)).state is State.SCHEDULED
    else:
        assert isinstance(appended, IllegalTransitionError)
        assert "moved while it was added" in str(appended)


async def test_a_completion_and_the_members_it_spawned_are_one_commit(
    store: JobStore,
) -> None:
    """``sqlq.spawn``: the completion first, then its new members counted against it as
    completed (one due at once, one waiting on the other), in one commit; a stale
    completion (fenced) stores none of them, and new members counted against the parent
    as still running are refused as moved."""
    g = await _submitted(store, fan_in())
    a = await _run(store, g.jobs["a"], NOW + 1)

    def spawned(ref: str, parents: tuple[str, ...], pending: int) -> Job:
        flow = Flow(workflow_id=g.workflow_id, ref=ref, parents=parents, deps_pending=pending)
        return Job.new(kind="sleep", args={}, now=NOW + 2, flow=flow)

    x = spawned("x", (a.id,), 0)
    y = spawned("y", (x.id,), 1)
    done = a.complete("fanned", NOW + 2)
    with pytest.raises(IllegalTransitionError, match="moved while it was added"):
        await store.commit([done, spawned("early", (a.id,), 1)])  # counted as running: refused
    assert (await _get(store, g.jobs["a"])).state is State.RUNNING  # ... and none of it
    await store.commit([done, x, y])
    assert [(await _get(store, j)).state for j in (g.jobs["a"], x, y)] == [
        State.COMPLETED, State.SCHEDULED, State.WAITING,
    ]  # fmt: skip
    stale = spawned("stale", (a.id,), 0)
    with pytest.raises(IllegalTransitionError):
        await store.commit([done, stale])  # the same completion again: fenced
    assert await store.get(stale.id) is None
    xr = await _run(store, x, NOW + 3)
    await store.commit([xr.complete(1, NOW + 4)])
    assert (await _get(store, y)).state is State.SCHEDULED  # released in x's commit
