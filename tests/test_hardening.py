"""No single request or handler can fail the service (issue: safe to run for real).

Service-level: bad results, long and broken error text, handler limits, abandoned
work, the queue limit, fault injection, and the cancel/claim race.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import httpx
import msgspec
import pytest

from sqlq.bench.client.server import ServerProcess
from sqlq.common.backoff import RetryPolicy
from sqlq.common.clock import FakeClock
from sqlq.common.engine.memory import MemoryStore
from sqlq.common.errors import (
    IllegalTransitionError,
    JobRunningError,
    QueueFullError,
    StoreFailedError,
    ValidationError,
)
from sqlq.common.models import MAX_ERROR_BYTES, Job, State, Transition
from sqlq.common.shape import MAX_DEPTH
from sqlq.common.specs import JobSpec
from sqlq.common.store import Change, JobStore
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.kinds import JobContext, Registry, convert_args, task
from sqlq.runtime.service import Service
from tests.helpers import (
    ServiceFactory,
    StoreFactory,
    final,
    serve_tasks,
    submit,
    wait_for,
)

FAST_RETRY = RetryPolicy(base_s=0.001, cap_s=0.002)


def handlers() -> Registry:
    """User handlers, registered the way a user module does with @task."""
    reg = Registry()

    @task(registry=reg)
    async def bad_result(args: Any) -> Any:
        return {"x": object()}

    @task(registry=reg)
    def surrogate_result(args: Any) -> Any:
        return "name-\udcff"

    @task(registry=reg)
    def deep_result(args: Any) -> Any:  # nested args["depth"] levels in all
        value: Any = []
        for _ in range(args["depth"] - 1):
            value = [value]
        return value

    @task(registry=reg)
    def broken_error(args: Any) -> Any:
        raise RuntimeError("file \udcff.txt: " + "é" * 10_000)

    @task(registry=reg)
    def half_second(args: Any) -> Any:  # a plain handler that never beats
        threading.Event().wait(0.5)
        return "done"

    @task(registry=reg)
    def together(args: Any) -> Any:  # passes only if 16 of these run at the same time
        BARRIER.wait()
        return "together"

    @task(registry=reg, timeout=0.1)
    def stuck_thread(args: Any, ctx: JobContext) -> Any:
        STUCK.append(ctx.job.attempts)
        RELEASE.wait(30)
        return "late"

    @task(registry=reg, timeout=0.1)
    async def stuck_async(args: Any) -> Any:
        await asyncio.Event().wait()

    @task(registry=reg, hb_timeout=0.1, timeout=None)
    def beats_then_stops(args: Any, ctx: JobContext) -> Any:
        for _ in range(30):  # 0.3 s of beating: alive
            ctx.beat()
            threading.Event().wait(0.01)
        RELEASE.wait(30)  # then silent

    return reg


RELEASE = threading.Event()
STUCK: list[int] = []  # the attempts of stuck_thread that started (list.append: thread-safe)
BARRIER = threading.Barrier(16, timeout=20)


async def dead_after(rt: Service, kind: str, **spec: Any) -> Job:
    """Start ``rt``, submit one job, and return it once dead-lettered, with an error."""
    await rt.start()
    done = await final(rt, (await submit(rt, kind, **spec)).id)
    assert done.state is State.DEAD, done
    assert done.last_error is not None
    return done


@pytest.fixture
async def runtimes(services: ServiceFactory) -> AsyncIterator[ServiceFactory]:
    """Services with the handlers above; any thread still stuck is released at the end."""

    def make(store: JobStore | None = None, **config: Any) -> Service:
        config.setdefault("retry", FAST_RETRY)
        return services(store, kinds=handlers(), **config)

    RELEASE.clear()
    STUCK.clear()
    yield make
    RELEASE.set()


async def test_an_unencodable_result_fails_the_attempt_not_the_store(
    runtimes: ServiceFactory,
) -> None:
    rt = runtimes()
    await rt.start()
    bad = await submit(rt, "bad_result", max_attempts=3)
    sur = await submit(rt, "surrogate_result", max_attempts=2)
    done = await final(rt, bad.id)
    assert (done.state, done.attempts) == (State.DEAD, 3)
    assert done.last_error == "result is not JSON-serialisable: object"
    done = await final(rt, sur.id)
    assert done.state is State.DEAD
    assert done.last_error is not None
    assert done.last_error.startswith("result is not JSON-serialisable")
    assert rt.readiness() == (True, "ready")
    assert rt.liveness()[0]
    after = await submit(rt, "sleep")  # the store still takes work
    assert (await final(rt, after.id)).state is State.COMPLETED
    assert rt.stats()["unencodable_results"] == 5


async def test_error_text_is_cut_to_4k_and_lone_surrogates_are_stored_escaped(
    runtimes: ServiceFactory,
) -> None:
    rt = runtimes()
    done = await dead_after(rt, "broken_error", max_attempts=2)
    assert done.last_error is not None
    assert done.last_error.startswith("RuntimeError: file \\udcff.txt: éé")
    assert done.last_error.endswith("(truncated)")
    assert len(done.last_error.encode()) <= MAX_ERROR_BYTES
    assert rt.readiness()[0]


async def test_a_plain_half_second_handler_completes_first_time_with_default_flags(
    runtimes: ServiceFactory,
) -> None:
    rt = runtimes(retry=RetryPolicy())  # every other setting at its default too
    assert rt.config.hb_timeout_s == 0.2  # shorter than the handler: it must not matter
    await rt.start()
    jobs = await rt.submit([JobSpec(kind="half_second") for _ in range(8)])
    for job in jobs:
        done = await final(rt, job.id)
        assert (done.state, done.attempts, done.result) == (State.COMPLETED, 1, "done")
    assert rt.stats()["workers"]["hung_declared"] == 0


async def test_sync_handlers_get_a_thread_per_worker() -> None:
    """asyncio's default pool has cores + 4 threads; 16 workers must not queue behind 6."""
    BARRIER.reset()
    rt = Service(MemoryStore(), RuntimeConfig(workers=16, max_attempts=1), kinds=handlers())
    await rt.start()
    try:
        jobs = await rt.submit([JobSpec(kind="together") for _ in range(16)])
        for job in jobs:
            done = await final(rt, job.id, within=30)
            assert (done.state, done.result) == (State.COMPLETED, "together"), done.last_error
    finally:
        await rt.stop(0)


async def test_a_timed_out_thread_is_abandoned_and_counted(
    runtimes: ServiceFactory, fake_clock: FakeClock
) -> None:
    """On the fake clock, moved by hand: a thread at work holds the autojump back, so each
    attempt's 0.1 s timeout passes when the test says, with no real wait."""
    rt = runtimes(max_abandoned=1, clock=fake_clock)
    await rt.start()
    job = await submit(rt, "stuck_thread", max_attempts=2)
    await wait_for(lambda: len(STUCK) == 1, 10, "the first attempt's thread to start")
    fake_clock.advance(0.2)  # past its timeout: the health loop's next look cuts it off
    await wait_for(lambda: len(STUCK) == 2, 10, "the second attempt's thread to start")
    fake_clock.advance(0.2)
    done = await final(rt, job.id)
    assert done.state is State.DEAD
    assert done.attempts == 2
    assert done.last_error is not None
    assert done.last_error.startswith("timed out")
    stats = rt.stats()["workers"]
    assert stats["abandoned_threads_running"] == 2
    assert stats["timed_out"] == 2
    assert stats["live"] == 4  # replaced
    ok, reason = rt.readiness()
    assert not ok
    assert "abandoned" in reason
    RELEASE.set()  # the threads return; their results are dropped
    await wait_for(lambda: rt.executor.threads.abandoned == 0, 10, "abandoned threads to return")
    assert rt.readiness() == (True, "ready")
    got = await rt.get(done.id)
    assert got is not None
    assert got.result is None  # "late" was never stored


async def test_hung_async_handlers_are_cancelled_so_abandoned_tasks_do_not_pile_up(
    runtimes: ServiceFactory, fake_clock: FakeClock
) -> None:
    rt = runtimes(workers=4, hb_timeout_s=0.05, fault_injection=True, clock=fake_clock)
    await rt.start()
    hanging = await rt.submit(
        [JobSpec(kind="sleep", args={"hang_prob": 1.0}, max_attempts=4) for _ in range(10)]
    )
    timing_out = await submit(rt, "stuck_async", max_attempts=2)
    for job in [*hanging, timing_out]:
        assert (await final(rt, job.id)).state is State.DEAD
    await wait_for(lambda: not rt.pool.abandoned, 5, "cancelled workers to end")
    stats = rt.stats()["workers"]
    assert stats["hung_declared"] == 42
    assert stats["abandoned_still_running"] == 0
    assert stats["live"] == 4
    assert rt.readiness()[0]


async def test_a_handler_with_hb_timeout_is_judged_by_its_heartbeat(
    runtimes: ServiceFactory,
) -> None:
    done = await dead_after(runtimes(), "beats_then_stops", max_attempts=1)
    assert done.last_error is not None
    assert done.last_error.startswith("worker hung: no heartbeat")
    assert done.updated_at - done.created_at >= 0.3  # alive while it beat


def test_task_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="timeout"):
        task(registry=Registry(), timeout=0)
    with pytest.raises(ValueError, match="1 to 128"):
        task(name="k" * 129, registry=Registry())(lambda a: a)


async def test_fault_injection_is_refused_unless_the_server_allows_it(
    runtimes: ServiceFactory,
) -> None:
    rt = runtimes(fault_injection=False)
    await rt.start()
    for name in ("fail_prob", "hang_prob"):
        with pytest.raises(ValidationError) as err:
            await submit(rt, args={name: 0.5})
        assert err.value.field == f"args.{name}"
        assert "--fault-injection" in err.value.message
    await submit(rt, args={"work_ms": 1, "fail_prob": 0.0})  # zero is no injection
    assert rt.stats()["submitted"] == 1


async def test_the_queue_limit_refuses_whole_submissions(
    runtimes: ServiceFactory,
) -> None:
    rt = runtimes(max_queued=5)
    await rt.start()
    with pytest.raises(QueueFullError):
        await rt.submit([JobSpec(kind="sleep", delay_ms=60_000) for _ in range(6)], batch=True)
    assert rt.stats()["submitted"] == 0  # refused whole
    await rt.submit([JobSpec(kind="sleep", delay_ms=60_000) for _ in range(5)], batch=True)
    with pytest.raises(QueueFullError):
        await submit(rt, delay_ms=60_000)
    assert rt.stats()["refused_queue_full"] == 7
    assert len(rt.live) == 5  # acknowledged work untouched


class GatedStore:
    """A memory store whose commits moving a job to ``state`` wait for a gate, then
    go through, or fail with ``fail`` when it is given."""

    def __init__(self, state: State, fail: BaseException | None = None) -> None:
        self.inner = MemoryStore()
        self.state = state
        self.fail = fail
        self.gate = asyncio.Event()
        self.held = asyncio.Event()
        self.name, self.durable, self.sync = "memory", False, "full"

    def hold(self, changes: Sequence[Change]) -> bool:
        return any(isinstance(c, Transition) and c.state is self.state for c in changes)

    async def commit(self, changes: Sequence[Change]) -> None:
        if self.hold(changes):
            self.held.set()
            await self.gate.wait()
            if self.fail is not None:
                raise self.fail
        await self.inner.commit(changes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def cancel_held_while_due(
    runtimes: ServiceFactory, store: GatedStore, clock: FakeClock
) -> tuple[Service, Job, asyncio.Future[Job]]:
    """A job whose cancel is not yet durable when it comes due and a worker passes it over
    (due 300 ms later on the autojumping clock: at once)."""
    rt = runtimes(store=store, workers=1, clock=clock)
    await rt.start()
    job = await submit(rt, delay_ms=300)
    cancel = asyncio.ensure_future(rt.cancel(job.id))
    await asyncio.wait_for(store.held.wait(), 5)
    await wait_for(lambda: job.id in rt.claims._skipped, 5, "the worker to pass it over")
    return rt, job, cancel


async def test_cancel_while_a_claim_is_in_flight_is_409_running(
    runtimes: ServiceFactory,
) -> None:
    store = GatedStore(State.RUNNING)
    rt = runtimes(store=store)
    await rt.start()
    job = await submit(rt, args={"work_ms": 1})
    await asyncio.wait_for(store.held.wait(), 5)  # a worker took it; its claim is not durable
    with pytest.raises(JobRunningError):
        await rt.cancel(job.id)
    store.gate.set()
    done = await final(rt, job.id)
    assert done.state is State.COMPLETED  # it ran, and nobody was told it was cancelled


async def test_a_job_whose_cancel_is_in_flight_never_starts(
    runtimes: ServiceFactory, fake_clock: FakeClock
) -> None:
    store = GatedStore(State.CANCELLED)
    rt, job, cancel = await cancel_held_while_due(runtimes, store, fake_clock)
    with pytest.raises(IllegalTransitionError):
        await rt.cancel(job.id)  # a second cancel meanwhile is a conflict, not a second commit
    store.gate.set()
    assert (await cancel).state is State.CANCELLED
    got = await rt.get(job.id)
    assert got is not None
    assert (got.state, got.attempts) == (State.CANCELLED, 0)


async def test_a_failed_cancel_puts_a_passed_over_job_back(
    runtimes: ServiceFactory, fake_clock: FakeClock
) -> None:
    store = GatedStore(State.CANCELLED, fail=StoreFailedError("injected"))
    rt, job, cancel = await cancel_held_while_due(runtimes, store, fake_clock)
    store.gate.set()
    with pytest.raises(StoreFailedError):
        await cancel
    done = await final(rt, job.id)  # it was put back, and ran
    assert done.state is State.COMPLETED


async def test_a_store_failure_during_a_claim_is_not_counted_as_fenced(
    runtimes: ServiceFactory,
) -> None:
    store = GatedStore(State.RUNNING, fail=StoreFailedError("injected"))
    store.gate.set()
    rt = runtimes(store=store, workers=1)
    await rt.start()
    await submit(rt, args={"work_ms": 1})
    await wait_for(lambda: rt.stats()["claim_failed"] == 1, 5, "the failed claim to be counted")
    assert rt.stats()["fenced"] == 0


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


def _deep(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


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


# -- a real server: the request head, and pages over a job at the depth limit ----------------

DEEP_TASKS = """
from sqlq import task


@task()
def echo(args):
    return args


@task()
def refuse(args):
    raise RuntimeError("no")
"""


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def deep_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = serve_tasks(tmp_path_factory, "deeptasks", DEEP_TASKS)
    yield srv
    srv.stop()


def _head(port: int, request: bytes) -> bytes:
    """Send ``request``; what came back before the server closed (or 10 s passed)."""
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            s.sendall(request)
            while chunk := s.recv(65536):
                answer += chunk
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused while we were still sending: closed, as it should be
    return answer


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


UPGRADE = (
    b"upgrade: websocket\r\nconnection: Upgrade, close\r\n"
    b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n"
)


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


class _Listed(msgspec.Struct, forbid_unknown_fields=True):
    xs: list[int] = []
    n: int = 0


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
