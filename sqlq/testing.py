"""``sqlq.testing``: a test's tasks run in the test's own process, with the server's semantics.

Two things, neither needing a server, a port or a data directory:

- ``immediate()``: a queue in this process on which every ``.send()`` and ``.asend()``
  made inside it runs; a context manager, and (through sqlq's pytest plugin,
  ``sqlq.pytest_plugin``) the fixture ``sqlq_testing``::

      import sqlq.testing

      def test_add():
          with sqlq.testing.immediate() as q:
              handle = add.send(x=1, y=2)     # it ran before send returned
              assert handle.result() == 3
              assert q.client.get(handle.id).attempts == 1

- ``context()``: a ``JobContext`` double, to call a handler on its own and read what it
  did with its context (progress, checkpoints, a snooze), or to cancel it.

Every fake runs the contract it fakes, so the queue is no imitation of a server but the
server itself, built small: the real ``Service`` (worker pool, claims, the retry policy,
snoozes, cancels, checkpoints, timeouts) on the memory engine, the real HTTP app, and the
real ``Client`` and ``AsyncClient``, whose transport hands each request to the app on
the queue's own event loop instead of a socket. What a test sees is what a server would
answer: ``sqlq.Invalid`` at ``.send`` for a bad argument, a 422 for a kind no task of the
queue's registry has (the default: every ``@task`` imported so far).

Time. The queue runs on a ``FakeClock``, on an event loop in a thread of its own (so a
sync test and an async one use it alike), and the clock stands still until the test
waits on the queue: ``.send()`` while eager, ``handle.wait()`` and ``result()``,
``q.run_until_idle()``, ``q.advance(seconds)``. While it waits, whenever the loop has
nothing to do (nothing ready, no handler running in a thread) the clock jumps to its
next deadline: a retry 15 s away, a snooze of an hour or a job delayed by a day runs as
soon as everything due before it has, in milliseconds of wall time. Timestamps
(``created_at``, ``ready_at``, ``errors[].at``) are on that clock, which starts at the
real time the queue started (``start=`` to choose).

Eager or not. ``immediate()`` is eager, as Celery's ``task_always_eager`` and huey's
immediate mode are: ``.send()`` returns once its job has finished (completed, dead or
cancelled) through every retry and snooze, and so has every job it sent in turn (a send
from inside a handler is not eager itself: the drive under way runs that job too); the
handle's ``result()`` is its result or ``JobError``. A job that can never run (its queue
paused) leaves the send to return with it still scheduled. ``immediate(eager=False)`` (or
``q.eager = False`` for the rest of a test): ``.send()`` returns at once and the job
starts meanwhile, the clock standing; the test drives with ``handle.wait()``,
``q.run_until_idle()`` or ``q.advance(s)``. A test of a cancel wants that: its job must
be running when it is cancelled.

What it cannot fake: a handler that waits on real time (``asyncio.sleep``, a socket) while
the clock runs sees the clock jump meanwhile, as on any autojumping clock (its own
timeout may pass); a handler waits a policy's time on ``ctx.clock``. A plain handler runs
in a thread, and the clock holds still while it does (so one that waits for another
job's result gets it only if that job needs no time to pass). ``handle.wait(timeout)``
counts its timeout in real seconds (it is the client's), the clock running meanwhile. At
the exit a job still running is cancelled at once, and its thread joined.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx

from sqlq.calls import Invalid
from sqlq.client import AsyncClient, Client
from sqlq.client import Job as JobView
from sqlq.common.clock import Clock, FakeClock
from sqlq.common.errors import ValidationError
from sqlq.common.models import DEFAULT_MAX_ATTEMPTS, JSON, Job, State, new_job_id
from sqlq.common.query import wait_seconds
from sqlq.common.running import Progress, check_checkpoint
from sqlq.common.wire import MAX_WAIT_S, BatchResult
from sqlq.engines.registry import make_store
from sqlq.http.app import create_app
from sqlq.runtime import task as tasks
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.context import AttemptFenced, Done, JobContext, Snooze
from sqlq.runtime.kinds import Registry
from sqlq.runtime.service import Service
from sqlq.runtime.task import Task

__all__ = ["TestContext", "TestQueue", "context", "immediate"]

T = TypeVar("T")
BASE_URL = "http://localhost"  # (a loopback name: the guard's default lets it in)
HORIZON_S = 30 * 86_400.0  # how far an eager send or run_until_idle runs the clock
JOIN_S = 10.0  # real seconds a handler's thread may take to return after the exit
HANDLER_THREADS = "sqlq-handler"  # (``HandlerThreads``' thread name prefix)
# The server's defaults, except a fixed seed (the backoff's jitter is the same every run)
# and no periodic compaction (nothing to compact on memory; one timer fewer to jump).
TEST_CONFIG: dict[str, Any] = {"seed": 0, "compact_every_s": 0.0}


class _Clock(FakeClock):
    """The queue's clock: a ``FakeClock`` that never jumps by itself, and tells a waiter when
    its loop has gone idle (``idle``): the moment its selector would have jumped it. Who
    waits there moves it (``TestQueue._run_until``), each in turn."""

    def __init__(self, start: float) -> None:
        self._idle: list[asyncio.Future[None]] = []
        super().__init__(start, autojump=True)

    @property
    def autojump(self) -> bool:
        """What the loop's selector asks before it would jump: somebody waits for idle."""
        return bool(self._idle)

    @autojump.setter
    def autojump(self, _: bool) -> None:
        """(``FakeClock.__init__`` sets it; here it follows the waiters.)"""

    def jump(self) -> bool:
        """The loop is idle: wake the first who waits for that (one a time: what it does
        there, it does alone), instead of jumping."""
        while self._idle:
            fut = self._idle.pop(0)
            if not fut.done():
                fut.set_result(None)
                return True
        return False

    async def idle(self) -> None:
        """Return once everything runnable at this instant has run: nothing is ready on the
        loop and no handler runs in a thread."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle.append(fut)
        await fut


class TestQueue:
    """A queue in this process (``immediate()``): ``.send()`` runs its jobs while it is on.

    ``client`` and ``async_client`` are real clients of it (``q.client.get(id)``: the
    job as ``GET /jobs/{id}`` shows it, ``errors`` and all); ``clock`` its fake clock;
    ``service`` the runtime itself, for what no client shows. ``eager`` may change
    mid-test.
    """

    __test__ = False  # (pytest: not a test class)

    def __init__(
        self,
        *,
        eager: bool = True,
        registry: Registry | None = None,
        start: float | None = None,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.eager = eager
        self.clock = _Clock(time.time() if start is None else start)
        self._registry = registry
        self._config = RuntimeConfig(**{**TEST_CONFIG, **(config or {})})
        self.loop: asyncio.AbstractEventLoop  # (made at the start: a loop never run is no leak)
        self._thread: threading.Thread
        self._asgi: httpx.ASGITransport | None = None
        self._service: Service | None = None
        self.client = Client(BASE_URL, transport=_Transport(self))
        self.async_client = AsyncClient(BASE_URL, transport=_AsyncTransport(self))
        self._sender = _EagerClient(self)
        self._async_sender = _EagerAsyncClient(self)
        self._source = _Source(self)
        self._before: set[threading.Thread] = set()  # the threads there were at the start
        self._on = self._started = False

    @property
    def service(self) -> Service:
        """The runtime (started on enter)."""
        if self._service is None:
            raise RuntimeError("the test queue is not started: use it as `with immediate():`")
        return self._service

    # -- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Start the service on its own loop and thread, and take over ``.send()``."""
        if self._started:
            raise RuntimeError("a test queue starts once (its clients close at its stop)")
        self._started = True
        self._before = set(threading.enumerate())
        self.loop = self.clock.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="sqlq-testing", daemon=True)
        self._thread.start()
        try:
            self._call(self._open())
        except BaseException:
            self._close_loop()
            raise
        self._on = True
        tasks._sources.append(self._source)

    def stop(self) -> None:
        """Give ``.send()`` back, stop the service, and end every thread and loop the queue
        made; the clients close. A job still running is cancelled at once (``ctx.cancelled``;
        an async handler's task cancelled), with no grace: a grace on a clock that cannot
        move while a plain handler runs would never end, and nobody is left to see the job
        finish."""
        if not self._on:
            return
        self._on = False
        if self._source in tasks._sources:
            tasks._sources.remove(self._source)
        try:
            self._call(self._close())
        finally:
            self._close_loop()
            for client in (self.client, self._sender):
                client.close()
            self._join_handlers()

    async def _open(self) -> None:
        store = make_store("memory", "", clock=self.clock)
        self._service = Service(store, self._config, kinds=self._registry, clock=self.clock)
        self._asgi = httpx.ASGITransport(app=create_app(self._service, start_runtime=False,
                                                        ui=None))  # fmt: skip
        await self._service.start()

    async def _close(self) -> None:
        try:
            await self.service.stop(0.0)
        finally:
            for client in (self.async_client, self._async_sender):
                await client.aclose()
            await self.loop.shutdown_asyncgens()
            await self.loop.shutdown_default_executor()

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def _close_loop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
        self.loop.close()

    def _join_handlers(self) -> None:
        """Join the threads plain handlers ran in (the service shut their pool down without
        waiting); one still running past ``JOIN_S`` is a handler that never returns."""
        made = [t for t in threading.enumerate() if t not in self._before]
        deadline = time.monotonic() + JOIN_S
        for thread in made:
            if thread.name.startswith(HANDLER_THREADS):
                thread.join(max(0.0, deadline - time.monotonic()))
                if thread.is_alive():
                    raise RuntimeError(f"a handler still runs in {thread.name} after the test "
                                       "queue stopped (does it ignore ctx.cancelled?)")  # fmt: skip

    # -- driving the clock -------------------------------------------------------------

    def run_until_idle(self, within: float = HORIZON_S) -> None:
        """Run the jobs until none can run any more: each has finished, or is held (its
        queue paused), the clock moving as it must (retries, snoozes, delays);
        ``TimeoutError`` if jobs still move after ``within`` seconds of the clock."""
        live = self.service.live
        self._call(self._run_until(lambda: len(live) == 0, within, "the jobs"))

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` forward, each timer firing at its own instant and what
        it wakes running there; returns once all of it has run."""
        if seconds < 0:
            raise ValueError("the clock moves only forward")
        self._call(self._advance(seconds))

    async def _advance(self, seconds: float) -> None:
        clock = self.clock
        until = clock.monotonic() + seconds
        await clock.idle()
        while (at := self._next_move()) is not None and at <= until:
            clock.advance(at - clock.monotonic())
            await clock.idle()
        clock.advance(max(0.0, until - clock.monotonic()))
        await clock.idle()

    async def _run_until(self, done: Callable[[], bool], within: float, what: str) -> bool:
        """Move the clock until ``done()``: True; False once nothing more can happen;
        ``TimeoutError`` if neither within ``within`` seconds of the clock."""
        clock = self.clock
        until = clock.monotonic() + within
        while True:
            await clock.idle()
            if done():
                return True
            at = self._next_move()
            if at is None:
                return False
            if at > until:
                raise TimeoutError(f"{what}: not finished after {within:g} s of the test clock")
            clock.advance(at - clock.monotonic())

    def _next_move(self) -> float | None:
        """The monotonic instant at which something can happen next (None: nothing can),
        asked while the loop is idle (``_Clock.idle``).

        While a job runs (an async handler waits, on the clock or not) it is the next
        deadline, whatever it is: the health loop's tick judges its limits there. While
        none does, it is the next job due or schedule tick: every timer before it fires in
        order on the way (the health loop's ticks judge nothing then), so a retry an hour
        away is one move, not 3,600 ticks. A job due now that does not run is held (a
        paused queue): nothing moves it."""
        clock = self.clock
        service = self.service
        if service.live.counts[State.RUNNING]:
            return clock.next_deadline()
        now = clock.time()
        due_at = [j.ready_at for j in service.live.jobs.values()
                  if j.state is State.SCHEDULED and j.ready_at > now]  # fmt: skip
        tick = service.ticker.next_at()
        next_at = min([*due_at, *([] if tick is None or tick <= now else [tick])], default=None)
        return None if next_at is None else clock.monotonic() + (next_at - now)

    async def _settle(self) -> None:
        """An eager send's wait: the clock moves until no job can run any more."""
        live = self.service.live
        try:
            await self._run_until(lambda: len(live) == 0, HORIZON_S, "the jobs")
        except TimeoutError:
            pass  # (sent all the same: a handle's result() says its job did not finish)

    def _nested(self) -> bool:
        """Whether this thread runs a job's handler (or the queue's loop): a send there is
        a job sending another, which the drive already under way runs."""
        thread = threading.current_thread()
        return thread is self._thread or thread.name.startswith(HANDLER_THREADS)

    # -- the loop's side of the clients -------------------------------------------------

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro`` run on the queue's loop, from any other thread; its result."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a blocking call to the test queue from its own loop (an async "
                               "handler's .send()?): use .asend()")  # fmt: skip
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def _acall(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro`` run on the queue's loop, awaited from any loop (its own included)."""
        if asyncio.get_running_loop() is self.loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def _exchange(self, request: httpx.Request) -> _Answer:
        """One request through the real app, on the loop; a long poll (``?wait=``) runs the
        clock while it waits, as its server's time would pass."""
        if self._asgi is None or not self._on:
            raise httpx.ConnectError("the test queue is stopped", request=request)
        try:
            wait = wait_seconds(request.url.params)  # (read as the server reads it)
        except ValidationError:
            wait = 0.0  # (the server's 422)
        if wait > 0:
            response = await self._long_poll(self._asgi.handle_async_request(request), wait)
        else:
            response = await self._asgi.handle_async_request(request)
        try:
            body = b"".join([chunk async for chunk in response.aiter_raw()])
        finally:
            await response.aclose()
        return response.status_code, response.headers.multi_items(), body

    async def _long_poll(self, answer: Awaitable[T], wait: float) -> T:
        """A ``?wait=`` request's answer, the clock moving meanwhile as ``_run_until`` moves
        it, as the server's time would pass; once nothing more can happen, straight to the
        end of the wait (``MAX_WAIT_S`` at most), where the server answers with the job as
        it stands."""
        clock = self.clock
        task = asyncio.ensure_future(answer)
        ends = clock.monotonic() + min(wait, MAX_WAIT_S)
        try:
            while not task.done():
                await clock.idle()
                if task.done():
                    break
                at = self._next_move()
                clock.advance(max(0.0, min(ends if at is None else at, ends) - clock.monotonic()))
            return await task
        finally:
            task.cancel()  # (a no-op once done: a caller gone stops its request)


_Answer = tuple[int, list[tuple[str, str]], bytes]


def _copy(request: httpx.Request, body: bytes) -> httpx.Request:
    """``request`` with its body read: what the ASGI transport takes from any thread."""
    return httpx.Request(request.method, request.url, headers=request.headers, content=body,
                         extensions=request.extensions)  # fmt: skip


class _Transport(httpx.BaseTransport):
    """A ``Client``'s requests handed to the app on the queue's loop (no socket)."""

    def __init__(self, queue: TestQueue) -> None:
        self._queue = queue

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        status, headers, body = self._queue._call(
            self._queue._exchange(_copy(request, request.read()))
        )
        return httpx.Response(status, headers=headers, content=body)


class _AsyncTransport(httpx.AsyncBaseTransport):
    """An ``AsyncClient``'s requests handed to the app on the queue's loop, awaited."""

    def __init__(self, queue: TestQueue) -> None:
        self._queue = queue

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        status, headers, content = await self._queue._acall(
            self._queue._exchange(_copy(request, body))
        )
        return httpx.Response(status, headers=headers, content=content)


class _EagerClient(Client):
    """``send``'s client while eager: a submit returns once no job can run any more (its
    job finished, and every job it sent)."""

    def __init__(self, queue: TestQueue) -> None:
        super().__init__(BASE_URL, transport=_Transport(queue))
        self._queue = queue

    def submit(self, *args: Any, **kwargs: Any) -> JobView:
        job = super().submit(*args, **kwargs)
        self._queue._call(self._queue._settle())
        return job

    def submit_workflow(self, *args: Any, **kwargs: Any) -> BatchResult:
        done = super().submit_workflow(*args, **kwargs)
        self._queue._call(self._queue._settle())
        return done


class _EagerAsyncClient(AsyncClient):
    """``asend``'s client while eager."""

    def __init__(self, queue: TestQueue) -> None:
        super().__init__(BASE_URL, transport=_AsyncTransport(queue))
        self._queue = queue

    async def submit(self, *args: Any, **kwargs: Any) -> JobView:
        job = await super().submit(*args, **kwargs)
        await self._queue._acall(self._queue._settle())
        return job

    async def submit_workflow(self, *args: Any, **kwargs: Any) -> BatchResult:
        done = await super().submit_workflow(*args, **kwargs)
        await self._queue._acall(self._queue._settle())
        return done


class _Source:
    """What ``Task.send`` asks for its client while the queue is on (``task._sources``)."""

    def __init__(self, queue: TestQueue) -> None:
        self._queue = queue

    def client(self) -> Client:
        q = self._queue
        return q._sender if q.eager and not q._nested() else q.client

    def async_client(self) -> AsyncClient:
        q = self._queue
        return q._async_sender if q.eager and not q._nested() else q.async_client


def immediate(
    *,
    eager: bool = True,
    registry: Registry | None = None,
    start: float | None = None,
    **config: Any,
) -> TestQueue:
    """A queue in this process that runs every ``.send()`` made while it is on (``with``).

    ``eager``: ``.send()`` returns once its job finished (else at once; see the module's
    docstring). ``registry``: the tasks it runs (default: every ``@task`` of the default
    registry, as ``sqlq serve --import`` has them). ``start``: the clock's first wall-clock
    second (default: now). ``config``: ``RuntimeConfig``'s fields, the server's settings
    (``max_attempts``, ``retry``, ``max_snoozes``, ``cancel_grace_s``, ``queue_caps``,
    ``workers``, ...).
    """
    return TestQueue(eager=eager, registry=registry, start=start, config=config)


# -- a handler on its own ----------------------------------------------------------------


class TestContext(JobContext):
    """A ``JobContext`` that records what its handler did with it (``context()``).

    Everything a handler reads is the real context's: ``job``, ``checkpoint_data``,
    ``cancelled``, ``raise_if_cancelled``, ``clock``, ``rng``, ``latest_progress``, and
    ``progress`` is the real one (it checks and keeps the latest). What it writes is kept
    here instead of in a store: ``progress_reports`` (every report, in order),
    ``checkpoints`` (every value saved, checked as the server checks it), ``beats``, and
    ``snoozed`` (the seconds a handler ``call``ed through this context asked for).
    """

    __test__ = False  # (pytest: not a test class)
    __slots__ = ("beats", "checkpoints", "fenced", "progress_reports", "snoozed")

    def __init__(self, job: Job, rng: random.Random, **kwargs: Any) -> None:
        super().__init__(job, rng, **kwargs)
        self.progress_reports: list[Progress] = []
        self.checkpoints: list[JSON] = []
        self.beats = 0
        self.snoozed: float | None = None
        self.fenced = False  # ``fence()``: the attempt lost its job; a checkpoint is refused

    def beat(self) -> None:
        super().beat()
        self.beats += 1

    def progress(self, percent: float | None = None, message: str | None = None) -> None:
        super().progress(percent, message)
        latest = self.latest_progress
        assert latest is not None  # (just kept, or it raised)
        self.progress_reports.append(latest)

    def checkpoint(self, data: JSON) -> Awaitable[None]:
        """Keep ``data`` in ``checkpoints`` (``ValueError`` if the server would refuse it;
        ``AttemptFenced`` after ``fence()``); awaitable, as the real one is."""
        value = check_checkpoint(data)
        if self.fenced:
            raise AttemptFenced("this attempt no longer holds its job (fence())")
        self.checkpoints.append(value)
        return Done()

    def cancel(self) -> None:
        """A cancel of the job is asked for: ``cancelled`` is True and
        ``raise_if_cancelled`` raises. (An async handler's task is not cancelled: cancel
        the task that awaits it to test that.)"""
        self.cancelled = True

    def fence(self) -> None:
        """The attempt no longer holds its job: its next checkpoint raises ``AttemptFenced``."""
        self.fenced = True

    def call(self, handler: Task[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``handler`` run as a worker runs it: its arguments (``args``/``kwargs``, else
        the context's job's ``args``) checked by its signature (``sqlq.Invalid`` naming
        the field, as at ``.send``), this context passed; a ``Snooze`` it raises or
        returns is kept in ``snoozed`` (and returned)."""
        try:
            result = self._start(handler, args, kwargs)
        except Snooze as s:
            return self._snooze(s)
        return self._snooze(result) if isinstance(result, Snooze) else result

    async def acall(self, handler: Task[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``call`` for an async handler, awaited."""
        try:
            result = await self._start(handler, args, kwargs)
        except Snooze as s:
            return self._snooze(s)
        return self._snooze(result) if isinstance(result, Snooze) else result

    def _start(self, handler: Task[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        signature = handler.signature
        if signature is None:  # the older form: fn(args) or fn(args, ctx)
            given = args[0] if args else self.job.args
            two = len(inspect.signature(handler.fn).parameters) >= 2
            return handler.fn(given, self) if two else handler.fn(given)
        try:  # (refused as .send refuses it: sqlq.Invalid, naming the field)
            given = signature.arguments(args, kwargs) if args or kwargs else self.job.args
            signature.check(given)
        except ValidationError as exc:
            raise Invalid(422, "invalid", exc.message, exc.field) from None
        return signature.call(handler.fn, given, self)

    def _snooze(self, s: Snooze) -> Snooze:
        self.snoozed = s.seconds
        return s


def context(
    *,
    args: JSON = None,
    kind: str = "test",
    attempt: int = 1,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    checkpoint_data: JSON = None,
    queue: str = "default",
    clock: Clock | None = None,
    seed: int = 0,
    timeout: float | None = None,
) -> TestContext:
    """A ``JobContext`` double for a handler called on its own: the running job it sees
    (``args``, ``attempt`` of ``max_attempts``, the ``checkpoint_data`` an earlier attempt
    saved), on ``clock`` (default: a ``FakeClock`` at the real time now, which moves only
    by ``clock.advance``), with ``rng`` seeded by ``seed``."""
    clock = clock or FakeClock(time.time())
    now = clock.time()
    job = Job(id=new_job_id(now), kind=kind, args={} if args is None else args,
              state=State.RUNNING, attempts=attempt, max_attempts=max_attempts, ready_at=now,
              created_at=now, updated_at=now, started_at=now, queue=queue,
              checkpoint=checkpoint_data)  # fmt: skip
    return TestContext(job, random.Random(seed), clock=clock, timeout=timeout)
