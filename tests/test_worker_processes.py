"""``Worker(processes=P)``: plain handlers in worker processes, against the fake server on
the real clock (processes are real): every process used (asserted on the PIDs the jobs
saw, not on timing), progress, checkpoints and a cancel reaching a child, and a child
that ignores its stop killed and replaced."""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

import pytest

from sqlq import JobContext
from sqlq.common.clock import SYSTEM_CLOCK
from sqlq.common.models import Job, State
from sqlq.runtime.processes import ChildFailed, ProcessHandlers
from sqlq.worker import CANCELLED_WHILE, Worker
from tests import process_helpers
from tests.helpers import wait_for
from tests.process_helpers import parent_kinds
from tests.worker_helpers import FakeServer

handlers = process_helpers.handlers  # the fixture, by its name

pytestmark = pytest.mark.slow  # (processes spawned: seconds, not milliseconds)


@pytest.fixture
def server() -> FakeServer:
    return FakeServer(SYSTEM_CLOCK)


def make(server: FakeServer, module: str, **options: Any) -> Worker:
    return Worker(server, ["default"], registry=parent_kinds(), imports=[module],
                  rng=random.Random(3), name="wp", lease_s=5.0, wait_s=0.2, **options)  # fmt: skip


async def test_two_processes_run_cpu_bound_jobs_both(server: FakeServer, handlers: str) -> None:
    ids = [server.submit("crunch", {"n": 300_000}) for _ in range(8)]
    worker = make(server, handlers, concurrency=4, processes=2)
    run = asyncio.create_task(worker.run())
    try:
        await server.until(lambda: all(server.state(i) is State.COMPLETED for i in ids))
        pids = {server.jobs[i].result["pid"] for i in ids}
        assert len(pids) == 2
        assert os.getpid() not in pids
        assert pids == set(worker.pids())
    finally:
        worker.stop()
        await run
    assert {server.jobs[i].result["sum"] for i in ids} == {sum(i * i for i in range(300_000))}


async def test_a_child_reports_progress_saves_checkpoints_and_sees_a_cancel(
    server: FakeServer, handlers: str
) -> None:
    job = server.submit("until_cancelled")
    worker = make(server, handlers, concurrency=1, processes=1)
    run = asyncio.create_task(worker.run())
    try:
        await server.until(lambda: server.jobs[job].progress is not None)
        assert server.jobs[job].checkpoint == {"pid": worker.pids()[0]}
        server.ask_cancel(job)
        await server.until(lambda: server.state(job) is State.CANCELLED)
    finally:
        worker.stop()
        await run
    assert server.jobs[job].last_error == "Cancelled: a cancel of this job was asked for"
    assert CANCELLED_WHILE != server.jobs[job].last_error  # (a plain handler's own words)


async def test_a_child_that_ignores_its_stop_is_killed_and_replaced(
    server: FakeServer, handlers: str
) -> None:
    stuck = server.submit("stuck", max_attempts=1)
    worker = make(server, handlers, concurrency=1, processes=1)
    run = asyncio.create_task(worker.run())
    try:
        await server.until(lambda: server.state(stuck) is State.DEAD)
        first = worker.pids()
        after = server.submit("crunch", {"n": 10})
        await server.until(lambda: server.state(after) is State.COMPLETED)
        assert server.jobs[after].result["pid"] not in first  # a new process ran it
    finally:
        worker.stop()
        await run
    assert (server.jobs[stuck].last_error or "").startswith("timed out")


async def test_a_busy_process_handed_a_second_job_fails_that_job_loudly(
    handlers: str, caplog: pytest.LogCaptureFixture
) -> None:
    """One job at a time a process: a second one handed to it (a bug) would take the first's
    end as its own and leave the first waiting for ever; it fails at once instead."""
    procs = ProcessHandlers(1, [handlers])
    await procs.start()
    try:
        child = await procs.acquire()
        first = Job.new(kind="crunch", args={"n": 3_000_000}, now=0.0)
        running = asyncio.create_task(procs.run(child, first, JobContext(first, random.Random())))
        await wait_for(lambda: child.reply is not None)
        second = Job.new(kind="crunch", args={"n": 1}, now=0.0)
        with pytest.raises(ChildFailed, match="busy"):
            await procs.run(child, second, JobContext(second, random.Random()))
        assert "was handed job" in caplog.text
        assert (await running) is not None  # the first ends as its own
    finally:
        await procs.close()


async def test_with_no_grace_a_job_waiting_for_a_process_is_given_back_not_failed(
    server: FakeServer, handlers: str
) -> None:
    """One process, held by a job that runs until cancelled; a second job waits for it. A
    stop with no grace fails the running one as interrupted (an attempt counted), and gives
    the waiting one back (it never started): even with no grace left for its task to run."""
    running = server.submit("until_cancelled")
    waiting = server.submit("crunch", {"n": 10})
    worker = make(server, handlers, concurrency=2, processes=1, grace_s=0.0)
    run = asyncio.create_task(worker.run())
    await server.until(lambda: worker.held == 2 and server.jobs[running].checkpoint is not None)
    worker.stop()
    await run
    assert server.jobs[waiting].ends == ["release"]
    assert server.jobs[running].ends == ["fail"]
