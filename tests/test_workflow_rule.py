"""The pure parts of workflows: a submitted graph's checks, and ``after_parent``'s rule."""

from __future__ import annotations

import pytest

from sqlq.common.workflow import (
    MAX_EDGES,
    MAX_PARENTS,
    CancelReason,
    Ended,
    Flow,
    GraphError,
    OnParentFailure,
    Overall,
    RunIf,
    Verdict,
    after_parent,
    blocked_by,
    overall,
    plan_graph,
    retried,
)


def test_a_diamond_plans_each_jobs_parents() -> None:
    refs = ["a", "b", "c", "d"]
    deps: list[list[str]] = [[], ["a"], ["a"], ["b", "c"]]
    assert plan_graph(refs, deps) == [[], [0], [0], [1, 2]]


def test_jobs_without_refs_may_depend_and_be_free() -> None:
    assert plan_graph([None, "x", None], [[], [], ["x"]]) == [[], [], [1]]


@pytest.mark.parametrize(
    ("refs", "deps", "index", "field", "words"),
    [
        (["a", "a"], [[], []], 1, "ref", "jobs[0] too"),
        (["a", "b"], [[], ["z"]], 1, "depends_on", "'z'"),
        (["a", "b"], [[], ["a", "a"]], 1, "depends_on", "twice"),
        (["a"], [["a"]], 0, "depends_on", "itself"),
        (["a", "b"], [["b"], ["a"]], 0, "depends_on", "cycle"),
    ],
)
def test_a_bad_graph_names_the_job_and_field(
    refs: list[str | None], deps: list[list[str]], index: int, field: str, words: str
) -> None:
    with pytest.raises(GraphError) as caught:
        plan_graph(refs, deps)
    assert (caught.value.index, caught.value.field) == (index, field)
    assert words in str(caught.value)


def test_a_cycle_is_named_at_a_job_on_it_not_one_behind_it() -> None:
    # 0 -> 1 -> 2 -> 1 (a cycle of 1 and 2), and 3 behind it
    refs = ["r0", "r1", "r2", "r3"]
    deps: list[list[str]] = [[], ["r0", "r2"], ["r1"], ["r2"]]
    with pytest.raises(GraphError) as caught:
        plan_graph(refs, deps)
    assert caught.value.index in (1, 2)


def test_a_chain_deeper_than_the_stack_plans() -> None:
    n = 50_000
    refs = [f"j{i}" for i in range(n)]
    deps = [[] if i == 0 else [f"j{i - 1}"] for i in range(n)]
    assert plan_graph(refs, deps)[-1] == [n - 2]


def test_fan_in_and_edges_are_bounded() -> None:
    refs = [f"p{i}" for i in range(MAX_PARENTS + 1)] + ["child"]
    deps: list[list[str]] = [[] for _ in range(MAX_PARENTS + 1)] + [refs[:-1]]
    with pytest.raises(GraphError, match="more than 10000 parents") as caught:
        plan_graph(refs, deps)
    assert caught.value.index == MAX_PARENTS + 1
    fan = MAX_EDGES // MAX_PARENTS + 1  # children of all MAX_PARENTS parents each
    refs = [f"p{i}" for i in range(MAX_PARENTS)] + [f"c{i}" for i in range(fan)]
    deps = [[] for _ in range(MAX_PARENTS)] + [refs[:MAX_PARENTS] for _ in range(fan)]
    with pytest.raises(GraphError, match="edges"):
        plan_graph(refs, deps)


def _flow(pending: int, **policy: object) -> Flow:
    return Flow(workflow_id="w", parents=("p",) * pending, deps_pending=pending, **policy)  # type: ignore[arg-type]


def test_the_last_completed_parent_releases_the_child_and_not_before() -> None:
    flow, verdict = after_parent(_flow(2), Ended.COMPLETED)
    assert (flow.deps_pending, verdict) == (1, Verdict.WAIT)
    flow, verdict = after_parent(flow, Ended.COMPLETED)
    assert (flow.deps_pending, flow.failed, verdict) == (0, 0, Verdict.RELEASE)


@pytest.mark.parametrize(
    ("ended", "reason"),
    [(Ended.DEAD, CancelReason.UPSTREAM_DEAD), (Ended.CANCELLED, CancelReason.UPSTREAM_CANCELLED)],
)
def test_a_failed_parent_cancels_by_default_with_its_reason(
    ended: Ended, reason: CancelReason
) -> None:
    flow, verdict = after_parent(_flow(2), ended)
    assert (verdict, flow.cancel_reason) == (Verdict.CANCEL, reason)


def test_wait_keeps_the_child_waiting_with_nothing_settled() -> None:
    before = _flow(1, on_parent_failure=OnParentFailure.WAIT)
    assert after_parent(before, Ended.DEAD) == (before, Verdict.WAIT)


def test_run_settles_a_failed_parent_and_runs() -> None:
    flow, verdict = after_parent(_flow(1, on_parent_failure=OnParentFailure.RUN), Ended.DEAD)
    assert (flow.deps_pending, flow.failed, verdict) == (0, 1, Verdict.RELEASE)


@pytest.mark.parametrize("policy", list(OnParentFailure))
def test_all_finished_runs_whatever_the_parents_did(policy: OnParentFailure) -> None:
    flow = _flow(2, run_if=RunIf.ALL_FINISHED, on_parent_failure=policy)
    flow, verdict = after_parent(flow, Ended.CANCELLED)
    assert verdict is Verdict.WAIT
    flow, verdict = after_parent(flow, Ended.COMPLETED)
    assert (verdict, flow.failed) == (Verdict.RELEASE, 1)


def test_any_failed_runs_only_if_a_parent_failed() -> None:
    hook = _flow(2, run_if=RunIf.ANY_FAILED)
    flow, _ = after_parent(hook, Ended.COMPLETED)
    flow, verdict = after_parent(flow, Ended.DEAD)
    assert verdict is Verdict.RELEASE
    flow, _ = after_parent(hook, Ended.COMPLETED)
    flow, verdict = after_parent(flow, Ended.COMPLETED)
    assert (verdict, flow.cancel_reason) == (Verdict.CANCEL, CancelReason.CONDITION_FALSE)


def test_overall_reads_stuck_running_and_each_end() -> None:
    parents = {"p": "dead", "q": "completed", "x": "cancelled"}
    wait = Flow(workflow_id="w", parents=("p",), deps_pending=1,
                on_parent_failure=OnParentFailure.WAIT)  # fmt: skip
    settled = Flow(workflow_id="w", parents=("p",), deps_pending=1, run_if=RunIf.ALL_FINISHED)
    assert overall([("waiting", wait)], parents.get) is Overall.STUCK
    assert overall([("waiting", settled), ("dead", None)], parents.get) is Overall.RUNNING
    assert overall([("completed", None), ("running", None)], parents.get) is Overall.RUNNING
    hook = Flow(workflow_id="w", cancel_reason=CancelReason.CONDITION_FALSE)
    assert overall([("completed", None), ("cancelled", hook)], parents.get) is Overall.COMPLETED
    cone = Flow(workflow_id="w", cancel_reason=CancelReason.UPSTREAM_DEAD)
    assert overall([("dead", None), ("cancelled", cone)], parents.get) is Overall.FAILED
    user = Flow(workflow_id="w", cancel_reason=CancelReason.USER)
    assert overall([("completed", None), ("cancelled", user)], parents.get) is Overall.CANCELLED
    assert blocked_by(Flow(workflow_id="w", parents=("p", "q", "gone")), parents.get) == [
        "p",
        "gone",
    ]


def test_a_retry_revives_the_dead_whose_parents_completed_and_no_other() -> None:
    """a died (b and c cancelled for it); x completed and y, which ran after a failed
    parent (``run``), died too: a comes back, y waits for its own retry once its parent
    settles, and a cancelled member is never picked (it comes back with its cone)."""
    state = {"a": "dead", "b": "cancelled", "c": "cancelled", "x": "completed", "y": "dead",
             "z": "dead"}  # fmt: skip
    flows = {
        "a": Flow(workflow_id="w"),
        "b": Flow(workflow_id="w", parents=("a",)),
        "c": Flow(workflow_id="w", parents=("b",)),
        "x": Flow(workflow_id="w"),
        "y": Flow(workflow_id="w", parents=("z",), on_parent_failure=OnParentFailure.RUN),
        "z": Flow(workflow_id="w", parents=("x",)),
    }
    members = [(i, state[i], flows[i]) for i in state]
    assert retried(members, state.get) == ["a", "z"]


def test_a_retry_revives_one_that_ran_after_a_parent_a_user_cancelled() -> None:
    """h runs after its parents however they ended (``all_finished``) and died; its parent
    u was cancelled by a user, which no retry brings back: h comes back. Behind a parent
    that a retry revives, or that a revival's cone brings back, it does not."""
    flows = {
        "u": Flow(workflow_id="w", cancel_reason=CancelReason.USER),
        "h": Flow(workflow_id="w", parents=("u",), run_if=RunIf.ALL_FINISHED),
        "c": Flow(workflow_id="w", cancel_reason=CancelReason.UPSTREAM_DEAD),
        "k": Flow(workflow_id="w", parents=("c",), run_if=RunIf.ALL_FINISHED),
    }
    state = {"u": "cancelled", "h": "dead", "c": "cancelled", "k": "dead"}
    assert retried([(i, state[i], flows[i]) for i in state], state.get) == ["h"]
