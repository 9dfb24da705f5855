"""A PostgreSQL database's jobs read in plain SQL, without the engine's code: what the
crash verifiers on PostgreSQL judge (``crashcheck_pg``, ``crashremote_pg``, ``crashflow``),
as ``sqlq.bench.offline`` reads a single-node engine's files."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import asyncpg

from sqlq.bench.offline import JOB_FACT_COLUMNS, JobFacts, row_facts


async def sql(dsn: str, query: str, *args: Any, within: float = 60.0) -> list[asyncpg.Record]:
    """One plain query, retried while the database is coming back."""
    deadline = time.monotonic() + within
    while True:
        try:
            conn = await asyncpg.connect(dsn)
            try:
                return list(await conn.fetch(query, *args))
            finally:
                await conn.close()
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def read_pg(dsn: str) -> dict[str, JobFacts]:
    """Every job's facts in plain SQL (``row_facts``): the columns the verifier reads that
    the schema has (an old one lacks what a running job carries; a running job's holder is
    the ``node`` column, a node's name or ``worker:<name>``)."""
    have = {r[0] for r in await sql(
        dsn, "SELECT column_name FROM information_schema.columns WHERE table_name = 'jobs'"
    )}  # fmt: skip
    names = [c for c in JOB_FACT_COLUMNS if c in have]
    if "holder" not in have and "node" in have:  # schema 4: the holder is the node column
        names.append("node AS holder")
    if "flow" in have:  # schema 6: a workflow member's flow (counts, policies, cancel reason)
        names.append("flow")
    rows = await sql(dsn, f"SELECT {', '.join(names)} FROM jobs")
    edges: dict[str, list[str]] = {}
    if "flow" in have:  # a member's parents are edges, by child in the order named
        for child, parent in await sql(dsn, "SELECT child, parent FROM edges ORDER BY child, n"):
            edges.setdefault(child, []).append(parent)
    jobs = {}
    for r in rows:
        row = dict(r)
        flow = row.pop("flow", None)
        jobs[row["id"]] = facts = row_facts(row)
        if flow is not None:
            facts.flow = json.loads(flow) if isinstance(flow, str) else dict(flow)
            facts.flow["parents"] = edges.get(row["id"], [])
    return jobs
