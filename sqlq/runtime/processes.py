"""Plain (sync) handlers in worker processes: ``sqlq serve --processes P`` and ``sqlq worker
--processes P`` alike (the executor runs a plain kind's job here when there are processes).

A CPU-bound Python handler in a thread holds the GIL, so however many threads run, it
uses one core. Here each of P long-lived child processes (started with ``spawn``: the
parent has an event loop and HTTP connections that a fork would copy) imports the
``--import`` modules once and runs one job at a time; a job costs one message each way
on its pipe (the job as msgpack, the result as the JSON bytes its outcome carries), so
nothing is spawned or imported per job.

What a handler's ``ctx`` does in a child:

- ``progress(percent, message)``: checked as in the server (``ValueError``), sent to the
  parent at most every ``PROGRESS_EVERY_S`` and always with the result; the parent
  reports it in its next heartbeat.
- ``cancelled`` / ``raise_if_cancelled()``: a flag in shared memory the parent raises
  when a cancel is asked for, or when the attempt is over here (timed out, fenced, the
  worker stopping).
- ``checkpoint(data)``: sent to the parent, which saves it (``/claims/checkpoint``);
  the call blocks until it is durable, as in a thread (``AttemptFenced`` if fenced).
- ``beat()``: a timestamp in shared memory, which the health loop reads (``hb_timeout``).
- ``job``, ``checkpoint_data``, ``rng``, ``clock`` (the system's) as in the server.
- ``parents``: a workflow member's first page of them (up to 1,000), as in the server;
  ``complete`` is False past it, and ``rest()`` reads no more from a process.

An attempt cut off (timeout, fenced, stopping past the grace) raises its flag; a child
still running ``KILL_AFTER_S`` later is killed and replaced, so a stuck handler frees
its core instead of holding it as an abandoned thread does. The children ignore SIGINT
and SIGTERM: the parent decides when they stop.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import multiprocessing
import os
import random
import signal
import threading
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, cast

import msgspec

from sqlq.common.backoff import NO_RULES, TaskRetry
from sqlq.common.clock import SYSTEM_CLOCK
from sqlq.common.errors import RateLimited, SqlqError
from sqlq.common.models import JSON, Job
from sqlq.common.protocol import ParentsPage
from sqlq.common.running import check_checkpoint, check_progress, clean_traceback
from sqlq.common.shape import ShapeError, measure
from sqlq.runtime.context import (
    AttemptFenced,
    Described,
    Done,
    JobContext,
    Snooze,
    UnstorableResult,
    describe,
    format_traceback,
    limited_for,
)
from sqlq.runtime.kinds import REGISTRY
from sqlq.runtime.parents import Parents
from sqlq.runtime.spawn import Spawn
from sqlq.runtime.task import InvalidArgs
from sqlq.runtime.threads import HandlerThreads

log = logging.getLogger("sqlq.worker")

PROGRESS_EVERY_S = 0.2  # a child sends progress at most this often (the latest counts)
PER_WAKE = 64  # messages read from a child before the loop runs anything else
MAX_LOG_LINE = 16 * 1024  # characters of one log record a child sends (its traceback too)
KILL_AFTER_S = 2.0  # a child told to stop that still runs this long is killed
READY_WITHIN_S = 120.0  # a child imports the handlers' modules within this, or start fails

_encode = msgspec.json.Encoder().encode
_SPAWN = msgspec.json.Decoder(Spawn)
_pack = msgspec.msgpack.Encoder().encode
_unpack = msgspec.msgpack.Decoder(Job).decode
_unpack_parents = msgspec.msgpack.Decoder(ParentsPage | None).decode
_unpack_page = msgspec.msgpack.Decoder(ParentsPage).decode
_RNG = random.Random()  # a child's handlers' ``ctx.rng``


class ProcessStartError(SqlqError):
    """A worker process could not start: its ``--import`` failed, or it died first."""


class ChildFailed(Described):
    """The handler in a child failed; ``str()`` is its error as the server would say it."""


# -- the child's side ----------------------------------------------------------------------


class _Inline(HandlerThreads):
    """``ctx.threads`` in a child: the handler runs in the child's own thread, no pool."""

    def __init__(self) -> None:
        super().__init__(1)

    async def run(self, fn: Any) -> Any:
        return fn()


class ChildContext(JobContext):
    """A handler's ``ctx`` in a worker process (what it supports: the module's docstring)."""

    __slots__ = ("_conn", "_flags", "_index", "_last_sent", "_lock", "_stamps", "_unsent")

    def __init__(self, job: Job, conn: Connection, lock: threading.Lock, flags: Any,
                 stamps: Any, index: int, threads: HandlerThreads) -> None:  # fmt: skip
        self._conn, self._lock, self._flags = conn, lock, flags
        self._stamps, self._index = stamps, index
        self._unsent: tuple[float | None, str | None] | None = None
        self._last_sent = 0.0
        super().__init__(job, _RNG, clock=SYSTEM_CLOCK, threads=threads, interruptible=False)

    @property
    def cancelled(self) -> bool:
        return bool(self._flags[self._index])

    @cancelled.setter
    def cancelled(self, value: bool) -> None:
        if value:
            self._flags[self._index] = 1

    def beat(self) -> None:
        self.last_beat = time.monotonic()
        self._stamps[self._index] = self.last_beat

    def progress(self, percent: float | None = None, message: str | None = None) -> None:
        p = check_progress(percent, message, time.time())
        self._progress = p
        self._unsent = (p.percent, p.message)
        now = time.monotonic()
        if now - self._last_sent >= PROGRESS_EVERY_S:
            self._last_sent = now
            with self._lock:
                self._conn.send(("progress", *self._unsent))
            self._unsent = None

    def unsent(self) -> tuple[float | None, str | None] | None:
        return self._unsent

    def page(self, start: int) -> ParentsPage:
        """A page of the job's parents past the first (``ctx.parents.pages()``), asked of
        the parent process, which reads it as its own handler would."""
        with self._lock:
            self._conn.send(("parents", start))
            answer, value = self._conn.recv()
        if answer == "fenced":
            raise AttemptFenced(value)
        if answer != "page":
            raise RuntimeError(f"ctx.parents: {value}")
        page: ParentsPage = _unpack_page(value)
        return page

    def checkpoint(self, data: JSON) -> Done:
        value = check_checkpoint(data)
        with self._lock:
            self._conn.send(("checkpoint", _encode(value)))
            answer, text = self._conn.recv()
        if answer == "fenced":
            raise AttemptFenced(text)
        if answer == "invalid":
            raise ValueError(text)
        return Done()


def _outcome(job: Job, ctx: ChildContext) -> tuple[Any, ...]:
    """Run one job's handler (a plain one: its ``run`` never suspends, so it is driven
    by hand, with no event loop running, as in a thread) and say how it ended."""
    try:
        coro = cast("Coroutine[Any, Any, Any]", REGISTRY.get(job.kind).run(job.args, ctx))
        try:
            coro.send(None)
        except StopIteration as done:
            result = done.value
        else:
            coro.close()
            raise TypeError(f"kind {job.kind!r} is not a plain function: it cannot run here")
    except Snooze as s:
        return ("snooze", s.seconds, ctx.unsent())
    except RateLimited as r:
        return ("snooze", limited_for(r), ctx.unsent(), True)
    except AttemptFenced as exc:
        return ("fenced", str(exc), ctx.unsent())
    except Exception as exc:  # its traceback, and whether its task retries it, from here
        retries = not isinstance(exc, InvalidArgs) and _rules(job.kind).retries(exc)
        tb = clean_traceback(format_traceback(exc))  # (cut here: the pipe carries no more)
        return ("error", describe(exc), ctx.unsent(), tb, retries)
    if type(result) is Snooze:
        return ("snooze", result.seconds, ctx.unsent())
    spawns = type(result) is Spawn
    try:
        measure(result.result if spawns else result)
        raw = _encode(result)
    except ShapeError as exc:
        return ("error", describe(UnstorableResult(f"the result {exc}")), ctx.unsent())
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError) as exc:
        return ("error", f"result is not JSON-serialisable: {exc}", ctx.unsent())
    return ("spawn" if spawns else "done", raw, ctx.unsent())


def _rules(kind: str) -> TaskRetry:
    return REGISTRY.get(kind).rules if kind in REGISTRY else NO_RULES


class _ToParent(logging.Handler):
    """A child's log records, sent to the parent, which logs them as its own, tagged with
    the job that was running (``ProcessHandlers._log``): a handler's ``logging`` lines
    would otherwise go nowhere (a spawned child has no handlers of its own)."""

    def __init__(self, conn: Connection, lock: threading.Lock) -> None:
        super().__init__(logging.DEBUG)
        self._conn, self._lock = conn, lock

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
            if record.exc_info:
                text += "\n" + logging.Formatter().formatException(record.exc_info)
            with self._lock:
                self._conn.send(("log", record.name, record.levelno, text[:MAX_LOG_LINE]))
        except Exception:  # a record that cannot go is dropped, never the job
            pass


def _die_with_parent() -> None:
    """Linux: killed when the worker dies (kill -9 included), so a handler stuck in a loop
    is not left running with nobody to report to (elsewhere: it ends when it next talks
    to the parent, whose pipe is gone)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover (not Linux)
        pass


def child_main(conn: Connection, imports: Sequence[str], flags: Any, stamps: Any,
               index: int, level: int = logging.INFO) -> None:  # fmt: skip
    """A worker process: import the handlers, then run the jobs the parent sends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    for name in imports:
        try:
            importlib.import_module(name)
        except BaseException as exc:
            conn.send(("failed", f"--import {name}: {describe(exc)}"))
            return
    lock, inline = threading.Lock(), _Inline()
    root = logging.getLogger()
    root.handlers[:] = [_ToParent(conn, lock)]
    root.setLevel(level)
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if message[0] != "run":
            return
        job, first = _unpack(message[1]), _unpack_parents(message[2])
        ctx = ChildContext(job, conn, lock, flags, stamps, index, inline)
        if first is not None:  # a workflow member's first page; the rest asked for
            ctx.parents = Parents(first, fetch=ctx.page)
        reply = _outcome(job, ctx)
        try:
            with lock:
                conn.send(reply)
        except (BrokenPipeError, OSError):
            return


# -- the parent's side -----------------------------------------------------------------------


@dataclass(eq=False)
class Child:
    index: int
    process: Any  # multiprocessing.Process (of the spawn context)
    conn: Connection
    pid: int = 0
    ready: asyncio.Future[None] | None = None
    reply: asyncio.Future[tuple[Any, ...]] | None = None  # the running job's end
    ctx: JobContext | None = None  # the parent's context of the running job
    kill: asyncio.TimerHandle | None = None
    saves: list[asyncio.Task[None]] = field(default_factory=list)


class ProcessHandlers:
    """P worker processes, and which of them is free."""

    def __init__(self, size: int, imports: Sequence[str], *, start_method: str = "spawn") -> None:
        self.size = size
        self.imports = tuple(imports)
        self._mp: Any = multiprocessing.get_context(start_method)
        self._flags: Any = self._mp.RawArray("b", size)
        self._stamps: Any = self._mp.RawArray("d", size)
        self._children: list[Child | None] = [None] * size
        self._free: asyncio.Queue[Child] = asyncio.Queue()
        self._closed = False
        self.started = 0  # processes started, replacements included
        self.pids_seen: set[int] = set()

    async def start(self) -> None:
        """Start every process and wait until each has imported the handlers."""
        for i in range(self.size):
            self._spawn(i)
        ready = [c.ready for c in self._children if c is not None and c.ready is not None]
        try:
            async with asyncio.timeout(READY_WITHIN_S):
                await asyncio.gather(*ready)
        except TimeoutError:
            raise ProcessStartError(
                f"worker processes did not import {', '.join(self.imports) or 'sqlq'} "
                f"within {READY_WITHIN_S:g} s"
            ) from None

    def _spawn(self, index: int) -> Child:
        mine, theirs = self._mp.Pipe()
        process = self._mp.Process(
            target=child_main, args=(theirs, self.imports, self._flags, self._stamps, index,
                                     logging.getLogger().getEffectiveLevel()),
            name=f"sqlq-worker-{index}", daemon=True,
        )  # fmt: skip
        process.start()
        theirs.close()
        loop = asyncio.get_running_loop()
        child = Child(index, process, mine, ready=loop.create_future())
        self._children[index] = child
        self.started += 1
        loop.add_reader(mine.fileno(), self._readable, child)
        return child

    def pids(self) -> list[int]:
        return [c.pid for c in self._children if c is not None and c.pid]

    async def acquire(self) -> Child:
        """A free process (waits for one: that job has not started)."""
        while True:
            child = await self._free.get()
            if not child.conn.closed:
                return child  # (one that died idle is replaced: its replacement comes)

    def release(self, child: Child) -> None:
        """``child`` acquired, and not needed after all."""
        self._free.put_nowait(child)

    def last_beat(self, child: Child) -> float:
        return float(self._stamps[child.index])

    def interrupt(self, child: Child) -> None:
        """Raise the child's ``ctx.cancelled``."""
        self._flags[child.index] = 1

    async def run(self, child: Child, job: Job, ctx: JobContext) -> msgspec.Raw | Spawn:
        """Run ``job`` in ``child``; its result as JSON, or its end raised (``Snooze``,
        ``AttemptFenced``, ``ChildFailed``). Cancelled: the child is told to stop, and
        killed if it has not within ``KILL_AFTER_S``."""
        loop = asyncio.get_running_loop()
        if child.reply is not None:  # one job at a time: a second's end would be the first's
            log.error("worker process %d was handed job %s while it ran another (a bug): "
                      "the job fails instead", child.pid, job.id)  # fmt: skip
            raise ChildFailed("the worker process was busy with another job")
        self._flags[child.index] = 0
        self._stamps[child.index] = time.monotonic()
        child.reply, child.ctx = loop.create_future(), ctx
        if ctx.cancelled:
            self._flags[child.index] = 1
        try:
            child.conn.send(("run", _pack(job), _pack(ctx.parents.first)))
            reply = await asyncio.shield(child.reply)  # (a cancel leaves it to the child)
        except asyncio.CancelledError:
            self._flags[child.index] = 1
            if child.reply is not None and not child.reply.done() and child.kill is None:
                child.kill = loop.call_later(KILL_AFTER_S, self._kill, child)
            raise
        except OSError as exc:  # its pipe broke: it died
            raise ChildFailed(f"the worker process died: {exc}") from None
        what = reply[0]
        if what == "done":
            return msgspec.Raw(reply[1])
        if what == "spawn":
            return _SPAWN.decode(reply[1])
        if what == "snooze":
            if len(reply) > 3:  # (a RateLimited: as the handler raised it, bounded)
                raise RateLimited(reply[1])
            raise Snooze(reply[1])
        if what == "fenced":
            raise AttemptFenced(reply[1])
        raise ChildFailed(reply[1], reply[3] if len(reply) > 3 else None,
                          reply[4] if len(reply) > 4 else True)  # fmt: skip

    def _readable(self, child: Child) -> None:
        """What ``child`` sent, at most ``PER_WAKE`` messages before the loop's other work
        (a handler that logs a flood waits on its pipe, not the server on it)."""
        try:
            for _ in range(PER_WAKE):
                if not child.conn.poll():
                    break
                self._message(child, child.conn.recv())
        except (EOFError, OSError):
            self._died(child)

    def _message(self, child: Child, message: tuple[Any, ...]) -> None:
        what = message[0]
        if what == "log":
            self._log(child, message[1], message[2], message[3])
            return
        if what == "progress":
            if child.ctx is not None:
                child.ctx.progress(message[1], message[2])
            return
        if what == "parents":
            task = asyncio.get_running_loop().create_task(self._page(child, message[1]))
            child.saves.append(task)
            task.add_done_callback(child.saves.remove)
            return
        if what == "checkpoint":
            task = asyncio.get_running_loop().create_task(self._save(child, message[1]))
            child.saves.append(task)
            task.add_done_callback(child.saves.remove)
            return
        if what == "ready":
            child.pid = message[1]
            self.pids_seen.add(child.pid)
            if child.ready is not None and not child.ready.done():
                child.ready.set_result(None)
            self._free.put_nowait(child)
            return
        if what == "failed":
            if child.ready is not None and not child.ready.done():
                child.ready.set_exception(ProcessStartError(message[1]))
            return
        # The job's end: the child is free for the next one.
        unsent = message[2]
        if unsent is not None and child.ctx is not None:
            child.ctx.progress(*unsent)
        if child.kill is not None:
            child.kill.cancel()
            child.kill = None
        reply, child.reply, child.ctx = child.reply, None, None
        if reply is None:  # (not queued as free again: it may be free, or handed out, already)
            log.error("worker process %d ended a job no attempt waited for (a bug)", child.pid)
            return
        if not reply.done():
            reply.set_result(message)
        self._free.put_nowait(child)

    def _log(self, child: Child, name: str, level: int, text: str) -> None:
        """A child's log record, as this process's, with the job it ran (if any)."""
        logger = logging.getLogger(name)
        if isinstance(level, int) and logger.isEnabledFor(level):
            ctx = child.ctx
            job = f"job {ctx.job.id} ({ctx.job.kind}): " if ctx is not None else ""
            logger.log(level, "%s%s", job, text, extra={"job_id": ctx and ctx.job.id,
                                                        "worker_pid": child.pid})  # fmt: skip

    async def _save(self, child: Child, data: bytes) -> None:
        ctx = child.ctx
        try:
            if ctx is None:
                raise AttemptFenced("the attempt is over")
            await ctx.checkpoint(msgspec.json.decode(data))
        except AttemptFenced as exc:
            answer = ("fenced", str(exc))
        except ValueError as exc:
            answer = ("invalid", str(exc))
        else:
            answer = ("saved", "")
        try:
            child.conn.send(answer)
        except OSError:
            pass

    async def _page(self, child: Child, start: int) -> None:
        """The child asked for a page of its job's parents: read as this process's own
        handler would (``Parents.load``), sent back."""
        ctx = child.ctx
        try:
            if ctx is None:
                raise AttemptFenced("the attempt is over")
            answer: tuple[str, Any] = ("page", _pack(await ctx.parents.load(start)))
        except AttemptFenced as exc:
            answer = ("fenced", str(exc))
        except Exception as exc:  # the read failed: the handler hears why, and decides
            answer = ("failed", describe(exc))
        try:
            child.conn.send(answer)
        except OSError:
            pass

    def _kill(self, child: Child) -> None:
        child.kill = None
        log.warning("worker process %d still running a job it was told to stop: killed",
                    child.pid)  # fmt: skip
        child.process.kill()

    def _died(self, child: Child) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(child.conn.fileno())
        child.conn.close()
        child.process.join(0)
        code = child.process.exitcode
        if child.ready is not None and not child.ready.done():
            child.ready.set_exception(
                ProcessStartError(f"a worker process exited with {code} before it was ready")
            )
            return
        if child.kill is not None:
            child.kill.cancel()
            child.kill = None
        reply, child.reply, child.ctx = child.reply, None, None
        if reply is not None and not reply.done():
            reply.set_result(("error", f"the worker process died (exit code {code})", None))
        if not self._closed:
            self._spawn(child.index)  # a replacement: free once it is ready

    async def close(self) -> None:
        """Stop every process: idle ones exit, busy ones are killed."""
        self._closed = True
        loop = asyncio.get_running_loop()
        for child in self._children:
            if child is None or child.conn.closed:
                continue
            loop.remove_reader(child.conn.fileno())
            if child.kill is not None:
                child.kill.cancel()
            if child.reply is not None:
                child.process.kill()
            else:
                try:
                    child.conn.send(("exit",))
                except OSError:
                    pass
            child.conn.close()
        for child in self._children:
            if child is not None:
                await asyncio.to_thread(_reap, child.process)


def _reap(process: Any) -> None:
    process.join(2.0)
    if process.is_alive():
        process.kill()
        process.join(2.0)
