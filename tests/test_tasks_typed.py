"""Typed tasks (``sqlq.runtime.task``): the handler's signature is its schema, checked
before anything is sent, by the server that imports the task and by the kind that runs
it; ``.send`` makes a job whose handle gives back the result, typed."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import httpx
import pytest

import sqlq
from sqlq import Invalid, JobContext, task
from sqlq.common.clock import SYSTEM_CLOCK
from sqlq.common.errors import ValidationError
from sqlq.common.models import Job
from sqlq.runtime.kinds import Registry
from sqlq.runtime.task import JobError, close_default_clients
from tests.helpers import spawn_server

TASKS = """
from sqlq import JobContext, task

@task
def add(x: int, y: int) -> int:
    return x + y

@task
async def greet(ctx: JobContext, name: str, punctuation: str = "!") -> str:
    return f"hello, {name}{punctuation} (attempt {ctx.job.attempts})"

@task
def boom(why: str) -> None:
    raise RuntimeError(why)
"""


class Recorder:
    """A client that keeps what it was asked to submit (and sends nothing)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any, dict[str, Any]]] = []

    def submit(self, kind: str, args: Any, **options: Any) -> Any:
        self.sent.append((kind, args, options))
        return type("J", (), {"id": "j1"})()


def _registry() -> Registry:
    return Registry()


def test_a_task_is_its_function_when_called_and_its_schema_when_sent() -> None:
    reg = _registry()

    @task(registry=reg)
    def add(x: int, y: int = 10) -> int:
        return x + y

    assert add(1, 2) == 3  # a plain call
    rec = Recorder()
    handle = add.options(client=rec, queue="math", delay=1.5, priority=3).send(1, y=2)
    assert handle.id == "j1"
    assert rec.sent == [("add", {"x": 1, "y": 2}, {"queue": "math", "delay_ms": 1500,
                                                     "priority": 3})]  # fmt: skip
    add.options(client=rec).send(x=5)
    assert rec.sent[-1][1] == {"x": 5, "y": 10}  # the defaults travel too
    with pytest.raises(Invalid) as bad:
        add.options(client=rec).send(x="a", y=2)  # type: ignore[arg-type]
    assert (bad.value.field, len(rec.sent)) == ("args.x", 2)  # refused: nothing sent
    with pytest.raises(Invalid, match=r"unexpected keyword"):
        add.options(client=rec).send(x=1, z=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unknown option 'queu'"):
        add.options(queu="math")


def test_the_kind_checks_and_runs_the_arguments_by_name_with_the_context_apart() -> None:
    reg = _registry()
    seen: list[Any] = []

    @task(registry=reg)
    async def greet(ctx: JobContext, name: str, times: int = 1) -> str:
        seen.append(ctx)
        return name * times

    kind = reg.get("greet")
    assert kind.validate({"name": "a", "times": 2}) == {"name": "a", "times": 2}
    with pytest.raises(ValidationError) as bad:
        kind.validate({"name": 3})
    assert bad.value.field == "args.name"
    with pytest.raises(ValidationError) as unknown:
        kind.validate({"name": "a", "ctx": 1})  # the context is no argument
    assert unknown.value.field == "args.ctx"
    job = Job(id="j", kind="greet", args={"name": "ab", "times": 2}, created_at=0.0,
              updated_at=0.0, ready_at=0.0)  # fmt: skip
    ctx = JobContext(job, random.Random(0), clock=SYSTEM_CLOCK)

    async def run() -> Any:
        return await kind.run(job.args, ctx)

    assert asyncio.run(run()) == "abab"
    assert seen == [ctx]


def test_the_older_form_takes_one_dict_and_a_bad_signature_is_refused_at_once() -> None:
    reg = _registry()

    @task(name="old", registry=reg)
    def old(args: dict[str, Any], ctx: JobContext) -> Any:
        return args

    assert reg.get("old").validate({"anything": [1]}) == {"anything": [1]}
    rec = Recorder()
    old.options(client=rec).send({"a": 1})  # type: ignore[call-arg]  # (ctx last: typed in)
    assert rec.sent == [("old", {"a": 1}, {})]
    with pytest.raises(ValueError, match=r"\*rest cannot be a job's argument"):
        task(registry=reg)(lambda x, *rest: None)


def test_a_typed_task_sent_to_a_real_server_and_over_http(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bar: ``add.send(x=1, y=2).result()`` is 3 against a running server (its URL
    from ``SQLQ_URL``); ``add.send(x="a", y=2)`` is refused before anything is sent; the
    same over HTTP to the server that imports the task is a 422 naming ``args.x``; a job
    that fails is ``JobError`` at ``result()``."""
    (tmp_path / "typedtasks.py").write_text(TASKS)
    server = spawn_server(
        "--store", "sqlite", "--data", str(tmp_path / "data"), "--import", "typedtasks",
        env={"PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        server.wait_ready()
        monkeypatch.setenv("SQLQ_URL", server.url)
        import typedtasks  # type: ignore[import-not-found]

        assert typedtasks.add.send(x=1, y=2).result(timeout=20) == 3
        with pytest.raises(Invalid) as bad:
            typedtasks.add.send(x="a", y=2)
        assert bad.value.field == "args.x"
        answer = httpx.post(f"{server.url}/jobs", json={"kind": "add", "args": {"x": "a", "y": 2}})
        assert answer.status_code == 422
        assert answer.json()["field"] == "args.x"

        clients: list[Any] = []

        async def greet() -> Any:
            handle = await typedtasks.greet.asend("Ada")
            clients.append(handle.client)
            return await handle.result(timeout=20)

        assert asyncio.run(greet()) == "hello, Ada! (attempt 1)"
        assert clients[0].closed  # the loop's default client, closed as asyncio.run ended
        failing = typedtasks.boom.options(max_attempts=1).send(why="no luck")
        with pytest.raises(JobError, match="no luck") as failed:
            failing.result(timeout=20)
        assert failed.value.job.state == "dead"
        # Its traceback, in GET /jobs/{id}: where the handler raised, and what.
        view = httpx.get(f"{server.url}/jobs/{failing.id}").json()
        [entry] = view["errors"]
        assert "in boom" in entry["traceback"]
        assert entry["traceback"].rstrip().endswith("RuntimeError: no luck")
        held = typedtasks.add.options(delay=600).send(x=1, y=1)
        with pytest.raises(TimeoutError, match="scheduled"):
            held.result(timeout=0.1)
    finally:
        close_default_clients()  # (its kept connection, before the server goes)
        server.stop()
        sqlq.configure()
