"""``sqlq.Client`` and ``sqlq.AsyncClient``: typed calls, domain errors, and a retried
submit that never makes a second job."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from sqlq import (
    AsyncClient,
    Client,
    Conflict,
    Invalid,
    NotFound,
    RateLimited,
    State,
    Unauthorized,
    Unavailable,
    task,
)
from sqlq.calls import MAX_RETRY_AFTER_S, Call
from sqlq.client import ApiError
from sqlq.http.app import create_app
from sqlq.http.guard import Security
from tests.helpers import ServiceFactory, spawn_server

Make = Callable[..., Any]


@pytest.fixture
async def aclient(services: ServiceFactory) -> AsyncIterator[Make]:
    clients: list[AsyncClient] = []

    async def make(
        transport: Callable[[httpx.AsyncBaseTransport], httpx.AsyncBaseTransport] | None = None,
        security: Security | None = None,
        token: str | None = None,
        **config: Any,
    ) -> AsyncClient:
        rt = services(**config)
        await rt.start()
        inner: httpx.AsyncBaseTransport = httpx.ASGITransport(
            app=create_app(rt, start_runtime=False, security=security)
        )
        c = AsyncClient(
            "http://localhost", transport=transport(inner) if transport else inner, token=token,
            backoff_s=0.0,
        )  # fmt: skip
        clients.append(c)
        return c

    yield make
    for c in clients:
        await c.aclose()


async def test_submit_wait_list_and_the_job_comes_back_typed(aclient: Make) -> None:
    c = await aclient()
    job = await c.submit("sleep", {"work_ms": 1}, queue="mail", priority=3)
    assert (job.state, job.queue, job.priority) == (State.SCHEDULED, "mail", 3)
    done = await c.wait(job.id, within=10)
    assert (done.state, done.result) == (State.COMPLETED, {"slept_ms": 1})
    ids = await c.submit_many([{"kind": "sleep", "delay_ms": 60_000}] * 3)
    page = await c.list(state="scheduled", limit=2)
    assert [j.id for j in page.jobs] == sorted(ids)[:2]
    assert [j.id async for j in c.jobs(state="scheduled")] == sorted(ids)
    assert (await c.cancel(ids[0])).state is State.CANCELLED
    assert (await c.retry(ids[0])).state is State.SCHEDULED
    assert (await c.stats())["submitted"] == 4


async def test_errors_are_domain_exceptions(aclient: Make) -> None:
    c = await aclient(max_queued=2)
    with pytest.raises(Invalid) as invalid:
        await c.submit("sleep", {"work_ms": -1})
    assert invalid.value.field == "args.work_ms"
    with pytest.raises(NotFound):
        await c.get("ffff")
    job = await c.submit("sleep", delay_ms=60_000)
    with pytest.raises(Conflict):
        await c.retry(job.id)  # it is not dead
    await c.submit("sleep", delay_ms=60_000)
    with pytest.raises(RateLimited) as limited:
        await c.submit("sleep")
    assert limited.value.retry_after == 1.0
    locked = await aclient(security=Security(token="s3cret"))
    with pytest.raises(Unauthorized):
        await locked.stats()
    ok = await aclient(security=Security(token="s3cret"), token="s3cret")
    assert (await ok.stats())["submitted"] == 0


class LoseFirstReply(httpx.AsyncBaseTransport):
    """The request reaches the server, and the reply is lost on the way back, once."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.sent: list[str | None] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        self.sent.append(request.headers.get("idempotency-key"))
        if len(self.sent) == 1:
            raise httpx.ReadError("connection reset", request=request)
        return response


async def test_a_submit_whose_reply_was_lost_is_retried_without_a_duplicate(
    aclient: Make,
) -> None:
    lossy: list[LoseFirstReply] = []

    def wrap(inner: httpx.AsyncBaseTransport) -> httpx.AsyncBaseTransport:
        lossy.append(LoseFirstReply(inner))
        return lossy[0]

    c = await aclient(transport=wrap)
    job = await c.submit("sleep", delay_ms=60_000)
    sent = lossy[0].sent
    assert len(sent) == 2
    assert sent[0] == sent[1] is not None
    page = await c.list()
    assert [j.id for j in page.jobs] == [job.id]  # and one job


async def test_an_unreachable_server_is_unavailable() -> None:
    async with AsyncClient("http://127.0.0.1:9", retries=2, backoff_s=0.0) as c:
        with pytest.raises(Unavailable) as err:
            await c.submit("sleep")
    assert err.value.code == "unreachable"
    assert isinstance(err.value, ApiError)


def test_the_sync_client_and_task_submit_against_a_real_server(tmp_path: Any) -> None:
    (tmp_path / "clienttasks.py").write_text(
        "from sqlq import task\n\n@task()\ndef shout(args):\n    return args['s'].upper()\n"
    )
    server = spawn_server(
        "--store", "sqlite", "--data", str(tmp_path / "data"), "--import", "clienttasks",
        env={"PYTHONPATH": f"{tmp_path}"},
    )  # fmt: skip
    try:
        server.wait_ready()

        @task(name="shout", registry=_scratch())
        def shout(args: Any) -> Any:  # the same task, as the submitting side sees it
            raise AssertionError("runs on the server, not here")

        with Client(server.url) as c:
            job = shout.submit(c, {"s": "hi"})
            assert c.wait(job.id, within=20).result == "HI"
            pending = c.submit("shout", {"s": "later"}, delay_ms=60_000)
            same = c.wait(pending.id, within=0.2)  # returns as it stands when time is up
            assert same.state is State.SCHEDULED
            assert [q.name for q in c.queues()] == ["default"]
    finally:
        server.stop()


def _scratch() -> Any:
    from sqlq.runtime.kinds import Registry

    return Registry()


PUBLIC = [n for n in vars(Client) if not n.startswith("_") and n not in ("close", "closed")]


def test_both_clients_have_every_method_alike() -> None:
    """One request layer: each method of one client is the other's, same signature and
    docstring, the async one awaited (``jobs``: iterated)."""
    not_calls = ("aclose", "closed")
    assert PUBLIC == [n for n in vars(AsyncClient) if not n.startswith("_") and n not in not_calls]
    for name in PUBLIC:
        sync, awaited = getattr(Client, name), getattr(AsyncClient, name)
        assert sync.__doc__ == awaited.__doc__, name
        want = inspect.signature(sync)
        got = inspect.signature(awaited)
        if name == "jobs":
            assert inspect.isasyncgenfunction(awaited)
            got = got.replace(return_annotation=want.return_annotation)
        else:
            assert inspect.iscoroutinefunction(awaited), name
        assert got == want, name


def _job(job_id: str) -> dict[str, Any]:
    return {"id": job_id, "kind": "sleep", "args": {}, "state": "scheduled", "queue": "default",
            "priority": 0, "attempts": 0, "max_attempts": 5, "epoch": 0, "created_at": 1.0,
            "ready_at": 1.0, "updated_at": 1.0}  # fmt: skip


def test_the_sync_client_retries_what_may_be_retried_and_pages_on() -> None:
    sent: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        if len(sent) in (1, 5):  # the first submit, and the cancel: reply lost
            raise httpx.ReadError("connection reset", request=request)
        if request.url.path == "/jobs" and request.method == "GET":
            after = request.url.params.get("after")
            page = {None: (["a" * 32], "cursor"), "cursor": (["b" * 32], None)}[after]
            return httpx.Response(200, json={"jobs": [_job(i) for i in page[0]], "next": page[1]})
        return httpx.Response(201, json=_job("c" * 32))

    with Client("http://q", transport=httpx.MockTransport(handler), backoff_s=0.0) as c:
        assert c.submit("sleep").id == "c" * 32
        keys = [r.headers["idempotency-key"] for r in sent]
        assert len(set(keys)) == 1  # sent again, with the same key
        assert len(keys) == 2
        assert [j.id[0] for j in c.jobs(queue="default")] == ["a", "b"]
        assert [r.url.params.get("limit") for r in sent[2:]] == ["1000", "1000"]
        with pytest.raises(Unavailable):
            c.cancel("c" * 32)  # a cancel is not sent twice
        assert len(sent) == 5


@pytest.mark.parametrize(
    ("status", "content", "retry_after", "cls", "says"),
    [
        (502, b"<html>Bad Gateway</html>", None, Unavailable, "<html>Bad Gateway"),  # a proxy's
        (400, b"[1, 2]", None, Invalid, "[1, 2]"),  # JSON, but no error object
        (429, b'{"error": "queue_full"}', "Wed, 21 Oct 2015 07:28:00 GMT", RateLimited, ""),
        (429, b'{"error": "queue_full"}', "soon", RateLimited, ""),
        (429, b'{"error": "queue_full"}', "7", RateLimited, ""),
        (429, b'{"error": "queue_full"}', "1e9", RateLimited, ""),
    ],
)
def test_an_error_answer_of_any_shape_is_its_exception(
    status: int, content: bytes, retry_after: str | None, cls: type[ApiError], says: str
) -> None:
    """An answer that is not sqlq's error object (a proxy's page, a JSON list) is still
    its status's exception, with the body's start for a message; a Retry-After that is
    an HTTP date (past here), not a number, or absurd is read as a wait, never raised."""
    headers = {"retry-after": retry_after}
    with pytest.raises(cls) as err:
        Call("GET", "/stats", dict).read(status, content, headers.get)
    assert says in err.value.message
    if isinstance(err.value, RateLimited):
        assert err.value.retry_after == {
            "Wed, 21 Oct 2015 07:28:00 GMT": 0.0, "soon": 1.0, "7": 7.0, "1e9": MAX_RETRY_AFTER_S
        }[retry_after or ""]  # fmt: skip
