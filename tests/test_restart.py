"""A real ``sqlq serve`` killed with SIGKILL while a job runs its last attempt, then restarted.

The restart that exited: recovery requeued the interrupted job through the retry
policy, which made it dead (no attempt left), the live view dropped it, and the
next line looked it up again (a ``KeyError``, exit 1). So every ``--no-retries``
server, and every job on its fifth attempt at the default five, turned one crash
into a failed start. The kill -9 trials never saw it: their jobs never fail.

Real processes on every durable engine in the registry, PostgreSQL included (there
the restarted node rescues the dead node's expired lease instead of requeueing at
recovery: the same policy, the same outcome).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from sqlq.bench.client.server import FAST_RETRY_FLAGS, ServerProcess
from sqlq.engines.registry import ENGINES
from tests.helpers import job_json, start_ready, wait_for
from tests.pgdb import fresh_database

DURABLE_ENGINES = tuple(name for name, e in ENGINES.items() if e.durable)
LONG_JOB = {"kind": "sleep", "args": {"work_ms": 5000}}
LEASE_S = 0.5  # shared mode: how soon the restarted node may rescue the killed one's job


@pytest.fixture(params=DURABLE_ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def serve_args(engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> list[str]:
    """The same data for every life of the server: a directory, or one database."""
    if ENGINES[engine].shared:
        dsn = fresh_database(request)
        return ["--store", engine, "--dsn", dsn, "--lease", str(LEASE_S)]
    return ["--store", engine, "--data", str(tmp_path / "data"), "--sync", "os"]


async def _start(args: list[str]) -> ServerProcess:
    return await start_ready(*args, "--log-level", "warning", "--grace", "0", *FAST_RETRY_FLAGS)


async def _kill_while_running(server: ServerProcess, job_id: str, attempt: int) -> None:
    """Wait until the job runs attempt number ``attempt``, then SIGKILL the server by PID."""
    async with httpx.AsyncClient(base_url=server.url, timeout=5) as http:

        async def running() -> bool:
            job = await job_json(http, job_id)
            return bool(job["state"] == "running" and job["attempts"] == attempt)

        await wait_for(running, 30, f"attempt {attempt} of job {job_id} to run")
    assert server.proc is not None
    await asyncio.to_thread(server.kill)  # SIGKILL to this process's PID, nothing by name


async def _dead_after_kills(args: list[str], spec: dict[str, Any], kills: int) -> dict[str, Any]:
    """Submit ``spec``, kill the server ``kills`` times while it runs, each time on the next
    attempt; every restart must be ready at once. The job as the last restart sees it."""
    server = await _start(args)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=5) as http:
            r = await http.post("/jobs", json=spec)
            assert r.status_code == 201, r.text
            job_id = r.json()["id"]
        for attempt in range(1, kills + 1):
            await _kill_while_running(server, job_id, attempt)
            server = await _start(args)  # the first restart: ready, not exited
        async with httpx.AsyncClient(base_url=server.url, timeout=5) as http:

            async def dead() -> bool:
                return bool((await job_json(http, job_id))["state"] == "dead")

            await wait_for(dead, 30, f"job {job_id} to be dead")
            job = await job_json(http, job_id)
            stats = (await http.get("/stats")).json()
            metrics = (await http.get("/metrics")).text
        return {**job, "_stats": stats, "_metrics": metrics}
    finally:
        await asyncio.to_thread(server.stop)


def _assert_interrupted(job: dict[str, Any], engine: str) -> None:
    error = job["last_error"]
    # The event is named for what it is: the job went dead; nothing was requeued.
    events = [line for line in job["_metrics"].splitlines() if line.startswith("sqlq_jobs_total")]
    assert any('event="dead"' in line for line in events), events
    assert not any('event="requeued"' in line for line in events), events
    if ENGINES[engine].shared:
        assert "lease expired" in error, error
    else:
        assert "interrupted: the server stopped" in error, error
        assert job["_stats"]["dead_at_recovery"] == 1  # named for what it is
        assert job["_stats"]["requeued_at_recovery"] == 0
        assert job["_stats"]["jobs"]["dead"] == 1


@pytest.mark.slow  # a real sqlq serve, killed and restarted
async def test_kill9_on_the_last_attempt_restarts_ready_and_the_job_is_dead(
    engine: str, serve_args: list[str]
) -> None:
    job = await _dead_after_kills(serve_args, {**LONG_JOB, "max_attempts": 1}, 1)
    assert job["attempts"] == 1
    _assert_interrupted(job, engine)


@pytest.mark.slow  # five kills and five restarts per engine
async def test_kill9_on_the_fifth_of_the_default_five_attempts_restarts_ready(
    engine: str, serve_args: list[str]
) -> None:
    job = await _dead_after_kills(serve_args, LONG_JOB, 5)
    assert job["attempts"] == 5 == job["max_attempts"]
    _assert_interrupted(job, engine)
