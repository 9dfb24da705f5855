"""The PostgreSQL crash trials' nodes and clients: ``NODES`` ``sqlq serve`` processes on
one database (``node``: one of them, as the job trials and the schedule trials start
it), and clients that submit to whichever nodes answer (a node that stops answering
leaves, its restart joins) while an operator acts on one live node."""

from __future__ import annotations

import asyncio
import random
import signal
from collections.abc import Sequence
from pathlib import Path

import msgspec

from sqlq.bench.client.http import HTTPError, HttpPool
from sqlq.bench.client.server import FAST_RETRY_FLAGS, ServerProcess
from sqlq.bench.crashload import (
    PLAIN,
    SERVER_FLAGS,
    Ledger,
    Spec,
    mixed_spec,
    operate,
    server_env,
)

NODES = 3
CLIENTS = 8


def node(
    dsn: str, lease_s: float, workdir: Path, n: int, ready_within: float = 60,
    extra: Sequence[str] = (),
) -> ServerProcess:  # fmt: skip
    """One node; ``extra``: its flags besides (the fair workload's queue policy)."""
    args = (
        "--store", "postgres", "--dsn", dsn, "--workers", "16", "--lease", str(lease_s),
        "--log-level", "warning", "--grace", "0",
        "--fault-injection",  # the mixed workload's jobs fail and hang on purpose
        *FAST_RETRY_FLAGS,
        *SERVER_FLAGS,
        *extra,
    )  # fmt: skip
    return ServerProcess(
        *args, env=server_env(workdir), log_path=workdir / f"node{n}.log",
        ready_within=ready_within,
    )  # fmt: skip


async def start_all(nodes: Sequence[ServerProcess]) -> None:
    """Start ``nodes`` side by side; return once each is ready (``ServerError`` if not)."""
    for n in nodes:
        n.spawn()
    for n in nodes:
        await asyncio.to_thread(n.wait_ready)


async def stop_all(nodes: Sequence[ServerProcess], sig: int = signal.SIGKILL) -> None:
    """Stop ``nodes`` one by one with ``sig`` (a clean stop: SIGTERM; by default SIGKILL,
    for what may still run after a failure). Idempotent."""
    for n in nodes:
        await asyncio.to_thread(n.stop, sig)


class Targets:
    """The nodes clients submit to: a node that stops answering leaves, its restart joins."""

    def __init__(self) -> None:
        self.pools: list[HttpPool] = []
        self.all: list[HttpPool] = []

    async def add(self, url: str) -> None:
        # A connection for each client and the operator: nobody waits for one. (A pool whose
        # node died loses the connections it cannot replace, and a waiter would wait forever.)
        pool = await HttpPool(url, CLIENTS + 1).__aenter__()
        self.pools.append(pool)
        self.all.append(pool)

    def first(self) -> HttpPool | None:
        return self.pools[0] if self.pools else None

    def drop(self, pool: HttpPool) -> None:
        if pool in self.pools:
            self.pools.remove(pool)

    async def close(self) -> None:
        for pool in self.all:
            await pool.__aexit__(None, None, None)


async def submit(
    targets: Targets, budget: int, stop: asyncio.Event, ledger: Ledger, workload: str,
    rng: random.Random, *, spec: Spec = mixed_spec, force: float = 0.0,
) -> list[str]:  # fmt: skip
    """Clients submit until stopped or the budget is acknowledged (and, in the mixed
    workload, an operator acts on one live node at a time); the acknowledged ids.
    ``spec``: what a client submits, unless the workload is plain (the fair workload's:
    ``fairaudit.spec``); ``force``: the mixed workload's operator's."""
    mixed = workload == "mixed"

    async def client(i: int) -> None:
        n = i
        while not stop.is_set() and len(ledger.acked) < budget:
            if not targets.pools:
                await asyncio.sleep(0.02)
                continue
            pool = targets.pools[n % len(targets.pools)]
            n += 1
            body, can_fail, tag = (PLAIN, False, "") if workload == "plain" else spec(rng)
            try:
                status, reply = await pool.json("POST", "/jobs", msgspec.json.encode(body))
            except (HTTPError, OSError, TimeoutError):
                targets.drop(pool)  # that node is down: the others take the load
                continue
            if status == 201:
                ledger.acknowledged(reply["id"], body, can_fail, tag)
            else:  # 503 while the database is down: not acknowledged, try again
                await asyncio.sleep(0.02)

    clients = [client(i) for i in range(CLIENTS)]
    if mixed:
        first = targets.first
        op_rng = random.Random(rng.random())
        clients.append(operate(first, ledger, op_rng, stop, gone=targets.drop, force=force))
    await asyncio.gather(*clients)
    return ledger.acked
