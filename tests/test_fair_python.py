"""#37: fair claims from Python: a task's key (a string, or a function of its arguments),
``.options(key=..., weight=...)``, and a task's queue policy, set by the server at start."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from sqlq.common.engine.memory import MemoryStore
from sqlq.common.fair import Policy, Rate
from sqlq.common.specs import JobSpec
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.kinds import Registry, task
from sqlq.runtime.service import Service
from sqlq.runtime.task import Task

registry = Registry()


@task(registry=registry, queue="api", key=lambda args: f"tenant-{args['tenant']}",
      rate=Rate(per_s=5.0, burst=2), key_concurrency=3)  # fmt: skip
def call_api(tenant: int, path: str) -> str:
    return path


@task(registry=registry)
def plain(x: int) -> int:
    return x


def test_a_tasks_key_is_made_from_its_arguments_and_options_override_it() -> None:
    step = call_api.s(tenant=7, path="/a")
    assert step.options == {"queue": "api", "key": "tenant-7"}
    assert call_api.options(key="vip", weight=3).s(tenant=7, path="/a").options == {
        "queue": "api", "key": "vip", "weight": 3}  # fmt: skip
    assert plain.options(key="t1").s(x=1).options == {"key": "t1"}
    again = pickle.loads(pickle.dumps(call_api))
    assert again is call_api


def test_a_tasks_policy_is_its_queues_and_is_checked_when_it_is_defined() -> None:
    assert registry.policies == {"api": Policy(key_concurrency=3, rate=Rate(per_s=5.0, burst=2))}
    with pytest.raises(ValueError, match="give queue"):
        task(registry=Registry(), rate=5.0)(lambda x: x)
    with pytest.raises(ValueError, match=r"rate\.per_s"):
        task(registry=Registry(), queue="q", rate=-1.0)(lambda x: x)
    with pytest.raises(ValueError, match="key must be"):
        task(registry=Registry(), key="has space")(lambda x: x)
    with pytest.raises(ValueError, match="another policy"):
        task(registry=registry, name="other", queue="api", key_concurrency=9)(lambda x: x)
    with pytest.raises(TypeError, match="unknown option"):
        plain.options(kee="x")


def test_a_key_function_that_returns_no_string_is_refused_before_sending() -> None:
    def seven(args: Any) -> Any:
        return 7

    bad: Task[Any, Any] = task(registry=Registry(), key=seven)(lambda x: x)
    with pytest.raises(TypeError, match="key function"):
        bad.s(x=1)


async def test_the_server_sets_the_codes_policies_at_start_and_jobs_carry_their_keys() -> None:
    rt = Service(MemoryStore(), RuntimeConfig(workers=1), kinds=registry, define_schedules=True)
    await rt.start()
    try:
        assert rt.view.policies() == registry.policies
        step = call_api.s(tenant=3, path="/x")
        [job], _ = await rt.submit([JobSpec(kind=step.kind, args=step.args, **step.options)])
        assert (job.queue, job.key, job.weight) == ("api", "tenant-3", 1)
    finally:
        await rt.stop(0)
    flagged = {"api": Policy(key_concurrency=1)}  # --queue-policy wins over the code's
    rt = Service(MemoryStore(), RuntimeConfig(workers=1, queue_policies=flagged),
                 kinds=registry, define_schedules=True)  # fmt: skip
    await rt.start()
    try:
        assert rt.view.policies() == flagged
    finally:
        await rt.stop(0)
