"""What the hardening tests share: handlers, fixtures, gates and a gated store."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import msgspec
import pytest

from sqlq.bench.client.server import ServerProcess
from sqlq.common.backoff import RetryPolicy
from sqlq.common.clock import FakeClock
from sqlq.common.engine.memory import MemoryStore
from sqlq.common.models import Job, State, Transition
from sqlq.common.store import Change, JobStore
from sqlq.runtime.kinds import JobContext, Registry, task
from sqlq.runtime.local import LocalClaims
from sqlq.runtime.service import Service
from tests.helpers import ServiceFactory, final, serve_tasks, submit, wait_for

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
    claims = rt.claims
    assert isinstance(claims, LocalClaims)
    await wait_for(lambda: claims.passed_over(job.id), 5, "the worker to pass it over")
    return rt, job, cancel


def _deep(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


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


UPGRADE = (
    b"upgrade: websocket\r\nconnection: Upgrade, close\r\n"
    b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n"
)


class _Listed(msgspec.Struct, forbid_unknown_fields=True):
    xs: list[int] = []
    n: int = 0
