"""The recipes in ``examples/`` run as their READMEs say: a real ``sqlq serve`` whose every
queue is served by remote workers (``--workers 0``) behind a token file (a ``submit``
token for the app, a ``worker`` token for its workers), the example's ``sqlq worker``
process importing its tasks, and the app itself in a process of its own (FastAPI under
uvicorn, Django under ``manage.py runserver``). A request to the app sends a job; the
test waits, with a deadline, until that job completed in the worker (and, for Django,
until the ORM row the task writes is there)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from sqlq import Client, State
from sqlq.bench.client.server import ServerProcess, end_process, free_port
from tests.helpers import ROOT, spawn_server
from tests.worker_helpers import WorkerProcess

# Not marked slow: each test takes about 3 s here (three processes started, a job or two,
# the processes stopped), so the fast tier runs the recipes too.
T = TypeVar("T")
FASTAPI_APP = ROOT / "examples" / "fastapi_app"
DJANGO_PROJECT = ROOT / "examples" / "django_project"
APP_SECRET = "app-secret-0123456789abcdef"
WORKER_SECRET = "worker-secret-0123456789abcdef"
WITHIN = 60.0  # seconds any one condition may take (a loaded 2-core CI machine)


@dataclass
class Queue:
    """A ready ``sqlq serve`` and the secrets of its token file."""

    server: ServerProcess
    app_token: str = APP_SECRET
    worker_token: str = WORKER_SECRET

    @property
    def url(self) -> str:
        return self.server.url


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[Queue]:
    """``sqlq serve --workers 0 --token-file FILE`` on a free loopback port, as the
    examples' READMEs start it."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"submit app {APP_SECRET}\nworker workers {WORKER_SECRET}\n")
    tokens.chmod(0o600)
    server = spawn_server("--store", "sqlite", "--data", str(tmp_path / "sqlq-data"),
                          "--workers", "0", "--token-file", str(tokens),
                          "--log-level", "warning")  # fmt: skip
    try:
        server.wait_ready(WITHIN)
        yield Queue(server)
    finally:
        server.stop(signal.SIGTERM)


class AppProcess:
    """An example's web app in a subprocess (its output in one log), stopped by PID."""

    def __init__(self, cmd: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [part.replace("{port}", str(self.port)) for part in cmd]
        self.log_path = log
        self._log = open(log, "ab")
        self.proc = subprocess.Popen(self.cmd, cwd=cwd, env={**os.environ, **env},
                                     stdout=self._log, stderr=subprocess.STDOUT)  # fmt: skip

    @property
    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_answering(self, path: str, within: float = WITHIN) -> None:
        """Wait until ``GET path`` gets any HTTP answer (the app is listening)."""
        deadline = time.monotonic() + within
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.cmd} exited with {self.proc.returncode}\n"
                                     f"{self.output}")  # fmt: skip
            try:
                httpx.get(self.url + path, timeout=2)
                return
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{self.cmd} not answering\n{self.output}") from None
            time.sleep(0.05)

    def stop(self) -> int:
        code = end_process(self.proc, signal.SIGTERM, 30)
        self._log.close()
        return code


@pytest.fixture
def started() -> Iterator[list[AppProcess | WorkerProcess]]:
    """The processes a test starts, stopped (SIGTERM, then SIGKILL) at its end, newest first."""
    processes: list[AppProcess | WorkerProcess] = []
    yield processes
    workers_exited = []
    for p in reversed(processes):
        code = p.stop()
        if isinstance(p, WorkerProcess):
            workers_exited.append(code)
    assert workers_exited == [0] * len(workers_exited)  # a worker given SIGTERM exits 0


def start_app(
    started: list[AppProcess | WorkerProcess], queue: Queue, tmp_path: Path, cwd: Path,
    env: dict[str, str], ready_path: str, *args: str,
) -> AppProcess:  # fmt: skip
    """The recipe's web app (``python ARGS`` in ``cwd``; ``{port}`` its port), sending to
    ``queue`` with the app's token, once it answers ``ready_path``."""
    app = AppProcess([sys.executable, *args], cwd=cwd, log=tmp_path / "app.log",
                     env={**env, "SQLQ_URL": queue.url, "SQLQ_TOKEN": queue.app_token})  # fmt: skip
    started.append(app)
    app.wait_answering(ready_path)
    return app


def until_finished(
    http: httpx.Client, path: str, state: Callable[[dict[str, Any]], str], what: str
) -> dict[str, Any]:
    """``GET path`` (a 200 each time) until the job ``state`` reads from its body is
    finished; that body."""

    def body() -> dict[str, Any]:
        r = http.get(path)
        assert r.status_code == 200, r.text
        return dict(r.json())

    return poll(body, lambda b: state(b) not in ("scheduled", "running"), what)


def poll(fetch: Callable[[], T], done: Callable[[T], bool], what: str,
         within: float = WITHIN) -> T:  # fmt: skip
    """``fetch()`` again until ``done(value)`` holds; that value (AssertionError past
    ``within`` seconds, naming the last value)."""
    deadline = time.monotonic() + within
    while True:
        value = fetch()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}: {value!r}")
        time.sleep(0.05)


def start_worker(
    started: list[AppProcess | WorkerProcess],
    queue: Queue,
    module: str,
    project: Path,
    log: Path,
    env: dict[str, str],
) -> WorkerProcess:
    """The example's ``sqlq worker --import MODULE`` with the worker token, once it says it
    started (``--wait 1``: an idle one stops within a second at the test's end). In
    ``started`` before it is waited for, so one that never starts is stopped too."""
    w = WorkerProcess(queue.url, "--import", module, "--wait", "1",
                      pythonpath=f"{project}:{ROOT}", log=log,
                      env={"SQLQ_TOKEN": queue.worker_token, **env})  # fmt: skip
    started.append(w)
    return w.started(WITHIN)


def test_fastapi_routes_send_typed_tasks_and_read_their_results(
    queue: Queue, started: list[AppProcess | WorkerProcess], tmp_path: Path
) -> None:
    w = start_worker(started, queue, "tasks", FASTAPI_APP, tmp_path / "worker.log", {})
    serve = ("-m", "uvicorn", "app:app", "--host", "127.0.0.1", "--port", "{port}")
    app = start_app(started, queue, tmp_path, FASTAPI_APP, {}, "/openapi.json", *serve)
    with httpx.Client(base_url=app.url, timeout=WITHIN) as http:
        sent = http.post("/signups", json={"email": "ada@example.com"})
        assert sent.status_code == 202, sent.text
        job_id = sent.json()["job_id"]
        job = until_finished(http, f"/jobs/{job_id}", lambda j: j["state"], "the signup")
        assert job == {"id": job_id, "kind": "send_welcome", "state": "completed",
                       "result": "welcome sent to ada@example.com", "error": None}  # fmt: skip

        quoted = http.post("/quotes", json={"prices_cents": [1000, 250], "discount_percent": 10})
        assert quoted.status_code == 200, quoted.text
        assert quoted.json()["total_cents"] == 1125

        assert http.get("/jobs/" + "0" * 32).status_code == 404
    with Client(queue.url, token=queue.app_token) as c:
        ran = c.get(quoted.json()["job_id"])
    assert (ran.kind, ran.state, ran.result) == ("quote", State.COMPLETED, 1125)
    # The worker ran them (the server runs none: --workers 0), the example's code in it.
    assert "welcome mail to ada@example.com" in w.output


def test_django_view_sends_a_task_whose_orm_write_lands(
    queue: Queue, started: list[AppProcess | WorkerProcess], tmp_path: Path
) -> None:
    db = tmp_path / "signups.sqlite3"
    env = {"SIGNUPS_DB": str(db), "DJANGO_SETTINGS_MODULE": "mysite.settings"}
    migrate = subprocess.run([sys.executable, "manage.py", "migrate", "--no-input"],
                             cwd=DJANGO_PROJECT, env={**os.environ, **env},
                             capture_output=True, text=True, timeout=WITHIN)  # fmt: skip
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    w = start_worker(started, queue, "mysite.worker", DJANGO_PROJECT, tmp_path / "worker.log",
                     env)  # fmt: skip
    app = start_app(started, queue, tmp_path, DJANGO_PROJECT, env, "/signups/0/",
                    "manage.py", "runserver", "127.0.0.1:{port}", "--noreload")  # fmt: skip
    with httpx.Client(base_url=app.url, timeout=WITHIN) as http:
        sent = http.post("/signups/", data={"email": "grace@example.com"})
        assert sent.status_code == 201, sent.text
        signup_id, job_id = sent.json()["signup"], sent.json()["job"]
        shown = until_finished(http, f"/signups/{signup_id}/", lambda p: p["job"]["state"],
                               "the welcome job")  # fmt: skip
    assert shown["job"] == {"id": job_id, "state": "completed", "result": "grace@example.com"}
    assert shown["welcomed_at"] is not None
    # The row as the worker left it, read from the database file itself.
    with closing(sqlite3.connect(db)) as conn:
        row = conn.execute("SELECT email, job_id, welcomed_at FROM signups_signup WHERE id = ?",
                           (signup_id,)).fetchone()  # fmt: skip
    assert row[:2] == ("grace@example.com", job_id)
    assert row[2] is not None
    assert "welcome mail to grace@example.com" in w.output


CLOSES = """
import mysite.worker  # Django set up, the tasks imported: as the worker does
from django.db import connection
from signups.models import Signup
from signups.tasks import welcome

signup = Signup.objects.create(email="ada@example.com")  # opens this thread's connection
print("open before:", connection.connection is not None)
print("returned:", welcome(signup_id=signup.pk))  # the task called as a plain function
print("open after:", connection.connection is not None)
Signup.objects.get(pk=signup.pk)  # the next use opens one again
print("reopened:", connection.connection is not None)
"""


def test_django_task_closes_its_connection_when_it_ends(tmp_path: Path) -> None:
    """The decorator under ``@task`` leaves no connection open in the thread that ran the
    job (``CONN_MAX_AGE`` 0, Django's default): what a worker's next job on that thread
    would otherwise reuse. In a process of its own: Django is set up once per process."""
    env = {**os.environ, "SIGNUPS_DB": str(tmp_path / "signups.sqlite3"),
           "DJANGO_SETTINGS_MODULE": "mysite.settings",
           "PYTHONPATH": str(DJANGO_PROJECT)}  # fmt: skip
    for argv in (["manage.py", "migrate", "--no-input"], ["-c", CLOSES]):
        r = subprocess.run([sys.executable, *argv], cwd=DJANGO_PROJECT, env=env,
                           capture_output=True, text=True, timeout=WITHIN)  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == ["open before: True", "returned: ada@example.com",
                                     "open after: False", "reopened: True"]  # fmt: skip
