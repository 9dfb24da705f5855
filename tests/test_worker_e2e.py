"""``sqlq worker`` end to end: a real ``sqlq serve --remote-queue`` and real worker
processes. A handler completing, failing through its retries, snoozing, checkpointing
across a kill -9 of its worker, progress shown by GET /jobs/{id} while it runs, a
cancel of a running remote job, ``--processes 2`` using two processes (the PIDs the jobs
saw), SIGTERM letting a running job finish before exit 0, and an outcome that finished
while the server was killed landing after its restart."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from sqlq import AsyncClient, State
from sqlq.bench.client.server import FAST_RETRY_FLAGS, ServerProcess
from tests.helpers import ROOT, spawn_server, wait_for
from tests.worker_helpers import WorkerProcess

pytestmark = pytest.mark.slow

QUEUE = "remote"
HANDLERS = """
import os, pathlib, time
from sqlq import Snooze, task

@task()
def shout(args):
    return args["s"].upper()

@task()
def boom(args):
    raise RuntimeError("always")

@task()
def nap(args, ctx):
    if ctx.job.snoozes == 0:
        raise Snooze(0.2)
    return {"snoozes": ctx.job.snoozes}

@task()
def steps(args, ctx):
    start = ctx.checkpoint_data or 0
    for i in range(start, 6):
        ctx.checkpoint(i + 1)
        if i + 1 == 3 and start == 0:
            while True:  # the first worker is killed here
                time.sleep(0.05)
    return {"from": start}

@task()
def gate(args, ctx):
    ctx.progress(50, "halfway")
    path = pathlib.Path(args["path"])
    while not path.exists():
        ctx.raise_if_cancelled()
        time.sleep(0.02)
    return "opened"

@task()
def crunch(args):
    total = 0
    for i in range(args["n"]):
        total += i * i
    return {"pid": os.getpid()}
"""


@pytest.fixture(scope="module")
def handlers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("remote_handlers")
    (where / "remote_tasks.py").write_text(HANDLERS)
    return where


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("remote_server")
    srv = spawn_server("--store", "walq", "--data", str(data), "--remote-queue", QUEUE,
                       *FAST_RETRY_FLAGS,
                       "--log-level", "warning")  # fmt: skip
    try:
        srv.wait_ready(60)
        yield srv
    finally:
        srv.stop(signal.SIGTERM)


def worker(server: ServerProcess, handlers: Path, tmp_path: Path, *args: str) -> WorkerProcess:
    return WorkerProcess(
        server.url, "--import", "remote_tasks", "--queue", QUEUE, "--lease", "6",
        "--wait", "2", *args, pythonpath=f"{handlers}:{ROOT}", log=tmp_path / "worker.log",
    ).started()  # fmt: skip


@pytest.fixture
def one(server: ServerProcess, handlers: Path, tmp_path: Path) -> Iterator[WorkerProcess]:
    """One worker of four slots, stopped (SIGTERM, status 0) after the test."""
    w = worker(server, handlers, tmp_path, "--concurrency", "4")
    yield w
    assert w.stop() == 0, w.output


async def test_complete_fail_with_retries_and_snooze(
    server: ServerProcess, one: WorkerProcess
) -> None:
    async with AsyncClient(server.url) as c:
        done = await c.submit("shout", {"s": "hi"}, queue=QUEUE)
        dead = await c.submit("boom", queue=QUEUE, max_attempts=2)
        napped = await c.submit("nap", queue=QUEUE)
        got = [await c.wait(j.id, within=60) for j in (done, dead, napped)]
    assert (got[0].state, got[0].result) == (State.COMPLETED, "HI")
    assert (got[1].state, got[1].attempts, got[1].last_error) == (
        State.DEAD, 2, "RuntimeError: always")  # fmt: skip
    assert (got[2].state, got[2].result, got[2].snoozes) == (
        State.COMPLETED, {"snoozes": 1}, 1)  # fmt: skip
    # Each attempt's end, once, in the worker's log; a failure with its traceback.
    assert one.output.count(f"job {done.id} (shout) attempt 1 completed in ") == 1
    assert one.output.count(f"job {dead.id} (boom) attempt 2 failed in ") == 1
    assert "RuntimeError: always\nTraceback (most recent call last):" in one.output


async def test_progress_shows_while_it_runs_and_a_cancel_stops_it(
    server: ServerProcess, one: WorkerProcess, tmp_path: Path
) -> None:
    door = tmp_path / "door"
    async with AsyncClient(server.url) as c:
        shown = await c.submit("gate", {"path": str(door)}, queue=QUEUE)
        stopped = await c.submit("gate", {"path": str(tmp_path / "never")}, queue=QUEUE)

        async def halfway() -> bool:
            jobs = [await c.get(j.id) for j in (shown, stopped)]
            return all(j.progress is not None and j.progress.message == "halfway" for j in jobs)

        await wait_for(halfway, 60, "progress in GET /jobs/{id}")
        running = await c.get(shown.id)
        assert running.state is State.RUNNING
        assert running.holder is not None
        assert running.holder.startswith("worker:")
        door.touch()
        assert (await c.wait(shown.id, within=60)).result == "opened"
        asked = await c.cancel(stopped.id)
        assert (asked.state, asked.cancel_requested) == (State.RUNNING, True)
        ended = await c.wait(stopped.id, within=60)
    assert ended.state is State.CANCELLED


async def test_a_checkpoint_carries_across_a_kill_of_the_worker(
    server: ServerProcess, handlers: Path, tmp_path: Path
) -> None:
    first = worker(server, handlers, tmp_path, "--concurrency", "1")
    async with AsyncClient(server.url) as c:
        job = await c.submit("steps", queue=QUEUE, max_attempts=3)

        async def saved() -> bool:
            return bool((await c.get(job.id)).checkpoint == 3)

        try:
            await wait_for(saved, 60, "the checkpoint of step 3")
        finally:
            first.stop(signal.SIGKILL)
        second = worker(server, handlers, tmp_path, "--concurrency", "1")
        try:
            done = await c.wait(job.id, within=60)  # after the first one's lease runs out
        finally:
            assert second.stop() == 0, second.output
    assert (done.state, done.result, done.attempts) == (State.COMPLETED, {"from": 3}, 2)
    assert "lease expired" in (done.errors[-1].error if done.errors else "")


async def test_two_processes_run_cpu_bound_jobs_in_two_processes(
    server: ServerProcess, handlers: Path, tmp_path: Path
) -> None:
    async with AsyncClient(server.url) as c:
        ids = await c.submit_many([{"kind": "crunch", "args": {"n": 200_000}, "queue": QUEUE}] * 8)
        w = worker(server, handlers, tmp_path, "--concurrency", "4", "--processes", "2")
        try:
            done = [await c.wait(i, within=60) for i in ids]
        finally:
            assert w.stop() == 0, w.output
    pids = {j.result["pid"] for j in done}
    assert len(pids) == 2, pids
    assert w.pid not in pids


async def test_sigterm_lets_the_running_job_finish_then_exits_0(
    server: ServerProcess, handlers: Path, tmp_path: Path
) -> None:
    door = tmp_path / "door"
    w = worker(server, handlers, tmp_path, "--concurrency", "1", "--grace", "30")
    async with AsyncClient(server.url) as c:
        job = await c.submit("gate", {"path": str(door)}, queue=QUEUE)

        async def started() -> bool:  # its handler runs (claimed is not enough: a claim
            p = (await c.get(job.id)).progress  # answered after the signal is given back)
            return p is not None and p.message == "halfway"

        await wait_for(started, 60, "the handler to start")
        w.proc.send_signal(signal.SIGTERM)
        await wait_for(lambda: "SIGTERM: stopping" in w.output, 30, "the stop to begin")
        door.touch()  # (the stop is under way: the job must still be let finish)
        code = await asyncio.to_thread(w.stop, None)  # (a second signal would hurry it)
        assert code == 0, w.output
        assert (await c.get(job.id)).state is State.COMPLETED, w.output


async def test_an_outcome_finished_while_the_server_was_down_lands_after_its_restart(
    handlers: Path, tmp_path: Path
) -> None:
    args = ("--store", "walq", "--data", str(tmp_path / "data"), "--remote-queue", QUEUE,
            "--log-level", "warning")  # fmt: skip
    first = spawn_server(*args)
    first.wait_ready(60)
    door = tmp_path / "door"
    w = worker(first, handlers, tmp_path, "--concurrency", "1", "--lease", "60")
    again: ServerProcess | None = None
    try:
        async with AsyncClient(first.url) as c:
            job = await c.submit("gate", {"path": str(door)}, queue=QUEUE)

            async def started() -> bool:  # its handler runs, not only claimed
                p = (await c.get(job.id)).progress
                return p is not None and p.message == "halfway"

            await wait_for(started, 60, "the handler to start")
        first.kill()  # kill -9, the job running remotely
        door.touch()  # it finishes while the server is away
        await wait_for(lambda: "could not report 1 outcomes" in w.output, 60, "a failed report")
        again = ServerProcess(*args, env={"PYTHONPATH": str(ROOT)})  # the same data and port
        again.port, again.url = first.port, first.url
        again.cmd[again.cmd.index("--port") + 1] = str(first.port)
        again.spawn().wait_ready(60)
        async with AsyncClient(again.url) as c:
            done = await c.wait(job.id, within=60)
        assert (done.state, done.result, done.attempts) == (State.COMPLETED, "opened", 1)
    finally:
        assert w.stop() == 0, w.output
        for srv in (first, again):
            if srv is not None:
                srv.stop(signal.SIGTERM)


async def test_a_worker_token_for_other_queues_is_refused_and_the_worker_exits_1(
    handlers: Path, tmp_path: Path
) -> None:
    secret = "w" * 40
    tokens = tmp_path / "tokens"
    tokens.write_text(f"admin ops {'a' * 40}\nworker w1 {secret} elsewhere\n")
    tokens.chmod(0o600)
    srv = spawn_server("--store", "walq", "--data", str(tmp_path / "data"), "--remote-queue",
                       QUEUE, "--token-file", str(tokens), "--log-level", "warning")  # fmt: skip
    try:
        srv.wait_ready(60)
        w = WorkerProcess(
            srv.url, "--import", "remote_tasks", "--queue", QUEUE, pythonpath=f"{handlers}:{ROOT}",
            log=tmp_path / "worker.log", env={"SQLQ_TOKEN": secret},
        )  # fmt: skip
        code = await asyncio.to_thread(w.stop, None)  # it stops by itself
    finally:
        srv.stop(signal.SIGTERM)
    assert code == 1, w.output
    assert "the server refused this worker: 403" in w.output
    assert secret not in w.output
    assert "Traceback" not in w.output
