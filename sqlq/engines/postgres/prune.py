"""Pruning the shared queue: finished jobs past retention go, on one node at a time.

Every node runs its maintenance on its own clock; an advisory lock (``PRUNE_LOCK``) lets
one prune at a time, and a node that finds it taken reports the sizes and prunes
nothing. A workflow goes as a unit with its flows and edges (queries.sql ``prune``). Idle
fair keys go too (``prune_keys``): a tenant seen once costs a row only while it matters.
"""

from __future__ import annotations

import time

import asyncpg

from sqlq.common.store import CompactionReport
from sqlq.engines.postgres.queries import Q

PRUNE_LOCK = 0x5371_6C72  # one node at a time prunes
PRUNE_KEYS_MOST = 10_000  # fair keys a prune forgets at most (queries.sql prune_keys)


async def prune(conn: asyncpg.Connection, horizon: float, t0: float) -> CompactionReport:
    """Prune what finished before ``horizon`` if no other node is pruning; the report's
    time is counted from ``t0`` (``time.perf_counter``)."""
    before = int(await conn.fetchval(Q["size"]))
    pruned = 0
    if await conn.fetchval(Q["prune_lock"], PRUNE_LOCK):
        try:
            pruned, _nodes, _graph = await conn.fetchrow(Q["prune"], horizon)
            await conn.execute(Q["prune_keys"], PRUNE_KEYS_MOST)
        finally:
            await conn.execute(Q["prune_unlock"], PRUNE_LOCK)
    after = int(await conn.fetchval(Q["size"]))
    live = int(await conn.fetchval(Q["live"]))
    return CompactionReport(
        bytes_before=before,
        bytes_after=after,
        jobs_kept=live,
        jobs_pruned=int(pruned),
        seconds=time.perf_counter() - t0,
    )
