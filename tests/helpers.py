"""What many test modules share: a fixed wall-clock time, waiting on a condition,
prerequisites CI must provide, and submitting to a ``Service``.

A plain module, imported by name; ``conftest.py`` holds only fixtures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from sqlq.bench.client.server import ServerProcess
from sqlq.common.models import Job, new_job_id
from sqlq.common.specs import JobSpec
from sqlq.common.store import JobStore
from sqlq.common.workflow import Flow
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.service import Service

ROOT = Path(__file__).resolve().parent.parent  # the repository
NOW = 1_700_000_000.0  # the wall-clock second every fake clock starts at
StoreFactory = Callable[..., JobStore]  # builds a store on one path; a second one reopens it
ServiceFactory = Callable[..., Service]  # the conftest ``services`` fixture


if TYPE_CHECKING:
    from sqlq.bench.report import Report


def unavailable(reason: str) -> None:
    """A test's prerequisite is missing: fail under CI (whose own files install it), else skip.

    A test that is skipped in CI is a missing test, so CI never skips quietly.
    """
    if os.environ.get("CI"):
        pytest.fail(f"CI must provide this: {reason}")
    pytest.skip(reason)


@contextlib.asynccontextmanager
async def app_client(config: RuntimeConfig) -> AsyncIterator[httpx.AsyncClient]:
    """The HTTP API in-process, over a started service on the memory engine."""
    from sqlq.common.engine.memory import MemoryStore
    from sqlq.http.app import create_app

    rt = Service(MemoryStore(), config)
    await rt.start()
    try:
        transport = httpx.ASGITransport(app=create_app(rt, start_runtime=False))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            yield c
    finally:
        await rt.stop(0)


async def wait_for(
    predicate: Callable[[], bool | Awaitable[bool]], within: float = 10.0, what: str = ""
) -> None:
    """Wait until ``predicate`` holds, or fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        result = predicate()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what or predicate}")
        await asyncio.sleep(0.005)


async def submit(rt: Service, kind: str = "sleep", **spec: Any) -> Job:
    [job] = (await rt.submit([JobSpec(kind=kind, **spec)]))[0]
    return job


async def final(rt: Service, job_id: str, within: float = 20.0) -> Job:
    """The job once it reaches a terminal state."""
    out: list[Job] = []

    async def done() -> bool:
        job = await rt.get(job_id)
        if job is not None and job.terminal:
            out.append(job)
            return True
        return False

    await wait_for(done, within, f"job {job_id} to finish")
    return out[0]


async def finals(rt: Service, jobs: list[Job], within: float = 20.0) -> dict[str, Job]:
    """A workflow's ``jobs`` once each reaches a terminal state, by ref (by id if none)."""
    out = {}
    for j in jobs:
        ref = j.flow.ref if j.flow is not None else None
        out[ref or j.id] = await final(rt, j.id, within)
    return out


def spawn_server(*serve_args: str, env: dict[str, str] | None = None) -> ServerProcess:
    """A real ``sqlq serve`` with these flags, started but not waited for (``wait_ready``)."""
    return ServerProcess(*serve_args, env={"PYTHONPATH": str(ROOT), **(env or {})}).spawn()


async def start_ready(*serve_args: str, env: dict[str, str] | None = None) -> ServerProcess:
    """A real ``sqlq serve``, ready within 60 s (stopped and the error raised if not): a
    fresh life of a server must be ready at once, whatever it recovered."""
    server = spawn_server(*serve_args, env=env)
    try:
        await asyncio.to_thread(server.wait_ready, 60)
    except BaseException:
        await asyncio.to_thread(server.stop)
        raise
    return server


async def job_json(http: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    """``GET /jobs/{id}``'s body; it must answer 200."""
    r = await http.get(f"/jobs/{job_id}")
    assert r.status_code == 200, r.text
    return dict(r.json())


def serve_tasks(
    tmp: pytest.TempPathFactory, module: str, source: str, *serve_args: str
) -> ServerProcess:
    """A ready ``sqlq serve --store sqlite`` that imports ``source`` as ``module``."""
    handlers = tmp.mktemp("handlers")
    (handlers / f"{module}.py").write_text(source)
    srv = spawn_server(
        "--store", "sqlite", "--data", str(tmp.mktemp(module)), "--import", module,
        *serve_args, env={"PYTHONPATH": f"{handlers}:{ROOT}"},
    )  # fmt: skip
    srv.wait_ready()
    return srv


def assert_verdict(verdict: str | None, problem: str | None) -> None:
    """A crash verdict (``sqlq.bench.verdict.judge``): none when ``problem`` is None, else one
    that names it."""
    if problem is None:
        assert verdict is None
    else:
        assert verdict is not None
        assert problem in verdict


def without_module(tmp_path: Path, module: str) -> dict[str, str]:
    """An environment for a subprocess in which ``import module`` fails, as on an install
    without the extra that brings it (a ``sitecustomize`` sets it to None)."""
    site = tmp_path / f"without-{module}"
    site.mkdir()
    (site / "sitecustomize.py").write_text(f"import sys\nsys.modules[{module!r}] = None\n")
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def run_cli(server: ServerProcess, *args: str) -> tuple[int, str]:
    """``sqlq ARGS`` against ``server`` (its URL as ``SQLQ_URL``): the exit code and the
    output, which never holds a traceback (a bad input is a one-line message)."""
    from click.testing import CliRunner

    from sqlq.cli import main

    r = CliRunner().invoke(main, list(args), env={"SQLQ_URL": server.url})
    assert "Traceback" not in r.output, r.output
    return r.exit_code, r.output


def section_of(out: Path, module: Any, rows: list[dict[str, Any]]) -> Report:
    """An experiment's report section built from ``rows``, as ``sqlq bench`` builds it from
    ``<NAME>.jsonl`` in ``out``: the ``Report`` (its ``lines``). (The report is imported
    here: at the top, this module, which conftest loads first, would import it before the
    experiments it imports, a cycle of initialisation.)"""
    from sqlq.bench.report import Report

    (out / f"{module.NAME}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rep = Report(out)
    module.section(rep)
    return rep


async def dead_root_cone(store: JobStore, children: int) -> tuple[Job, list[Job]]:
    """A workflow's root (one attempt) and ``children`` members after it alone, committed
    as a submission makes them; then the root started and buried, which cancels them all."""
    wf = new_job_id(NOW)
    root = Job.new(kind="k", args={}, now=NOW, max_attempts=1,
                   flow=Flow(workflow_id=wf, ref="root"))  # fmt: skip
    kids = [Job.new(kind="k", args={}, now=NOW, flow=Flow(
        workflow_id=wf, ref=f"k{i}", parents=(root.id,), deps_pending=1))
        for i in range(children)]  # fmt: skip
    await store.commit([root, *kids])
    start = root.start(NOW + 1)
    await store.commit([start])
    await store.commit([root.apply(start).bury("boom", NOW + 2)])
    return root, kids
