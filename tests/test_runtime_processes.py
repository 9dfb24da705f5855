"""``sqlq serve --processes P``: the server's own workers run plain handlers in worker
processes, through the one executor ``sqlq worker --processes`` uses (``ProcessHandlers``).

On the memory engine and the real clock (the processes are real): every process used
(asserted on the PIDs the jobs saw, not on timing), a failure's text as the handler
raised it, progress and a checkpoint from the child stored, and a cancel reaching a
child that looks at ``ctx.cancelled``.
"""

from __future__ import annotations

import logging
import os

import pytest

from sqlq.common.models import State
from sqlq.common.store import JobQuery
from sqlq.runtime.service import Service
from tests import process_helpers
from tests.helpers import ServiceFactory, final, submit, wait_for
from tests.process_helpers import parent_kinds

handlers = process_helpers.handlers  # the fixture, by its name

pytestmark = pytest.mark.slow  # (processes spawned: seconds, not milliseconds)


async def started(services: ServiceFactory, module: str) -> Service:
    rt = services(kinds=parent_kinds(), workers=4, processes=2, imports=(module,))
    await rt.start()
    return rt


async def test_plain_handlers_run_in_every_process_not_the_server(
    services: ServiceFactory, handlers: str
) -> None:
    rt = await started(services, handlers)
    jobs = [await submit(rt, "crunch", args={"n": 300_000}) for _ in range(8)]
    done = [await final(rt, job.id, within=60) for job in jobs]
    assert {d.state for d in done} == {State.COMPLETED}
    pids = {d.result["pid"] for d in done}
    assert len(pids) == 2
    assert os.getpid() not in pids
    assert {d.result["sum"] for d in done} == {sum(i * i for i in range(300_000))}


async def test_a_failure_in_a_process_reads_as_it_would_in_a_thread(
    services: ServiceFactory, handlers: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Its text, its traceback from the child, and the handler's own log line, which
    reaches this process's log tagged with the job."""
    rt = await started(services, handlers)
    with caplog.at_level(logging.INFO):
        job = await submit(rt, "broken", args={}, max_attempts=1)
        dead = await final(rt, job.id, within=60)
    assert (dead.state, dead.last_error) == (State.DEAD, "KeyError: 'missing'")
    [entry] = dead.errors
    assert entry.traceback is not None
    assert "in broken" in entry.traceback
    assert entry.traceback.rstrip().endswith("KeyError: 'missing'")
    told = [r.getMessage() for r in caplog.records if r.name == "proc_handlers"]
    assert len(told) == 1
    assert told[0].startswith(f"job {job.id} (broken): about to break in ")
    assert str(os.getpid()) not in told[0]  # from the child


async def test_progress_a_checkpoint_and_a_cancel_cross_to_the_process(
    services: ServiceFactory, handlers: str
) -> None:
    rt = await started(services, handlers)
    job = await submit(rt, "until_cancelled", args={})

    async def checkpointed() -> bool:
        now = await rt.get(job.id)
        return now is not None and now.checkpoint is not None and now.progress is not None

    await wait_for(checkpointed, 60, "the child's checkpoint and progress")
    running = await rt.get(job.id)
    assert running is not None
    assert running.progress is not None
    assert running.checkpoint["pid"] != os.getpid()
    await rt.cancel(job.id)
    ended = await final(rt, job.id, within=60)
    assert (ended.state, ended.attempts) == (State.CANCELLED, 1)


async def test_waiting_for_a_process_is_not_running_against_the_timeout(
    services: ServiceFactory, handlers: str
) -> None:
    """Four workers, one process, jobs of 0.8 s under a 1.5 s timeout: the ones that wait
    for the process are not timed out for the wait (each runs well within its own)."""
    rt = services(kinds=parent_kinds(), workers=4, processes=1, imports=(handlers,))
    await rt.start()
    jobs = [await submit(rt, "nap", args={"s": 0.8}, max_attempts=1) for _ in range(4)]
    done = [await final(rt, job.id, within=60) for job in jobs]
    assert [d.state for d in done] == [State.COMPLETED] * 4, [d.last_error for d in done]


async def test_a_cancel_while_it_waits_for_a_process_gives_it_back_unstarted(
    services: ServiceFactory, handlers: str
) -> None:
    """One process, held by a job that runs until cancelled; a second job waits for it. A
    cancel of the waiting one ends it cancelled at once, no attempt counted (it never
    started: ``NotStarted``), while the first still holds the process."""
    rt = services(kinds=parent_kinds(), workers=2, processes=1, imports=(handlers,))
    await rt.start()
    holder = await submit(rt, "until_cancelled", args={})

    async def holds() -> bool:
        now = await rt.get(holder.id)
        return now is not None and now.checkpoint is not None  # (it runs in the process)

    await wait_for(holds, 60, "the first job in the process")
    waiting = await submit(rt, "crunch", args={"n": 10})
    await wait_for(lambda: rt.pool.busy() == 2, 60, "the second job taken, waiting")
    await rt.cancel(waiting.id)
    ended = await final(rt, waiting.id, within=60)
    assert (ended.state, ended.attempts) == (State.CANCELLED, 0)
    still = await rt.get(holder.id)
    assert still is not None
    assert still.state is State.RUNNING  # (the process is still its)
    await rt.cancel(holder.id)
    assert (await final(rt, holder.id, within=60)).state is State.CANCELLED


async def test_a_workflow_members_parents_cross_to_the_process(
    services: ServiceFactory, handlers: str
) -> None:
    from sqlq.common.specs import MemberSpec

    rt = await started(services, handlers)
    specs = [
        MemberSpec(kind="crunch", args={"n": 10}, ref="a"),
        MemberSpec(kind="crunch", args={"n": 20}, ref="b"),
        MemberSpec(kind="gather", args={}, ref="g", depends_on=("a", "b")),
    ]
    jobs, _ = await rt.submit(specs, batch=True, workflow=True)
    a, b, g = [await final(rt, j.id, within=60) for j in jobs]
    assert g.state is State.COMPLETED
    assert g.result["pid"] != os.getpid()
    assert g.result["parents"] == {"a": a.result, "b": b.result}
    assert g.result["complete"] is True


async def test_a_spawn_crosses_back_from_the_process(
    services: ServiceFactory, handlers: str
) -> None:
    """``sqlq.Spawn`` returned in a worker process: its jobs come back over the pipe and are
    stored in its completion's commit, a chord the processes then run."""
    from sqlq.common.specs import JobSpec

    rt = await started(services, handlers)
    [fan], _ = await rt.submit([JobSpec(kind="fan", args={"ns": [3, 4]})])
    done = await final(rt, fan.id, within=60)
    assert done.state is State.COMPLETED
    assert done.result["pid"] != os.getpid()
    spawned = [j for j in await rt.store.list_jobs(JobQuery()) if j.id != fan.id]
    assert sorted(j.kind for j in spawned) == ["crunch", "crunch", "gather"]
    ended = {j.flow.ref if j.flow else "": await final(rt, j.id, 60) for j in spawned}
    assert ended["g"].result["parents"] == {"c3": ended["c3"].result, "c4": ended["c4"].result}


async def test_a_process_reads_its_parents_past_the_first_page(
    services: ServiceFactory, handlers: str
) -> None:
    """``ctx.parents.pages()`` in a worker process: each page after the first asked of the
    parent process, which reads it as its own handler would."""
    from sqlq.common.specs import MemberSpec
    from sqlq.runtime.parents import PAGE_PARENTS

    rt = await started(services, handlers)
    names = [f"p{i}" for i in range(PAGE_PARENTS + 5)]
    specs = [*(MemberSpec(kind="sleep", ref=n) for n in names),
             MemberSpec(kind="gather_all", ref="g", depends_on=tuple(names))]  # fmt: skip
    jobs, _ = await rt.submit(specs, batch=True, workflow=True)
    done = await final(rt, jobs[-1].id, within=120)
    assert done.state is State.COMPLETED, done.errors
    assert done.result["pid"] != os.getpid()
    assert (done.result["first"], done.result["pages"], done.result["last"]) == (
        PAGE_PARENTS, [5], names[-1],
    )  # fmt: skip


async def test_a_rate_limited_crosses_back_from_the_process(
    services: ServiceFactory, handlers: str
) -> None:
    """``sqlq.RateLimited`` raised in a worker process (#37): a snooze of its ``retry_after``
    with no attempt spent, and its key's bucket moved, as in a thread."""
    from sqlq.common.fair import Policy, Rate
    from sqlq.common.specs import JobSpec

    rt = await started(services, handlers)
    await rt.set_policy("q", Policy(rate=Rate(per_s=1000.0, burst=100)))
    [job], _ = await rt.submit([JobSpec(kind="limited", queue="q", key="t", args={"after_s": 0.5})])
    done = await final(rt, job.id, within=60)
    assert (done.state, done.attempts, done.snoozes) == (State.COMPLETED, 1, 1)
    assert done.started_at is not None
    assert done.started_at - done.created_at >= 0.5
