"""The ``cpu`` job kind: chained SHA-256 in a process pool, with real heartbeats.

``digest = sha256(digest)``, ``rounds`` times, in a separate process so the work
uses every core and never holds the event loop's GIL. The child bumps a shared
counter every 1024 rounds; the worker relays each advance as a heartbeat, so
a long CPU job is alive to the health loop while a stuck one goes silent.

A job first waits for a free process and beats while it waits: with more
workers than cores, jobs queue for a CPU, and queueing is not hanging. Without
that, every job queued behind the pool would be declared hung and requeued,
burning the CPU it was waiting for.

An attempt that ends early (a cancel asked for, a hang, a stop) raises its
process's stop flag; the child looks at it as often as it bumps its counter, so
it stops within 1024 rounds (well within a heartbeat) and its process is free
for the next job, instead of computing a digest nobody will read.
"""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Annotated, Any

import msgspec

from sqlq.common.models import JSON
from sqlq.runtime.kinds import JobContext, Kind, convert_args

MAX_ROUNDS = 100_000_000
PROGRESS_EVERY = 1024
POLL_S = 0.005
STARTUP_S = 30.0  # how long a submitted job may wait for a pool process to pick it up

_counters: Any = None  # the shared counter array, in a pool process
_stops: Any = None  # the shared stop flags, in a pool process


def _init_child(counters: Any, stops: Any = None) -> None:
    global _counters, _stops
    _counters, _stops = counters, stops


class Stopped(Exception):
    """The child saw its stop flag: the attempt it computed for is over."""


def chain_sha256(seed: str, rounds: int, slot: int = -1) -> str:
    """The chained digest; bumps ``_counters[slot]`` as it goes when in the pool, and
    stops (``Stopped``) once ``_stops[slot]`` is raised."""
    digest = hashlib.sha256(seed.encode()).digest()
    counters = _counters if slot >= 0 else None
    stops = _stops if slot >= 0 else None
    sha = hashlib.sha256
    for i in range(rounds):
        digest = sha(digest).digest()
        if counters is not None and i % PROGRESS_EVERY == 0:
            counters[slot] += 1
            if stops is not None and stops[slot]:
                raise Stopped(f"stopped after {i} rounds")
    return digest.hex()


class CpuArgs(msgspec.Struct, forbid_unknown_fields=True):
    rounds: Annotated[int, msgspec.Meta(ge=1, le=MAX_ROUNDS)]
    seed: str = ""


class CpuPool:
    """A process pool and one progress counter per process.

    ``beat_while_queued=False`` is a benchmark knob that reproduces the naive
    design (no heartbeat until the work itself reports progress), to show what
    it costs when jobs outnumber cores.
    """

    def __init__(self, processes: int | None = None, *, beat_while_queued: bool = True) -> None:
        self.processes = processes or os.cpu_count() or 1
        self.beat_while_queued = beat_while_queued
        self._executor: ProcessPoolExecutor | None = None
        self._counters: Any = None
        self._stops: Any = None
        self._free: asyncio.Queue[int] | None = None

    def _ensure(self) -> tuple[ProcessPoolExecutor, asyncio.Queue[int]]:
        if self._executor is None or self._free is None:
            # spawn, not fork: the parent has I/O threads (one per durable engine) running.
            mp = multiprocessing.get_context("spawn")
            self._counters = mp.RawArray("Q", self.processes)
            self._stops = mp.RawArray("b", self.processes)
            self._executor = ProcessPoolExecutor(
                self.processes,
                mp_context=mp,
                initializer=_init_child,
                initargs=(self._counters, self._stops),
            )
            self._free = asyncio.Queue()
            for slot in range(self.processes):
                self._free.put_nowait(slot)
        return self._executor, self._free

    async def run(self, args: JSON, ctx: JobContext) -> JSON:
        a = CpuArgs(**args)
        executor, free = self._ensure()
        slot = await _wait_beating(free, ctx, self.beat_while_queued)
        fut: asyncio.Future[str] | None = None
        try:
            loop = asyncio.get_running_loop()
            self._stops[slot] = 0
            fut = loop.run_in_executor(executor, chain_sha256, a.seed, a.rounds, slot)
            seen = self._counters[slot]
            started = False
            submitted = loop.time()
            while True:
                done, _ = await asyncio.wait({fut}, timeout=POLL_S)
                now = self._counters[slot]
                if now != seen:
                    ctx.beat()
                    seen = now
                    started = True
                elif self.beat_while_queued and not started and loop.time() - submitted < STARTUP_S:
                    # Not started yet (a process is being spawned): waiting, not hung.
                    ctx.beat()
                if done:
                    return {"digest": fut.result(), "rounds": a.rounds}
        except BaseException:
            if fut is not None and not fut.done():  # over early: stop the child first
                self._stops[slot] = 1
                await _stopped(fut)
            raise
        finally:
            free.put_nowait(slot)

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


async def _stopped(fut: asyncio.Future[str]) -> None:
    """Wait (a few ms) for a child told to stop, so its process is free when its slot is
    handed on; a second cancel while waiting gives up on it."""
    try:
        await asyncio.wait({fut}, timeout=STARTUP_S)
    except asyncio.CancelledError:
        pass
    if fut.done() and not fut.cancelled():
        fut.exception()  # (retrieved: Stopped, as expected)


async def _wait_beating(free: asyncio.Queue[int], ctx: JobContext, beat: bool) -> int:
    getter = asyncio.ensure_future(free.get())
    try:
        while True:
            done, _ = await asyncio.wait({getter}, timeout=POLL_S)
            if beat:
                ctx.beat()  # waiting for a core is alive, not hung
            if done:
                return getter.result()
    except BaseException:
        if getter.done() and not getter.cancelled():
            free.put_nowait(getter.result())
        getter.cancel()
        raise


def cpu_kind(pool: CpuPool) -> Kind:
    def validate(args: JSON) -> JSON:
        return msgspec.to_builtins(convert_args(args, CpuArgs))

    return Kind("cpu", validate, pool.run)
