"""The bar of issue 22: a job that checkpoints, is killed with the server (kill -9), and
restarts reads its checkpoint. And a cancel acknowledged while a job runs survives the
kill -9: the restart ends that job cancelled, with the one attempt, never runs it again.

A real ``sqlq serve`` on every durable engine of the registry, PostgreSQL included (there
the restarted node rescues the dead node's job once its lease runs out). The handler
saves a checkpoint, waits for it to be durable, says so through a marker file, and then
works on until it is killed; the next attempt, after the restart, must start with that
checkpoint, and its completion clears it. The files are read at the end without the
engine's code too (``sqlq.bench.offline``), so the API is not the only witness.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

from sqlq.bench.client.server import ServerProcess
from sqlq.bench.offline import JobFacts, read_data
from sqlq.bench.offline_pg import read_pg
from sqlq.engines.registry import ENGINES
from tests.helpers import ROOT, job_json, start_ready, wait_for
from tests.pgdb import fresh_database

DURABLE_ENGINES = tuple(name for name, e in ENGINES.items() if e.durable)
LEASE_S = 0.5  # shared mode: how soon the restarted node may rescue the killed one's job

HANDLERS = """
import asyncio
import os
import time
from pathlib import Path

from sqlq import task


def mark(path, text):
    # Written whole, then renamed: the test waits for the name, so never sees it empty.
    Path(path + ".tmp").write_text(text)
    os.replace(path + ".tmp", path)


@task(name="resumable", timeout=120)
async def resumable(args, ctx):
    start = ctx.checkpoint_data
    if start is None:
        ctx.progress(percent=50.0, message="step 1 saved")
        await ctx.checkpoint({"step": 1, "attempt": ctx.job.attempts, "blob": "x" * 60000})
        mark(args["marker"], str(ctx.job.attempts))  # only once it is durable
        await asyncio.sleep(120)  # the server is killed here
    return {"resumed_from": {k: v for k, v in start.items() if k != "blob"},
            "attempt": ctx.job.attempts}


@task(name="stubborn", timeout=120)
def stubborn(args, ctx):
    mark(args["marker"], str(ctx.job.attempts))
    time.sleep(120)  # ignores ctx.cancelled: the server is killed here
    return "finished"
"""


@pytest.fixture(params=DURABLE_ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def serve_args(engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> list[str]:
    """The same data for every life of the server: a directory, or one database."""
    handlers = tmp_path / "handlers"
    handlers.mkdir()
    (handlers / "ckpt_tasks.py").write_text(HANDLERS)
    common = ["--import", "ckpt_tasks", "--log-level", "warning", "--grace", "0"]
    if ENGINES[engine].shared:
        dsn = fresh_database(request)
        return ["--store", engine, "--dsn", dsn, "--lease", str(LEASE_S), *common]
    return ["--store", engine, "--data", str(tmp_path / "data"), "--sync", "full", *common]


async def _start(args: list[str], handlers: Path) -> ServerProcess:
    return await start_ready(*args, env={"PYTHONPATH": f"{handlers}:{ROOT}"})


async def _offline(engine: str, args: list[str], tmp_path: Path) -> JobFacts:
    if ENGINES[engine].shared:
        [facts] = (await read_pg(args[args.index("--dsn") + 1])).values()
    else:
        [facts] = (await asyncio.to_thread(read_data, engine, tmp_path / "data")).values()
    return facts


async def _submit(http: httpx.AsyncClient, kind: str, marker: Path, what: str) -> str:
    """A job of ``kind`` whose handler makes ``marker`` (what ``what`` waits for): its id."""
    r = await http.post("/jobs", json={"kind": kind, "args": {"marker": str(marker)}})
    assert r.status_code == 201, r.text
    job_id: str = r.json()["id"]
    await wait_for(marker.exists, 30, what)
    return job_id


async def _ended(http: httpx.AsyncClient, job_id: str, state: str) -> dict[str, Any]:
    """The job once it is ``state``, after the restart."""

    async def there() -> bool:
        return bool((await job_json(http, job_id))["state"] == state)

    await wait_for(there, 60, f"job {job_id} to end {state} after the restart")
    return await job_json(http, job_id)


@pytest.mark.slow  # a real sqlq serve, killed and restarted
async def test_a_checkpoint_saved_before_a_kill9_is_read_by_the_next_attempt(
    engine: str, serve_args: list[str], tmp_path: Path
) -> None:
    handlers, marker = tmp_path / "handlers", tmp_path / "saved"
    server = await _start(serve_args, handlers)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=5) as http:
            job_id = await _submit(http, "resumable", marker, "the checkpoint to be durable")
        await asyncio.to_thread(server.kill)  # SIGKILL to this process's PID
        assert marker.read_text() == "1"
        server = await _start(serve_args, handlers)
        async with httpx.AsyncClient(base_url=server.url, timeout=5) as http:
            job = await _ended(http, job_id, "completed")
        await asyncio.to_thread(server.stop, signal.SIGTERM)  # then read the files
    finally:
        await asyncio.to_thread(server.stop)
    assert job["result"] == {"resumed_from": {"step": 1, "attempt": 1}, "attempt": 2}
    assert job["checkpoint"] is None  # spent by the completion
    assert job["attempts"] == 2
    facts = await _offline(engine, serve_args, tmp_path)
    assert (facts.state, facts.attempts, facts.checkpoint) == ("completed", 2, None)
    assert facts.result == job["result"]


@pytest.mark.slow  # a real sqlq serve, killed and restarted
async def test_a_cancel_acknowledged_before_a_kill9_ends_the_job_cancelled_after_it(
    engine: str, serve_args: list[str], tmp_path: Path
) -> None:
    handlers, marker = tmp_path / "handlers", tmp_path / "started"
    server = await _start(serve_args, handlers)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=5) as http:
            job_id = await _submit(http, "stubborn", marker, "the job to run")
            r = await http.delete(f"/jobs/{job_id}")
            assert r.status_code == 202, r.text
            assert (r.json()["state"], r.json()["cancel_requested"]) == ("running", True)
        await asyncio.to_thread(server.kill)  # the handler never looked: still running
        marker.unlink()
        server = await _start(serve_args, handlers)
        async with httpx.AsyncClient(base_url=server.url, timeout=5) as http:
            job = await _ended(http, job_id, "cancelled")
        await asyncio.to_thread(server.stop, signal.SIGTERM)
    finally:
        await asyncio.to_thread(server.stop)
    assert not marker.exists()  # no second attempt started
    assert (job["attempts"], job["attempts_total"]) == (1, 1)
    assert job["cancel_requested_at"] is not None
    facts = await _offline(engine, serve_args, tmp_path)
    assert (facts.state, facts.attempts) == ("cancelled", 1)
    assert facts.cancel_requested_at == job["cancel_requested_at"]
    assert facts.breaks == []
