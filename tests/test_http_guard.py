"""The HTTP guard and what errors may say: token, host, origin, content type, leaks."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from sqlq.common.engine.memory import MemoryStore
from sqlq.http.app import create_app
from sqlq.http.guard import HOSTS_REMEMBERED, Guard, Security, is_loopback
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.service import Service
from sqlq.throttle import MAX_FAILURES

TOKEN = "s3cret-token-value"
Client = Callable[..., Any]


@pytest.fixture
async def make_client() -> AsyncIterator[Client]:
    runtimes: list[Service] = []
    clients: list[httpx.AsyncClient] = []

    async def make(
        security: Security | None = None, base_url: str = "http://localhost:8080", **config: Any
    ) -> httpx.AsyncClient:
        config.setdefault("workers", 1)
        rt = Service(MemoryStore(), RuntimeConfig(**config))
        await rt.start()
        runtimes.append(rt)
        app = create_app(rt, start_runtime=False, security=security)
        # As uvicorn does: a 500 is answered, and the exception goes on to the server's log.
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        c = httpx.AsyncClient(transport=transport, base_url=base_url)
        clients.append(c)
        _RUNTIMES[id(c)] = rt
        return c

    yield make
    for c in clients:
        await c.aclose()
    for rt in runtimes:
        await rt.stop(0)


async def test_token_is_required_everywhere_but_the_probes(make_client: Client) -> None:
    c = await make_client(Security(token=TOKEN))
    for method, path in [("POST", "/jobs"), ("GET", "/stats"), ("GET", "/jobs/x")]:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": TOKEN}):
            r = await c.request(method, path, headers=headers, json={"kind": "sleep"})
            assert r.status_code == 401, (method, path, headers)
            assert r.json()["error"] == "unauthorized"
            assert r.headers["www-authenticate"].startswith("Bearer")
    assert (await c.get("/healthz")).status_code == 200
    assert (await c.get("/readyz")).status_code == 200
    auth = {"authorization": f"Bearer {TOKEN}"}
    r = await c.post("/jobs", json={"kind": "sleep"}, headers=auth)
    assert r.status_code == 201
    r = await c.get("/stats", headers={"authorization": f"bearer {TOKEN}"})
    assert r.status_code == 200
    assert TOKEN not in r.text


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("localhost:8080", 201),
        ("127.0.0.1:9", 201),
        ("[::1]:8080", 201),
        ("localhost", 201),
        ("evil.example:8080", 421),
        ("localhost.evil.example", 421),
        ("127.0.0.1.nip.io", 421),
        ("", 421),
    ],
)
async def test_loopback_server_answers_only_to_loopback_names(
    make_client: Client, host: str, status: int
) -> None:
    c = await make_client()
    r = await c.post("/jobs", json={"kind": "sleep"}, headers={"host": host})
    assert r.status_code == status, r.text
    if status == 421:
        assert r.json()["field"] == "host"


async def test_allowed_host_adds_a_name(make_client: Client) -> None:
    c = await make_client(Security.for_binding("127.0.0.1", None, ("queue.internal",)))
    r = await c.post("/jobs", json={"kind": "sleep"}, headers={"host": "queue.internal:8080"})
    assert r.status_code == 201
    r = await c.post("/jobs", json={"kind": "sleep"}, headers={"host": "other.internal"})
    assert r.status_code == 421


async def test_the_host_verdicts_kept_are_bounded_and_stay_right(make_client: Client) -> None:
    """The guard remembers each ``Host`` header's verdict; a flood of made-up names only
    empties that memory (``HOSTS_REMEMBERED``), and every verdict stays as it was."""
    c = await make_client()
    assert (await c.get("/healthz")).status_code == 200  # (the stack is built at the first)
    guard = _guard_of(c)
    for n in range(3 * HOSTS_REMEMBERED):
        r = await c.get("/healthz", headers={"host": f"made-up-{n}.example"})
        assert r.status_code == 421
        assert len(guard._hosts) <= HOSTS_REMEMBERED
        if n % 50 == 0:
            assert (await c.get("/healthz", headers={"host": "localhost:8080"})).status_code == 200
    assert (await c.get("/healthz", headers={"host": "localhost:8080"})).status_code == 200
    assert (await c.get("/healthz", headers={"host": "made-up-0.example"})).status_code == 421


def _guard_of(c: httpx.AsyncClient) -> Guard:
    stack = c._transport.app.middleware_stack  # type: ignore[attr-defined]
    while not isinstance(stack, Guard):
        stack = stack.app
    return stack


async def test_a_non_loopback_binding_does_not_check_host(make_client: Client) -> None:
    c = await make_client(Security.for_binding("0.0.0.0", TOKEN))
    r = await c.post(
        "/jobs",
        json={"kind": "sleep"},
        headers={"host": "queue.example", "authorization": f"Bearer {TOKEN}"},
    )
    assert r.status_code == 201


def test_loopback_addresses() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.3.2.1", "localhost", "::1", "[::1]"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.com"))


def _never_resolves(name: str) -> list[str]:
    raise OSError(f"no such name: {name}")


@pytest.mark.parametrize(
    "host", ["127.evil.example", "127.0.0.1.nip.io", "127.", "127.0.0.1x", "[127.0.0.1]x", ""]
)
def test_a_name_that_starts_like_loopback_is_not_loopback(host: str) -> None:
    assert not is_loopback(host, resolve=_never_resolves)
    assert not is_loopback(host, resolve=lambda _: ["10.0.0.7"])


def test_a_name_is_loopback_only_if_every_address_it_has_is() -> None:
    assert is_loopback("queue.local", resolve=lambda _: ["127.0.0.1", "::1"])
    assert not is_loopback("queue.local", resolve=lambda _: ["127.0.0.1", "192.0.2.1"])
    assert not is_loopback("queue.local", resolve=lambda _: [])
    assert not is_loopback("queue.local", resolve=_never_resolves)
    assert not is_loopback("queue.local", resolve=lambda _: ["fe80::1%eth0", "junk"])


async def test_allowed_host_is_enforced_on_a_non_loopback_binding(make_client: Client) -> None:
    c = await make_client(Security.for_binding("0.0.0.0", TOKEN, ("queue.example",)))
    auth = {"authorization": f"Bearer {TOKEN}"}
    for host, status in [("queue.example", 201), ("queue.example:8080", 201),
                         ("evil.example", 421), ("localhost", 421)]:  # fmt: skip
        r = await c.post("/jobs", json={"kind": "sleep"}, headers={"host": host, **auth})
        assert r.status_code == status, (host, r.text)


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("application/json", 201),
        ("application/json; charset=utf-8", 201),
        ("Application/JSON", 201),
        ("application/vnd.sqlq+json", 201),
        ("text/plain", 415),
        ("application/x-www-form-urlencoded", 415),
        ("multipart/form-data; boundary=x", 415),
        ("application/jsonp", 415),
        (None, 415),
    ],
)
async def test_bodies_must_be_json(
    make_client: Client, content_type: str | None, status: int
) -> None:
    c = await make_client()
    headers = {} if content_type is None else {"content-type": content_type}
    r = await c.post("/jobs", content=b'{"kind":"sleep"}', headers=headers)
    assert r.status_code == status, r.text
    if status == 415:
        assert r.json()["field"] == "content-type"


async def test_cross_origin_requests_are_refused(make_client: Client) -> None:
    c = await make_client()
    r = await c.post("/jobs", json={"kind": "sleep"}, headers={"origin": "https://evil.example"})
    assert r.status_code == 403
    assert r.json()["error"] == "cross_origin"
    r = await c.post("/jobs", json={"kind": "sleep"}, headers={"origin": "null"})
    assert r.status_code == 403
    r = await c.post("/jobs", json={"kind": "sleep"}, headers={"origin": "http://localhost:8080"})
    assert r.status_code == 201  # same origin: the page served by this server


@pytest.mark.parametrize("depth", [100, 1_000, 5_000, 100_000])
async def test_deeply_nested_json_is_400(make_client: Client, depth: int) -> None:
    c = await make_client()
    body = b'{"kind":"sleep","args":{"a":' + b"[" * depth + b"]" * depth + b"}}"
    r = await c.post("/jobs", content=body, headers={"content-type": "application/json"})
    if depth <= 100:
        assert r.status_code == 422  # decoded fine; the sleep kind refuses the argument
    else:
        assert r.status_code == 400, r.text
        assert r.json()["error"] == "bad_json"
    assert (await c.get("/readyz")).status_code == 200


async def test_a_500_says_internal_error_with_a_request_id_and_nothing_else(
    make_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    c = await make_client()

    async def explode(job_id: str) -> None:
        raise RuntimeError("secret detail at /srv/private/file")

    rt = _runtime_of(c)
    rt.get = explode  # type: ignore[method-assign]
    r = await c.get("/jobs/" + "0" * 32)  # a job id's shape: the store is asked
    assert r.status_code == 500
    body = r.json()
    assert body["error"] == "internal"
    assert "secret" not in r.text
    assert "/srv" not in r.text
    request_id = r.headers["x-request-id"]
    assert request_id in body["message"]
    assert any(request_id in rec.getMessage() and rec.exc_info for rec in caplog.records), (
        "the details go to the log under the request id"
    )


_RUNTIMES: dict[int, Service] = {}  # the service behind each of make_client's clients


def _runtime_of(c: httpx.AsyncClient) -> Service:
    return _RUNTIMES[id(c)]


async def test_a_failed_store_is_503_on_healthz_and_readyz_without_paths(tmp_path: Path) -> None:
    from sqlq.walq.store import WalStore
    from tests.walq_helpers import FaultyFiles

    fs = FaultyFiles("fdatasync", where="walq.log", nth=1)
    rt = Service(WalStore(tmp_path / "walq", fs=fs), RuntimeConfig(workers=1))
    await rt.start()
    app = create_app(rt, start_runtime=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
        assert (await c.get("/healthz")).status_code == 200
        r = await c.post("/jobs", json={"kind": "sleep"})
        assert r.status_code == 503
        for path in ("/healthz", "/readyz"):
            r = await c.get(path)
            assert r.status_code == 503, path
            assert "failed" in r.text
            assert str(tmp_path) not in r.text
        r = await c.post("/jobs", json={"kind": "sleep"})
        assert r.status_code == 503
        assert str(tmp_path) not in r.text
        assert "walq.log" in r.text  # the file is still named, without its directory
    await rt.stop(0)


async def test_queue_full_is_429_with_retry_after(make_client: Client) -> None:
    c = await make_client(max_queued=3)
    r = await c.post("/jobs/batch", json={"jobs": [{"kind": "sleep", "delay_ms": 60_000}] * 4})
    assert r.status_code == 429
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"] == "queue_full"
    assert (await c.get("/stats")).json()["submitted"] == 0
    r = await c.post("/jobs/batch", json={"jobs": [{"kind": "sleep", "delay_ms": 60_000}] * 3})
    assert r.status_code == 201


async def test_memory_store_says_it_is_not_durable(make_client: Client) -> None:
    c = await make_client()
    assert (await c.get("/stats")).json()["durable"] is False


async def test_long_input_is_not_echoed_back(make_client: Client) -> None:
    c = await make_client()
    kind = "k" * 120 + "Z" * 8  # 128: a legal length, an unknown kind
    r = await c.post("/jobs", json={"kind": kind})
    assert r.status_code == 422
    assert r.json()["field"] == "kind"
    assert "Z" * 8 not in r.text
    r = await c.post("/jobs", json={"kind": "k" * 129})
    assert r.status_code == 422
    assert r.json()["field"] == "kind"
    r = await c.get("/jobs/" + "a" * 5000)
    assert r.status_code == 404
    assert len(r.text) < 400


async def test_wrong_tokens_are_throttled_per_client_address() -> None:
    rt = Service(MemoryStore(), RuntimeConfig(workers=1))
    await rt.start()
    app = create_app(rt, start_runtime=False, security=Security(token=TOKEN))

    def client(address: str) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=app, client=(address, 4711))
        return httpx.AsyncClient(transport=transport, base_url="http://localhost")

    good = {"authorization": f"Bearer {TOKEN}"}
    try:
        async with client("192.0.2.1") as guesser, client("192.0.2.2") as other:
            for i in range(MAX_FAILURES):
                r = await guesser.get("/stats", headers={"authorization": f"Bearer guess-{i}"})
                assert r.status_code == 401
            for headers in ({"authorization": "Bearer one-more"}, good):
                r = await guesser.get("/stats", headers=headers)
                assert r.status_code == 429, r.text  # not even the right token is compared
                assert r.json()["field"] == "authorization"
                assert 1 <= int(r.headers["retry-after"]) <= 60
            # Another address is not locked out, and a request without a header is no guess.
            assert (await other.get("/stats", headers=good)).status_code == 200
            for _ in range(3 * MAX_FAILURES):
                assert (await other.get("/stats")).status_code == 401
            assert (await other.get("/stats", headers=good)).status_code == 200
            assert (await guesser.get("/healthz")).status_code == 200  # probes need no token
    finally:
        await rt.stop(0)
