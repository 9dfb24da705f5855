"""Workers in any language: ``examples/worker.mjs`` (Node.js, no dependencies) and the
curl recipe of ``docs/workers.md``, each against a real ``sqlq serve --remote-queue`` on
walq, SQLite and PostgreSQL.

They are the proof that the pull protocol needs no sqlq code on the worker's side, so
they run as a user would run them: ``node examples/worker.mjs`` with its environment,
and that recipe as written, in bash. What a job ends as is read back over HTTP
(``GET /jobs/{id}?wait=``, which answers once it is finished), never guessed after a
sleep. Under CI a missing ``node`` (or ``curl``) fails these tests: ``.ci/run`` installs it.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from sqlq.bench.client.server import FAST_RETRY_FLAGS, ServerProcess
from sqlq.engines.registry import DURABLE, ENGINES, SHARED
from tests.helpers import ROOT, start_ready, unavailable, wait_for
from tests.pgdb import fresh_database

QUEUE = "node"  # the remote queue the Node worker serves
WORKER = "node-test"
EXAMPLE = ROOT / "examples" / "worker.mjs"
LEASE_S = 5  # the protocol's shortest lease: a heartbeat every 1.7 s
ADMIN_SECRET = "admin-secret-0123456789"
PRINCIPAL, WORKER_SECRET = "node-w", "worker-secret-0123456789"  # a --token-file line's


@pytest.fixture(params=(*DURABLE, *SHARED))
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def serve_args(engine: str, tmp_path: Path, request: pytest.FixtureRequest) -> list[str]:
    """A fresh data directory, or a fresh database."""
    if ENGINES[engine].shared:
        return ["--store", engine, "--dsn", fresh_database(request)]
    return ["--store", engine, "--data", str(tmp_path / "data"), "--sync", "os"]


@pytest.fixture
def node() -> str:
    """The ``node`` binary: Node.js 18 or newer (the global ``fetch``; Debian 12's nodejs,
    what .ci/run installs, is 18; the example is written for 20)."""
    found = shutil.which("node")
    if found is None:
        unavailable("node (Node.js 18 or newer): .ci/run installs nodejs")
        raise AssertionError  # unreachable: unavailable fails or skips
    version = subprocess.run([found, "--version"], capture_output=True, text=True, check=True)
    major = int(re.fullmatch(r"v(\d+)\..*", version.stdout.strip()).group(1))  # type: ignore[union-attr]
    if major < 18:
        unavailable(f"Node.js 18 or newer, not {version.stdout.strip()}")
    return found


async def _serve(serve_args: list[str], *more: str) -> ServerProcess:
    # --cancel-grace 0: a forced cancel ends a remote lease at once (the fenced case).
    return await start_ready(
        *serve_args, "--remote-queue", QUEUE, "--grace", "0", "--cancel-grace", "0",
        *FAST_RETRY_FLAGS,
        "--log-level", "warning", *more,
    )  # fmt: skip


@pytest.fixture
async def server(serve_args: list[str], tmp_path: Path) -> AsyncIterator[ServerProcess]:
    """With roles: the test submits and cancels as an admin, the Node worker claims with
    a worker's token for its queue alone, as a deployment would run it."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"admin tests {ADMIN_SECRET}\nworker {PRINCIPAL} {WORKER_SECRET} {QUEUE}\n")
    tokens.chmod(0o600)
    srv = await _serve(serve_args, "--token-file", str(tokens))
    yield srv
    await asyncio.to_thread(srv.stop)


@pytest.fixture
async def http(server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {ADMIN_SECRET}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=70) as client:
        yield client


class NodeWorker:
    """``node examples/worker.mjs``, configured by environment as its header says; its
    output in a file (no pipe to fill up)."""

    def __init__(self, node: str, url: str, log: Path, **env: str) -> None:
        self.cmd = [node, str(EXAMPLE)]
        ours = {k: v for k, v in os.environ.items() if not k.startswith("SQLQ_")}
        self.env = {**ours, "SQLQ_URL": url, "SQLQ_QUEUE": QUEUE, "SQLQ_WORKER": WORKER,
                    "SQLQ_LEASE_S": str(LEASE_S), "SQLQ_WAIT_S": "1",
                    "SQLQ_TOKEN": WORKER_SECRET, **env}  # fmt: skip
        self.log = log
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> NodeWorker:
        with self.log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *self.cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        return self

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    async def wait(self, within: float = 20) -> int:
        assert self.proc is not None
        try:
            return await asyncio.wait_for(self.proc.wait(), within)
        except TimeoutError:
            raise AssertionError(f"node did not exit within {within}s:\n{self.output}") from None

    async def terminate(self) -> int:
        """SIGTERM (to this process's PID) and its exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return await self.wait()

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


StartWorker = Callable[..., Awaitable[NodeWorker]]


@pytest.fixture
async def start_worker(
    node: str, server: ServerProcess, tmp_path: Path
) -> AsyncIterator[StartWorker]:
    """Start a Node worker against ``server`` (more environment as keywords); each is
    killed at teardown if still running."""
    made: list[NodeWorker] = []

    async def start(**env: str) -> NodeWorker:
        w = NodeWorker(node, server.url, tmp_path / f"worker{len(made)}.log", **env)
        made.append(w)
        return await w.start()

    yield start
    for w in made:
        await w.kill()


async def _submit(http: httpx.AsyncClient, *jobs: dict[str, Any]) -> list[str]:
    r = await http.post("/jobs/batch", json={"jobs": [{"queue": QUEUE, **j} for j in jobs]})
    assert r.status_code == 201, r.text
    return list(r.json()["ids"])


async def _finished(http: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    """The job once it is finished (the server holds the request until then)."""
    r = await http.get(f"/jobs/{job_id}", params={"wait": 60})
    assert r.status_code == 200, r.text
    job: dict[str, Any] = r.json()
    assert job["state"] in ("completed", "dead", "cancelled"), job
    return job


async def _job(http: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    r = await http.get(f"/jobs/{job_id}")
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.mark.slow  # a real sqlq serve and a real node process
async def test_node_worker_completes_retries_and_dead_letters(
    start_worker: StartWorker,  # first: without node, fail or skip before a server starts
    http: httpx.AsyncClient,
) -> None:
    ids = await _submit(
        http,
        {"kind": "echo", "args": {"text": "hello", "n": [1, 2.5, None]}},
        {"kind": "add", "args": {"a": 2, "b": 40}},
        {"kind": "flaky", "args": {"succeed_on": 2}},  # fails its first attempt
        {"kind": "fail", "args": {"message": "the printer is on fire"}, "max_attempts": 3},
        {"kind": "no-such-kind", "max_attempts": 3},  # no handler: dead at once
        {"kind": "slow", "args": {"steps": 3, "step_ms": 20}},
    )
    worker = await start_worker()
    echo, add, flaky, fail, unknown, slow = await asyncio.gather(*(_finished(http, i) for i in ids))

    assert (echo["state"], echo["result"], echo["attempts"]) == (
        "completed", {"text": "hello", "n": [1, 2.5, None]}, 1,
    )  # fmt: skip
    assert (add["state"], add["result"]) == ("completed", 42)
    assert (flaky["state"], flaky["result"], flaky["attempts"]) == (
        "completed", {"attempts": 2}, 2,
    )  # fmt: skip
    assert "flaky: attempt 1 fails" in flaky["errors"][0]["error"], flaky["errors"]
    # Retried through the server's policy, then dead-lettered with the handler's error.
    assert (fail["state"], fail["attempts"]) == ("dead", 3), fail
    assert "the printer is on fire" in fail["last_error"]
    assert len(fail["errors"]) == 3
    assert (unknown["state"], unknown["attempts"]) == ("dead", 1), unknown
    assert "no handler for kind no-such-kind" in unknown["last_error"]
    assert (slow["state"], slow["result"]) == ("completed", {"steps": 3})
    for job in (echo, add, flaky, fail, unknown, slow):
        assert (job["holder"], job["lease_until"]) == (None, None), job

    r = await http.get("/workers")
    assert r.status_code == 200, r.text
    [seen] = [w for w in r.json()["workers"] if w["name"] == WORKER]
    assert (seen["principal"], seen["role"], seen["queues"]) == (PRINCIPAL, "worker", [QUEUE])

    assert await worker.terminate() == 0, worker.output
    assert "stopped" in worker.output


@pytest.mark.slow  # a real sqlq serve and a real node process, a few heartbeats long
async def test_node_worker_reports_progress_stops_on_cancel_and_when_fenced(
    start_worker: StartWorker,  # first: without node, fail or skip before a server starts
    http: httpx.AsyncClient,
) -> None:
    """A cancel asked for reaches the handler through the next heartbeat, which ends its
    attempt: the job is cancelled. A forced cancel (``--cancel-grace 0``) takes the lease
    away at once: the next heartbeat is fenced, and the worker drops the job without an
    outcome. Either way the worker goes on to the next job."""
    long = {"kind": "slow", "args": {"steps": 400, "step_ms": 50}}  # 20 s unless stopped
    asked, forced = await _submit(http, long, long)
    worker = await start_worker()

    async def progressed(job_id: str) -> bool:
        job = await _job(http, job_id)
        return bool(job["state"] == "running" and job["progress"] and job["progress"]["percent"])

    for job_id in (asked, forced):  # a heartbeat carried the handler's progress
        await wait_for(lambda j=job_id: progressed(j), 10, f"progress of {job_id}")  # type: ignore[misc]
    held = await _job(http, asked)
    assert held["holder"] == f"worker:{WORKER}", held
    assert held["lease_until"] is not None

    assert (await http.delete(f"/jobs/{asked}")).status_code == 202
    assert (await http.delete(f"/jobs/{forced}", params={"force": 1})).status_code == 202
    cancelled, cut_off = await asyncio.gather(_finished(http, asked), _finished(http, forced))
    assert cancelled["state"] == "cancelled", cancelled
    assert "cancelled: asked to stop" in cancelled["last_error"], cancelled
    assert cut_off["state"] == "cancelled", cut_off
    await wait_for(lambda: f"{forced}: fenced, stopped" in worker.output, 10, "the fence")

    [after] = await _submit(http, {"kind": "add", "args": {"a": 1, "b": 1}})
    assert (await _finished(http, after))["result"] == 2
    assert await worker.terminate() == 0, worker.output


@pytest.mark.slow  # a real sqlq serve
async def test_a_token_used_after_its_job_was_cancelled_is_fenced(
    http: httpx.AsyncClient,
) -> None:
    """The protocol as any worker sees it: once the job ended cancelled, its token's
    heartbeat is fenced and its outcome a definite 409, never a silent success."""
    [job_id] = await _submit(http, {"kind": "anything", "args": {"x": 1}})
    r = await http.post("/claims", json={"queues": [QUEUE], "worker": "py", "max": 5})
    assert r.status_code == 200, r.text
    [granted] = r.json()["claims"]
    token = granted["token"]
    assert granted["job"]["id"] == job_id
    assert (await http.delete(f"/jobs/{job_id}")).status_code == 202

    r = await http.post("/claims/heartbeat", json={"items": [{"token": token}]})
    assert r.status_code == 200, r.text
    [beat] = r.json()["items"]
    assert beat["cancel_requested"] is True, beat
    r = await http.post("/claims/fail", json={"token": token, "error": "stopped as asked"})
    assert (r.status_code, r.json()["state"]) == (200, "cancelled"), r.text

    r = await http.post("/claims/complete", json={"token": token, "result": 1})
    assert (r.status_code, r.json()["error"]) == (409, "fenced"), r.text
    r = await http.post("/claims/heartbeat", json={"items": [{"token": token}]})
    assert r.json()["items"] == [{"token": token, "error": "fenced"}], r.text
    job = await _job(http, job_id)
    assert (job["state"], job["result"]) == ("cancelled", None), job


def _curl_recipe() -> str:
    """The docs' curl recipe (docs/workers.md): its ``sh`` block that heartbeats."""
    page = (ROOT / "docs" / "workers.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", page, re.S)
    recipes = [b for b in blocks if "/claims/heartbeat" in b and "curl" in b]
    assert len(recipes) == 1, "the docs' curl recipe for remote workers: one sh block"
    return str(recipes[0])


@pytest.mark.slow  # a real sqlq serve
async def test_the_docs_curl_recipe_runs_as_written(serve_args: list[str], tmp_path: Path) -> None:
    """bash and curl alone claim, heartbeat, complete and fail; the recipe's own claims
    about the answers are checked against what the server then holds."""
    if shutil.which("curl") is None:
        unavailable("curl")
    recipe = _curl_recipe()
    queue = re.search(r'"queues":\["([^"]+)"\]', recipe)
    assert queue is not None, "the recipe claims from one named queue"
    srv = await start_ready(
        *serve_args, "--remote-queue", queue.group(1), "--grace", "0", "--log-level", "warning"
    )
    try:
        script = recipe.replace("localhost:8080", srv.url.removeprefix("http://"))
        done = await asyncio.to_thread(
            subprocess.run,
            ["bash", "-euo", "pipefail", "-c", script],
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        out = done.stdout
        assert '"state":"completed"' in out, out
        assert re.search(r'"error":"fenced".* 409', out), out  # the stale token
        async with httpx.AsyncClient(base_url=srv.url, timeout=10) as http:
            r = await http.get("/jobs", params={"queue": queue.group(1)})
            jobs = {j["kind"]: j for j in r.json()["jobs"]}
        [done_job] = [j for j in jobs.values() if j["state"] == "completed"]
        assert done_job["result"] == {"url": "/img/640.png"}, jobs
        [failed] = [j for j in jobs.values() if j["last_error"] is not None]
        assert (failed["state"], failed["attempts"]) == ("scheduled", 1), failed  # retried
        assert "S3 said 503" in failed["last_error"]
    finally:
        await asyncio.to_thread(srv.stop)


async def test_node_worker_sends_an_outcome_again_until_it_is_answered(
    node: str, tmp_path: Path
) -> None:
    """Against a scripted server (no store can be made to fail one item on cue): the
    outcome answered not at all (a short list), then ``unavailable``, goes again each
    time, the same, until an answer lands; then the worker stops, idle, at once."""
    answers: list[list[dict[str, Any]]] = [[], [{"token": "t1", "error": "unavailable"}]]
    sent: list[Any] = []
    claims = 0

    async def on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal claims
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ")[1].decode()
                length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
                body = json.loads(await reader.readexactly(length))
                answer: dict[str, Any]
                if path == "/claims":
                    claims += 1
                    job = {"id": "j1", "kind": "add", "args": {"a": 2, "b": 3}, "attempts": 1}
                    answer = {"claims": [{"token": "t1", "job": job}] if claims == 1 else []}
                elif path == "/claims/outcomes":
                    sent.append(body["outcomes"])
                    given = answers.pop(0) if answers else [{"token": "t1", "state": "completed"}]
                    answer = {"outcomes": given}
                else:
                    answer = {"items": []}
                out = json.dumps(answer).encode()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(out), out))  # fmt: skip
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    worker = NodeWorker(node, url, tmp_path / "node.log", SQLQ_EXIT_WHEN_IDLE="1")
    try:
        await worker.start()
        assert await worker.wait(within=60) == 0, worker.output
    finally:
        await worker.kill()
        server.close()
    assert sent == [[{"token": "t1", "complete": {"result": 5}}]] * 3, worker.output
