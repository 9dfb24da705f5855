"""Hardening: bounds whatever the stack, a real server's request head and deep pages."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from sqlq.bench.client.server import ServerProcess
from sqlq.common.errors import ValidationError
from sqlq.common.models import Job, State
from sqlq.common.shape import MAX_DEPTH
from sqlq.common.specs import JobSpec
from sqlq.runtime.kinds import convert_args
from tests import hardening_helpers
from tests.hardening_helpers import UPGRADE, _deep, _head, _Listed, _rss_kib, dead_after
from tests.helpers import ServiceFactory, StoreFactory, final, submit

deep_server = hardening_helpers.deep_server  # the fixture, by its name
runtimes = hardening_helpers.runtimes  # the fixture, by its name


# -- bounds that hold whatever the stack (issue 19, item 2) ---------------------------------


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 600, 100_000])
async def test_a_result_nested_past_the_limit_fails_the_attempt_not_the_store(
    runtimes: ServiceFactory, depth: int
) -> None:
    rt = runtimes()
    done = await dead_after(rt, "deep_result", args={"depth": depth}, max_attempts=2)
    assert done.attempts == 2
    assert done.result is None
    assert done.last_error is not None
    assert f"nested deeper than {MAX_DEPTH} levels" in done.last_error
    assert rt.readiness() == (True, "ready")
    ok = await final(rt, (await submit(rt, "deep_result", args={"depth": MAX_DEPTH})).id)
    assert ok.state is State.COMPLETED  # at the limit is fine
    assert ok.result is not None


async def test_a_value_nested_past_the_stack_is_unencodable_not_a_crash(
    durable_factory: StoreFactory,
) -> None:
    """What the bounds leave to the encoder: a RecursionError is an UnencodableError for
    that caller, and the store goes on (walq's encode used to make it a 500)."""
    from sqlq.common.errors import UnencodableError

    store = durable_factory()
    await store.open()
    try:
        job = Job.new(kind="sleep", args={"a": _deep(100_000)}, now=1.0)
        with pytest.raises(UnencodableError, match="nested too deeply"):
            await store.commit([job])
        ok = Job.new(kind="sleep", args={}, now=1.0)
        await store.commit([ok])
        assert await store.get(ok.id) is not None
        assert store.stats().failed is None
    finally:
        await store.close()


async def test_a_nul_in_a_postgres_read_is_a_validation_error(pg_db: str, tmp_path: Any) -> None:
    from sqlq.common.store import JobQuery
    from sqlq.engines.registry import make_store

    store = make_store("postgres", tmp_path, dsn=pg_db)
    await store.open()
    try:
        with pytest.raises(ValidationError) as kind:
            await store.list_jobs(JobQuery(kind="a\x00b"))
        assert kind.value.field == "kind"
        with pytest.raises(ValidationError) as job_id:
            await store.get("a\x00b")
        assert job_id.value.field == "job_id"
        with pytest.raises(ValidationError):
            await store.find_key("k\x00")
        assert await store.list_jobs(JobQuery(kind="sleep")) == []
    finally:
        await store.close()


def test_a_1_mib_header_is_431_and_costs_the_server_no_memory(deep_server: ServerProcess) -> None:
    assert deep_server.proc is not None
    pid = deep_server.proc.pid
    with httpx.Client(base_url=deep_server.url, timeout=10) as c:
        assert c.get("/stats").status_code == 200  # warm
    before = _rss_kib(pid)
    for _ in range(8):
        answer = _head(
            deep_server.port,
            b"GET /stats HTTP/1.1\r\nhost: localhost\r\nx-filler: "
            + b"a" * (1 << 20)
            + b"\r\n\r\n",
        )
        assert answer == b"" or answer.startswith(b"HTTP/1.1 431"), answer[:200]
    url = _head(deep_server.port, b"GET /" + b"a" * (1 << 20) + b" HTTP/1.1\r\n\r\n")
    assert url == b"" or url.startswith(b"HTTP/1.1 431"), url[:200]
    grown = _rss_kib(pid) - before
    assert grown < 4 << 10, f"RSS grew by {grown} KiB"
    with httpx.Client(base_url=deep_server.url, timeout=10) as c:
        assert c.get("/stats", headers={"x-filler": "a" * (16 << 10)}).status_code == 200
        r = c.post("/jobs", json={"kind": "echo", "args": {"x": "y" * (200 << 10)}})
        assert r.status_code == 201  # a large body is not a large head


def test_every_page_holding_a_job_at_the_depth_limit_answers_200(
    deep_server: ServerProcess,
) -> None:
    deep: Any = []
    for _ in range(MAX_DEPTH - 2):
        deep = [deep]
    args = {"a": deep}  # MAX_DEPTH levels in all
    with httpx.Client(base_url=deep_server.url, timeout=10) as c:
        echo = c.post("/jobs", json={"kind": "echo", "args": args})
        assert echo.status_code == 201, echo.text
        dead = c.post("/jobs", json={"kind": "refuse", "args": args, "max_attempts": 1})
        assert dead.status_code == 201, dead.text
        batch = c.post("/jobs/batch", json={"jobs": [{"kind": "echo", "args": args}] * 3})
        assert batch.status_code == 201, batch.text
        for job in (echo.json(), dead.json()):
            r = c.get(f"/jobs/{job['id']}", params={"wait": 10})
            assert r.status_code == 200, r.text[:300]
            assert r.json()["state"] in ("completed", "dead")
            assert r.json()["args"] == args
        assert c.get(f"/jobs/{echo.json()['id']}").json()["result"] == args
        ids = [echo.json()["id"], dead.json()["id"]]
        pages = ["/jobs", "/jobs?kind=echo", "/jobs?state=dead", "/ui/jobs", "/ui/dead", "/ui/"]
        pages += [f"/ui/jobs/{job_id}" for job_id in ids]
        for page in pages:
            r = c.get(page)
            assert r.status_code == 200, (page, r.text[:300])
        r = c.post("/jobs/retry", json={"kind": "refuse"})
        assert (r.status_code, r.json()) == (200, {"retried": 1})
        r = c.post("/jobs", json={"kind": "echo", "args": {"a": [deep]}})
        assert r.status_code == 422, r.text
        assert r.json()["field"] == "args"


@pytest.mark.parametrize("bad", ["mail=²", "mail=" + "1" * 5000, "mail=٣", "mail\n=2"])
def test_queue_caps_take_only_ascii_digits_and_names(bad: str) -> None:
    from click.testing import CliRunner

    from sqlq.cli import main

    # Off loopback without a token: should the value pass, serve still refuses to start.
    args = ["serve", "--store", "memory", "--host", "0.0.0.0", "--queue", bad]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, (bad[:20], r.output[-300:])
    assert "--queue" in r.output


def test_a_websocket_upgrade_is_never_switched(deep_server: ServerProcess) -> None:
    """uvicorn runs with ws="none": an upgrade is an ordinary request the Guard checks."""
    answer = _head(deep_server.port, b"GET /ui/ HTTP/1.1\r\nhost: localhost\r\n" + UPGRADE)
    assert answer.startswith(b"HTTP/1.1 "), answer[:100]
    assert not answer.startswith(b"HTTP/1.1 101"), answer[:200]
    evil = _head(deep_server.port, b"GET /jobs HTTP/1.1\r\nhost: evil.example\r\n" + UPGRADE)
    assert evil.startswith(b"HTTP/1.1 421"), evil[:200]


async def test_args_past_the_bounds_are_refused_in_python_too(runtimes: ServiceFactory) -> None:
    """The bounds hold for a spec built in Python, not only for bytes that came over HTTP."""
    rt = runtimes()
    await rt.start()
    deep: Any = {}
    for _ in range(900):
        deep = {"a": deep}
    with pytest.raises(ValidationError) as err:
        await submit(rt, "broken_error", args=deep)
    assert err.value.field == "args"
    with pytest.raises(ValidationError) as err:
        await rt.submit(
            [JobSpec(kind="broken_error"), JobSpec(kind="broken_error", args={"x": [0] * 60_000})],
            batch=True,
        )
    assert err.value.field == "jobs[1].args"
    assert rt.stats()["submitted"] == 0


@pytest.mark.parametrize(
    ("args", "field"),
    [({"xs": [1, "b"]}, "args.xs[1]"), ({"n": "x"}, "args.n"), ({"zz": 1}, "args")],
)
def test_a_kind_names_a_bad_argument_as_the_http_decoder_does(
    args: dict[str, Any], field: str
) -> None:
    """One parser of msgspec's error paths (``specs.error_field``): a kind's own one cut
    the closing bracket off an item's path (``args.xs[1``)."""
    with pytest.raises(ValidationError) as err:
        convert_args(args, _Listed)
    assert err.value.field == field
    assert " - at `$" not in err.value.message
