"""``Executor``: how a claimed job runs, by its kind.

Workers get a claim from ``Claims`` and hand the job here: the executor looks
its kind up, gives the handler a ``JobContext`` carrying that kind's limits
(heartbeat timeout and timeout, with "server" resolved to ``--hb-timeout``) and
the pool plain handlers run in, and runs it. Where the job came from and where
its outcome goes is the business of ``Claims``, not of this module.

A plain (sync) handler runs in a thread of ``HandlerThreads``, or, given worker
processes (``sqlq serve --processes P``: ``ProcessHandlers``), in one of them, so
CPU-bound Python uses every core instead of one GIL. The attempt is the same either
way: the context's progress and checkpoints reach the claims from the process, a
cancel asked for raises the process's flag (``interrupt``), its heartbeats reach the
health loop (``observed``), and a cut-off attempt's process is told to stop, then
killed and replaced.

A result is held to the bounds every stored value keeps (``sqlq.common.shape``:
depth and items) before it goes anywhere: one nested past ``MAX_DEPTH`` could
be stored but not read back on a deeper stack, so it fails its attempt like a
result JSON cannot encode, and the store never sees it.
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING, Any

import msgspec

from sqlq.common.backoff import NO_RULES, Failure
from sqlq.common.clock import Clock
from sqlq.common.models import JSON, NO_ARGS, Job
from sqlq.common.shape import ShapeError, measure
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.context import (
    Channel,
    Described,
    NotStarted,
    UnstorableResult,
    describe,
    format_traceback,
)
from sqlq.runtime.cpu import CpuPool, cpu_kind
from sqlq.runtime.kinds import JobContext, Kind, Registry, sleep_kind
from sqlq.runtime.processes import Child, ProcessHandlers
from sqlq.runtime.spawn import Spawn
from sqlq.runtime.task import InvalidArgs
from sqlq.runtime.threads import HandlerThreads

if TYPE_CHECKING:
    from sqlq.runtime.claim import Claim


def build_registry(user: Registry, *, fault_injection: bool, cpu: CpuPool) -> Registry:
    """The kinds a server runs: the user's ``@task`` handlers plus the built-in ones.

    A user kind named like a built-in one (``sleep``, ``cpu``) takes its place.
    """
    kinds = Registry()
    for name in user.names():
        kinds.register(user.get(name))
    for builtin in (sleep_kind(fault_injection=fault_injection), cpu_kind(cpu)):
        if builtin.name not in kinds:
            kinds.register(builtin)
    return kinds


class Executor:
    def __init__(
        self,
        kinds: Registry,
        config: RuntimeConfig,
        *,
        rng: random.Random,
        clock: Clock,
        processes: ProcessHandlers | None = None,
    ) -> None:
        self.kinds = kinds
        self.processes = processes
        self._in_child: dict[JobContext, Child] = {}  # attempts running in a process
        self._waiting: dict[JobContext, asyncio.Future[None]] = {}  # ... waiting for one
        self._holding = False  # the pool stops: nothing more starts in a process
        self.threads = HandlerThreads(
            (config.handler_threads or config.workers) + config.max_abandoned
        )
        self._server_hb = config.hb_timeout_s
        self._rng = rng
        self._clock = clock
        # Per kind: (heartbeat timeout, timeout) in seconds, "server" resolved, and whether
        # a cancel cancels its task.
        self._limits = {name: self._resolve(kinds.get(name)) for name in kinds.names()}

    def _resolve(self, kind: Kind) -> tuple[float | None, float | None, bool]:
        hb = self._server_hb if kind.hb_timeout_s == "server" else kind.hb_timeout_s
        return hb, kind.timeout_s, kind.interruptible

    def context(
        self, job: Job, claim: Claim | None = None, channel: Channel | None = None
    ) -> JobContext:
        """The handler's context, with the limits of its kind (unknown kind: the server's),
        writing through ``channel`` (the claims) for ``claim``."""
        hb, timeout, interruptible = self._limits.get(job.kind, (self._server_hb, None, True))
        return JobContext(job, self._rng, clock=self._clock, threads=self.threads, hb_timeout=hb,
                          timeout=timeout, claim=claim, channel=channel,
                          interruptible=interruptible)  # fmt: skip

    def failure(self, job: Job, exc: BaseException) -> Failure:
        """How an attempt of ``job`` that raised ``exc`` failed: its text, its traceback,
        and its task's rules (``TaskRetry``): arguments that can never be its handler's are
        final; the rest as the task says (a worker process's verdict comes with ``exc``)."""
        kind = self.kinds.get(job.kind) if job.kind in self.kinds else None
        rules = NO_RULES if kind is None else kind.rules
        if isinstance(exc, Described):
            retried = exc.retry
        else:
            retried = not isinstance(exc, InvalidArgs) and rules.retries(exc)
        tb = format_traceback(exc) or None
        return rules.failure(describe(exc), tb, retried, job.attempts, self._rng)

    async def execute(self, job: Job, ctx: JobContext) -> JSON:
        """Run the job's handler; an unknown kind (its module not imported) or a result
        past the bounds of a stored value fails the attempt."""
        kind = self.kinds.get(job.kind)
        procs = self.processes
        if procs is not None and not kind.interruptible:  # a plain handler: in a process
            return await self._in_process(procs, job, ctx)
        args = job.args
        if args is NO_ARGS:  # the one shared empty dict: a handler gets its own to write into
            args = {}
        result = await kind.run(args, ctx)
        try:
            # (a spawn's jobs are checked as a batch's are, where they are made)
            measure(result.result if type(result) is Spawn else result)
        except ShapeError as exc:
            raise UnstorableResult(f"the result {exc}") from None
        return result

    async def _in_process(self, procs: ProcessHandlers, job: Job, ctx: JobContext) -> JSON:
        """Run ``job`` in a free worker process (waiting for one is not running: the
        attempt's clock starts when a process takes it); the child checks the bounds."""
        # Waiting for a process is not running: neither its timeout nor its heartbeat is
        # judged meanwhile (a forced cancel's grace is: it sets ``deadline`` and ``forced``).
        asked = self._clock.monotonic()
        deadline, hb_timeout = ctx.deadline, ctx.hb_timeout
        ctx.deadline = ctx.hb_timeout = None
        try:
            child = await self._a_process(procs, ctx)
        finally:
            now = self._clock.monotonic()
            ctx.hb_timeout = hb_timeout
            if not ctx.forced:  # its timeout runs from here
                ctx.deadline = None if deadline is None else deadline + (now - asked)
            ctx.last_beat = now
        self._in_child[ctx] = child
        try:
            raw = await procs.run(child, job, ctx)
        finally:
            del self._in_child[ctx]
        if isinstance(raw, Spawn):
            return raw
        result: JSON = msgspec.json.decode(raw)
        return result

    async def _a_process(self, procs: ProcessHandlers, ctx: JobContext) -> Child:
        """A free process for ``ctx``'s job; ``NotStarted`` if a cancel (``interrupt``) or
        the stop (``hold``) comes first: the job has not started, so it is given back."""
        if ctx.cancelled or self._holding:
            raise NotStarted("given back before it started")
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[ctx] = wake
        acquiring = asyncio.ensure_future(procs.acquire())
        child: Child | None = None
        try:
            either: set[asyncio.Future[Any]] = {acquiring, wake}
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if acquiring.done():
                child = acquiring.result()
        finally:
            del self._waiting[ctx]
            if not acquiring.done():
                acquiring.cancel()
            elif child is None and not acquiring.cancelled() and acquiring.exception() is None:
                procs.release(acquiring.result())  # (this task was cancelled as it came)
        if child is None or ctx.cancelled or self._holding:
            if child is not None:
                procs.release(child)  # spare: the job is given back
            raise NotStarted("given back before it started")
        return child

    def waiting(self, ctx: JobContext) -> bool:
        """Whether the attempt behind ``ctx`` still waits for a process (has not started)."""
        return ctx in self._waiting

    def hold(self) -> None:
        """Start nothing more in a process: what waits for one is given back (a stop)."""
        self._holding = True
        for wake in self._waiting.values():
            if not wake.done():
                wake.set_result(None)

    def interrupt(self, ctx: JobContext) -> None:
        """A cancel was asked for the attempt behind ``ctx``: its process hears of it too,
        or, if it waits for one, it is given back."""
        wake = self._waiting.get(ctx)
        if wake is not None and not wake.done():
            wake.set_result(None)
        child = self._in_child.get(ctx)
        if child is not None and self.processes is not None:
            self.processes.interrupt(child)

    def observed(self, ctx: JobContext) -> None:
        """``ctx`` brought up to date with what its process reported (its last beat)."""
        child = self._in_child.get(ctx)
        if child is not None and self.processes is not None:
            ctx.last_beat = max(ctx.last_beat, self.processes.last_beat(child))

    async def start(self) -> None:
        """Start the worker processes (their imports done), if there are any."""
        if self.processes is not None:
            await self.processes.start()

    async def close(self) -> None:
        if self.processes is not None:
            await self.processes.close()
        self.threads.shutdown()

    def shutdown(self) -> None:
        self.threads.shutdown()
