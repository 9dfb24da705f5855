"""Workflows from Python (``sqlq.workflow``, ``chain``, ``group``, ``chord``), run by
``sqlq.testing`` on the real service: each step after its parents, by its policies."""

from __future__ import annotations

import pytest

import sqlq.testing
from sqlq import JobError, chain, chord, group, task, workflow
from sqlq.runtime.kinds import Registry

reg = Registry()
ran: list[str] = []


@task(registry=reg)
def step(name: str) -> str:
    ran.append(name)
    return name


@task(registry=reg)
def boom(name: str) -> None:
    ran.append(name)
    raise RuntimeError(name)


@task(registry=reg)
def fan(names: list[str]) -> sqlq.Spawn:
    ran.append("fan")
    return sqlq.spawn(chord([step.s(name=n) for n in names], step.s(name="joined")), result=0)


@pytest.fixture(autouse=True)
def _fresh() -> None:
    ran.clear()


def test_a_diamond_built_in_python_runs_in_its_order() -> None:
    with sqlq.testing.immediate(registry=reg) as q:
        wf = workflow()
        a = wf.add(step.s(name="a"))
        b = wf.add(step.s(name="b"), after=[a])
        c = wf.add(step.s(name="c"), after=[a])
        d = wf.add(step.s(name="d"), after=[b, c], ref="last")
        assert d == "last"
        sent = wf.send()
        assert sent.jobs["last"].result() == "d"
        view = sent.get()
        assert (view.id, view.state) == (sent.id, "completed")
        assert q.client.get(sent.jobs[a].id).flow is not None
    assert ran[0] == "a"
    assert ran[-1] == "d"
    assert sorted(ran[1:3]) == ["b", "c"]


def test_chain_group_and_chord() -> None:
    with sqlq.testing.immediate(registry=reg):
        sent = chain(step.s(name="1"), step.s(name="2"), step.s(name="3")).send()
        assert [h.result() for h in sent.jobs.values()] == ["1", "2", "3"]
        assert ran == ["1", "2", "3"]
        ran.clear()
        group(step.s(name="x"), step.s(name="y")).send()
        assert sorted(ran) == ["x", "y"]
        ran.clear()
        sent = chord([step.s(name="p"), step.s(name="q")], step.s(name="after")).send()
        assert ran[-1] == "after"
        assert sent.get().state == "completed"


def test_a_chord_whose_header_fails_cancels_its_body_unless_it_runs_if_all_finished() -> None:
    with sqlq.testing.immediate(registry=reg, max_attempts=1):
        sent = chord([boom.s(name="p"), step.s(name="q")], step.s(name="body")).send()
        body = list(sent.jobs.values())[-1]
        with pytest.raises(JobError) as ended:
            body.result()
        assert ended.value.job.state == "cancelled"
        assert sent.get().state == "failed"
        assert "body" not in ran
        sent = chord([boom.s(name="p2")], step.s(name="finally"), run_if="all_finished").send()
        assert list(sent.jobs.values())[-1].result() == "finally"


def test_a_step_must_come_from_a_task_and_after_must_name_an_added_step() -> None:
    wf = workflow()
    with pytest.raises(TypeError, match=r"task\.s"):
        wf.add(step)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no step of this workflow"):
        wf.add(step.s(name="a"), after=["nope"])
    a = wf.add(step.s(name="a"), ref="a")
    with pytest.raises(ValueError, match="taken"):
        wf.add(step.s(name="b"), ref=a)
    with pytest.raises(ValueError, match="needs a step"):
        workflow().send()


def test_a_spawn_runs_under_the_test_mode_as_on_a_server() -> None:
    with sqlq.testing.immediate(registry=reg) as q:
        sent = chain(fan.s(names=["p", "q"]), step.s(name="next")).send()
        assert [h.result() for h in sent.jobs.values()] == [0, "next"]
        q.run_until_idle()
        view = sent.get()
        assert (view.state, view.counts["completed"]) == ("completed", 2 + 2 + 1)
    assert ran[0] == "fan"
    assert ran[-1] == "joined"
    assert sorted(ran[1:4]) == ["next", "p", "q"]


def test_a_graph_appended_to_a_sent_workflow_runs_after_the_members_it_names() -> None:
    with sqlq.testing.immediate(registry=reg) as q:
        sent = chain(step.s(name="1"), step.s(name="2")).send()
        last = list(sent.jobs.values())[-1]
        more = workflow()
        x = more.add(step.s(name="x"), after=[last])
        more.add(step.s(name="y"), after=[x])
        first = sent.append(more)
        second = sent.append(more)  # the same graph again: its made-up refs made unique
        assert list(first) == list(second) == [x, more.refs[1]]  # by the refs add returned
        q.run_until_idle()
        assert (first[x].result(), second[x].result()) == ("x", "x")
        view = sent.get()
        assert (view.state, view.counts["completed"]) == ("completed", 6)
        stored = {m.ref for m in view.jobs}
        assert len(stored) == 6  # every member's ref unique in the workflow
        child = q.client.get(first[x].id)
        assert child.flow is not None
        assert child.flow.parents == (last.id,)
        with pytest.raises(ValueError, match="no step of this workflow"):
            workflow().add(step.s(name="z"), after=["nope"])
        given = workflow()
        given.add(step.s(name="a"), ref="step#1")  # a ref given that looks made up
        assert given.add(step.s(name="b")) == "step#2"  # the one made skips it
