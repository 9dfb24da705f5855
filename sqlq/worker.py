"""``sqlq.Worker``: the server's ``@task`` handlers, run out of its process, over HTTP.

    import asyncio
    from sqlq import AsyncClient, Worker
    import tasks  # registers its @task handlers

    async def main() -> None:
        async with AsyncClient("http://sqlq:8080", token=TOKEN, retries=0) as client:
            worker = Worker(client, ["images"], concurrency=16)
            await worker.run()  # until worker.stop() (``sqlq worker``: SIGTERM)

    asyncio.run(main())

A worker is the server's own worker pool (``sqlq.runtime.workers``: one attempt loop
and one health loop) over claims held across HTTP (``sqlq.worker_claims.RemoteClaims``,
holder ``worker:<name>``): the environment is a parameter, not a second runtime. So a
handler runs as it does in the server, through the same ``Executor`` and
``JobContext``: async handlers on this loop, plain ones in threads (or, with
``processes``, in worker processes: ``sqlq.runtime.processes``); the kind's ``timeout``
and ``hb_timeout`` cut an attempt off (it fails, through the server's retry policy); a
lease not renewed in time cuts it off too, reporting nothing (``sqlq.common.lease``);
its result is held to the stored-value bounds; ``Snooze`` and ``snooze()`` snooze;
``ctx.progress`` goes in the next heartbeat; ``ctx.checkpoint`` is durable before it
returns; a cancel asked for cancels an async handler's task and sets ``ctx.cancelled``
for a plain one; a fenced lease stops the attempt and nothing of it is reported. An
attempt cut off for any reason sets ``ctx.cancelled``: the only way to tell a thread
its work is no longer wanted.

``stop()`` (``sqlq worker``: SIGTERM, SIGINT): no more claims; what is claimed and not
started (waiting for a process, or claimed by a long poll that answered after the stop)
is given back (``/claims/release``, no attempt counted); running attempts get
``grace_s`` to finish, and the rest fail as interrupted (an attempt counted, as a
server's stop counts it); then it waits for the server to take every outcome, as long as
their leases last. ``hurry()`` (a second signal) cuts both waits short.

Every loop's waits are on the injected ``clock``, so the tests drive it with the fake one.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import socket
from collections.abc import Sequence

from sqlq.calls import ApiError
from sqlq.common.clock import SYSTEM_CLOCK, Clock
from sqlq.common.protocol import DEFAULT_LEASE_S, MAX_CLAIM_KINDS
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.cpu import CpuPool
from sqlq.runtime.executor import Executor, build_registry
from sqlq.runtime.kinds import REGISTRY, Registry
from sqlq.runtime.processes import ProcessHandlers
from sqlq.runtime.workers import CANCELLED_WHILE, WorkerPool
from sqlq.worker_claims import (
    CARRIED_WITHIN_S,
    INTERRUPTED,
    MAX_REFUSED_CARRIES,
    PullClient,
    RemoteClaims,
)
from sqlq.worker_outbox import Backoff

__all__ = ["CANCELLED_WHILE", "CARRIED_WITHIN_S", "INTERRUPTED", "MAX_REFUSED_CARRIES",
           "PullClient", "Worker", "WorkerError", "default_name"]  # fmt: skip

log = logging.getLogger("sqlq.worker")

DEFAULT_WAIT_S = 5.0  # a claim's long poll (an idle worker stops within it)


class WorkerError(Exception):
    """The server refused this worker for good (its token, its queues): it stopped."""


def default_name() -> str:
    """``host-pid``, in the characters a worker's name may have."""
    host = re.sub(r"[^A-Za-z0-9_.-]", "-", socket.gethostname())[:40] or "host"
    return f"{host}-{os.getpid()}"


class Worker:
    """Runs the registered handlers on jobs claimed from ``queues`` (module docstring).

    ``kinds``: claim only these (default: every kind this worker runs, ``@task``'s and the
    built-in ``sleep`` and ``cpu``). ``concurrency``: attempts at once (claimed ones
    waiting for a process included). ``processes``: run plain handlers in that many
    worker processes, each of which imports ``imports`` (0: in threads). ``lease_s``:
    each claim's lease (5 to 3600). ``registry``: the kinds, if not ``@task``'s (worker
    processes always run ``@task``'s)."""

    def __init__(
        self,
        client: PullClient,
        queues: Sequence[str] = ("default",),
        *,
        name: str | None = None,
        kinds: Sequence[str] | None = None,
        registry: Registry | None = None,
        imports: Sequence[str] = (),
        concurrency: int = 10,
        processes: int = 0,
        lease_s: float = DEFAULT_LEASE_S,
        grace_s: float = 10.0,
        wait_s: float = DEFAULT_WAIT_S,
        progress_every_s: float = 1.0,
        hb_timeout_s: float = RuntimeConfig.hb_timeout_s,
        fault_injection: bool = False,
        backoff: Backoff | None = None,
        clock: Clock = SYSTEM_CLOCK,
        rng: random.Random | None = None,
    ) -> None:
        if not queues:
            raise ValueError("queues: name at least one")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if processes < 0 or processes > concurrency:
            raise ValueError(f"processes must be 0 to concurrency ({concurrency})")
        self.client = client
        self.queues = list(queues)
        self.name = name or default_name()
        self.concurrency = concurrency
        self.lease_s = lease_s
        self.grace_s = grace_s
        # A lease counts from when its claim was sent (``common.lease``): a long poll that
        # answers late leaves less of it, so it waits at most half a lease.
        self.wait_s = min(wait_s, lease_s / 2)
        self.progress_every_s = progress_every_s
        self._clock = clock
        self._rng = rng or random.Random()
        self._cpu = CpuPool(processes or None)
        self.registry = build_registry(registry or REGISTRY, fault_injection=fault_injection,
                                       cpu=self._cpu)  # fmt: skip
        runs = self.registry.names()
        if kinds is not None:
            unknown = [k for k in kinds if k not in self.registry]
            if unknown:
                raise ValueError(f"kinds: no handler for {', '.join(unknown)}; known: "
                                 f"{', '.join(runs)}")  # fmt: skip
        self.kinds = list(kinds) if kinds else runs
        if len(self.kinds) > MAX_CLAIM_KINDS:
            raise ValueError(f"kinds: a claim names at most {MAX_CLAIM_KINDS}; name them")
        config = RuntimeConfig(workers=concurrency, hb_timeout_s=hb_timeout_s)
        procs = ProcessHandlers(processes, imports) if processes else None
        self._executor = Executor(self.registry, config, rng=self._rng, clock=clock,
                                  processes=procs)  # fmt: skip
        self._claims = RemoteClaims(
            client, queues=self.queues, name=self.name, kinds=self.kinds,
            registry=self.registry, concurrency=concurrency, processes=processes,
            lease_s=lease_s, wait_s=self.wait_s, grace_s=grace_s,
            progress_every_s=progress_every_s, backoff=backoff or Backoff(), clock=clock,
            rng=self._rng,
        )  # fmt: skip
        self._pool = WorkerPool(self._claims, self._executor, workers=concurrency,
                                hb_timeout_s=hb_timeout_s, healthcheck=True,
                                clock=clock)  # fmt: skip
        self._claims.attach(self._pool)
        self.stats = self._claims.stats

    def stop(self) -> None:
        """Claim no more; finish within ``grace_s``; give back the rest (signal-safe). A
        claim long-polling at the stop is waited for (its jobs are given back), within the
        grace: an idle worker stops within ``min(wait_s, grace_s)``."""
        self._claims.stop()

    def hurry(self) -> None:
        """Cut the grace and the wait for outcomes short (a second signal)."""
        self._claims.hurry()
        self._pool.hurry()

    @property
    def held(self) -> int:
        """Claims holding a slot now."""
        return self._claims.held

    @property
    def owed(self) -> int:
        """Outcomes decided that the server has not taken yet."""
        return self._claims.owed

    def pids(self) -> list[int]:
        """The worker processes' ids (``processes``), this one's if none."""
        procs = self._executor.processes
        return procs.pids() if procs is not None else [os.getpid()]

    async def run(self) -> None:
        """Claim and run until ``stop()``; then wind down. ``WorkerError`` if the server
        refused this worker (a bad token, a queue that is not remote)."""
        background: list[asyncio.Task[None]] = []
        started = False
        try:
            await self._executor.start()
            background = self._claims.start()
            self._pool.start()
            started = True
            await self._claims.claiming()
            await self._wind_down()
        finally:
            if started:
                await self._pool.stop(0.0)  # (a no-op after a wind-down; else: an error)
            for t in background:
                t.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await self._executor.close()
            self._cpu.shutdown()
        fatal: ApiError | None = self._claims.fatal
        if fatal is not None:
            raise WorkerError(str(fatal)) from fatal

    async def _wind_down(self) -> None:
        held = self._claims.held
        if held:
            left = self._claims.grace_left()
            log.info("stopping: %d jobs running get %.0f s to finish", held, left)
        await self._pool.stop(self._claims.grace_left())
        self._claims.interrupted()
        await self._claims.delivered()
