"""The one shared empty arguments dict (``NO_ARGS``): what holds it, and that no handler can
write into it. A million queued no-op jobs each held a dict of their own before."""

from __future__ import annotations

import random
from typing import Any, cast

import msgspec

from sqlq.common.clock import SystemClock
from sqlq.common.models import NO_ARGS, Job
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.context import JobContext
from sqlq.runtime.executor import Executor
from sqlq.runtime.kinds import SLEEP, Registry, task


def test_sleep_stores_no_defaults() -> None:
    assert SLEEP.validate({"work_ms": 0}) is NO_ARGS
    assert SLEEP.validate({}) is NO_ARGS
    assert SLEEP.validate({"work_ms": 3}) == {"work_ms": 3}


def test_compact_shares_empty_args_and_reads_old_records() -> None:
    now = 1_700_000_000.0
    decoded = Job.from_dict(Job.new(kind="sleep", args={}, now=now).to_dict())
    assert decoded.args == {}
    assert decoded.args is not NO_ARGS
    assert decoded.compact().args is NO_ARGS
    # A record written before: the kind's defaults stored whole, kept as they were.
    old = {"work_ms": 0, "fail_prob": 0.0, "hang_prob": 0.0}
    job = Job.from_dict(Job.new(kind="sleep", args=old, now=now).to_dict()).compact()
    assert job.args == old
    others: list[Any] = [[], None, "x", {"a": 1}]
    for other in others:
        j = Job.from_dict(Job.new(kind="k", args=other, now=now).to_dict()).compact()
        assert j.args == other
        assert j.args is not NO_ARGS


async def test_a_handler_writing_into_its_args_reaches_no_other_job() -> None:
    reg = Registry()
    seen: list[dict[str, Any]] = []

    @task(registry=reg, name="grabby")
    async def grabby(args: dict[str, Any]) -> None:
        args["mine"] = len(seen)
        seen.append(args)

    ex = Executor(reg, RuntimeConfig(), rng=random.Random(0), clock=SystemClock())
    now = 1_700_000_000.0
    jobs = [Job.new(kind="grabby", args=NO_ARGS, now=now) for _ in range(2)]
    for job in jobs:
        await ex.execute(job, cast(JobContext, None))
    assert NO_ARGS == {}
    assert seen == [{"mine": 0}, {"mine": 1}]
    assert all(j.args is NO_ARGS for j in jobs)


def test_a_stored_sleep_job_encodes_as_before() -> None:
    job = Job.new(kind="sleep", args=SLEEP.validate({"work_ms": 0}), now=1.0)
    assert msgspec.json.decode(msgspec.json.encode(job))["args"] == {}
