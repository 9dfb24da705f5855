"""``sqlq crashcheck --workload workflows``: its verdict on hand-made facts (each rule
can fail), and real trials, kill -9 included, on walq and SQLite and on two PostgreSQL
nodes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sqlq.bench.crashflow import (
    judge_graphs,
    judge_retried,
    run_pg_trial,
    run_trial,
    to_retry,
)
from sqlq.bench.offline import JobFacts
from sqlq.bench.pgcluster import Cluster


def _facts(state: str, *, started: float | None = None, updated: float = 0.0,
           reason: str | None = None, history: list[str] | None = None) -> JobFacts:  # fmt: skip
    facts = JobFacts(state, 0, 1, [(s, 0) for s in history or [state]])
    facts.started_at, facts.updated_at = started, updated
    facts.flow = {"workflow_id": "w", "cancel_reason": reason}
    return facts


DIAMOND: dict[str, Any] = {
    "workflow_id": "w", "ids": ["a", "b", "c", "d"],
    "parents": [[], ["a"], ["a"], ["b", "c"]], "doomed": [False, False, False, False],
}  # fmt: skip


TWICE = ["waiting", "scheduled", "waiting", "scheduled"]


def _done(**changed: JobFacts) -> dict[str, JobFacts]:
    jobs = {
        "a": _facts("completed", started=1, updated=2),
        "b": _facts("completed", started=3, updated=4, history=["waiting", "scheduled"]),
        "c": _facts("completed", started=3, updated=5, history=["waiting", "scheduled"]),
        "d": _facts("completed", started=6, updated=7, history=["waiting", "scheduled"]),
    }
    return {**jobs, **changed}


def test_a_diamond_that_ran_as_it_should_passes() -> None:
    problems, seen = judge_graphs([DIAMOND], _done(), releases=True)
    assert (problems, seen["completed"], seen["released"]) == ([], 4, 3)


@pytest.mark.parametrize(
    ("changed", "found"),
    [
        ({"d": _facts("completed", started=4.5, updated=7)}, "before its parent completed"),
        ({"d": _facts("waiting")}, "still waiting"),
        ({"b": _facts("dead"), "d": _facts("completed", started=6)}, "not cancelled"),
        ({"b": _facts("dead"), "d": _facts("cancelled", reason="user")}, "not cancelled"),
        ({"c": _facts("cancelled", reason="upstream_dead")}, "though its parents completed"),
        ({"d": _facts("completed", started=6, history=TWICE)}, "released 2 times"),
    ],
)
def test_each_rule_finds_what_breaks_it(changed: dict[str, JobFacts], found: str) -> None:
    jobs = _done(**changed)
    problems, _ = judge_graphs([DIAMOND], jobs, releases=True)
    assert any(found in p for p in problems), problems
    missing = {k: v for k, v in _done().items() if k != "d"}
    assert judge_graphs([DIAMOND], missing, releases=True)[0] == ["member d of w is missing"]


def test_a_doomed_member_dies_and_its_cone_is_cancelled_upstream_dead() -> None:
    doomed = {**DIAMOND, "doomed": [False, True, False, False]}
    jobs = _done(b=_facts("dead"), d=_facts("cancelled", reason="upstream_dead"))
    assert judge_graphs([doomed], jobs, releases=False)[0] == []
    assert judge_graphs([doomed], _done(), releases=False)[0] == ["doomed member b ended completed"]


def _spawned(parent: str, *, state: str = "completed", started: float = 8.0) -> JobFacts:
    child = _facts(state, started=started, updated=started + 1)
    child.flow = {"workflow_id": "w", "parents": [parent], "ref": f"spawned:{parent}.{started}"}
    return child


SPAWNING = {**DIAMOND, "spawns": [0, 2, 0, 0]}  # b spawns two as it completes


@pytest.mark.parametrize(
    ("extra", "found"),
    [
        ({"s1": _spawned("b")}, "completed with 1 spawned jobs, not 2"),
        ({"s1": _spawned("b"), "s2": _spawned("b"), "s3": _spawned("b")}, "with 3 spawned"),
        ({"s1": _spawned("b"), "s2": _spawned("b", state="cancelled")}, "s2 spawned by b ended"),
        ({"s1": _spawned("b"), "s2": _spawned("b", started=3.5)}, "s2 started at 3.5 before"),
    ],
)
def test_a_spawner_has_exactly_its_spawned_jobs_each_after_it(
    extra: dict[str, JobFacts], found: str
) -> None:
    right = {"s1": _spawned("b"), "s2": _spawned("b")}
    problems, seen = judge_graphs([SPAWNING], {**_done(), **right}, releases=False)
    assert (problems, seen["spawned"]) == ([], 2)
    problems, _ = judge_graphs([SPAWNING], {**_done(), **extra}, releases=False)
    assert any(found in p for p in problems), problems
    dead = {**_done(b=_facts("dead"), d=_facts("cancelled", reason="upstream_dead")), **right}
    doomed = {**SPAWNING, "doomed": [False, True, False, False]}
    assert "member b ended dead with 2 spawned jobs" in judge_graphs([doomed], dead, False)[0]


def test_a_retried_graph_must_drain_to_completed() -> None:
    doomed = {**DIAMOND, "doomed": [False, True, False, False]}
    assert to_retry([DIAMOND, doomed]) == ["w"]
    assert judge_retried([doomed], _done(), ["w"]) == []
    still = _done(b=_facts("dead"), d=_facts("cancelled", reason="upstream_dead"))
    found = judge_retried([doomed], still, ["w"])
    assert "after the retry: member b ended dead though its parents completed" in found


@pytest.mark.slow
@pytest.mark.parametrize("store", ["walq", "sqlite"])
def test_a_real_trial_through_a_kill_holds_every_rule(store: str, tmp_path: Path) -> None:
    row = run_trial(store, "full", 0.6, 7, tmp_path)
    assert row["ok"], row["problems"]
    assert row["graphs"] > 0
    assert row["lost"] == 0
    assert row["ended"]["completed"] > 0
    assert row["spawned"] > 0


@pytest.mark.slow
def test_a_real_trial_on_two_postgres_nodes_one_killed_holds_every_rule(
    pg_cluster: Cluster, tmp_path: Path
) -> None:
    """The same graphs and the same rules, on two nodes sharing a fresh database; one node
    is killed -9 and started again while the other runs on, and the rows are judged in
    plain SQL."""
    dsn = pg_cluster.create_database()
    row = asyncio.run(run_pg_trial(dsn, 0.6, 1, 7, tmp_path))
    assert row["ok"], row["problems"]
    assert (row["store"], row["nodes"]) == ("postgres", 2)
    assert row["graphs"] > 0
    assert row["lost"] == 0
    assert row["ended"]["completed"] > 0
