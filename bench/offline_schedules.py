"""Schedules read from a store's files without the engine's code: the schedule crash
verifier's eyes (``sqlq.bench.crashsched``).

Each schedule's creation time, durable cursor and catch-up policy, and the ticks of the
jobs it made, told by their idempotency keys (``sched:<name>:<tick>``, restated here on
purpose, as ``sqlq.bench.offline`` restates the transition table). walq's log through
the same framing as ``sqlq.bench.offline.read_walq``; SQLite and PostgreSQL in plain SQL.
"""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlq.bench.offline import VerifyError


@dataclass(frozen=True)
class Durable:
    """What the files say of one schedule."""

    created_at: float
    cursor: int
    catch_up: str


Found = tuple[dict[str, Durable], dict[str, list[int | None]]]


def tick_of(key: str | None) -> tuple[str, int | None] | None:
    """(schedule, tick) of a job's key; tick None for a triggered job; None: no schedule's."""
    if not key or not key.startswith("sched:"):
        return None
    name, _, tick = key[len("sched:") :].rpartition(":")
    return (name, int(tick) if tick.isdigit() else None) if name else None


def _found(schedules: dict[str, Durable], keys: list[str | None]) -> Found:
    ticks: dict[str, list[int | None]] = defaultdict(list)
    for key in keys:
        made = tick_of(key)
        if made is not None:
            ticks[made[0]].append(made[1])
    return schedules, dict(ticks)


def _durable(created_at: float, cursor: int, spec: Any) -> Durable:
    spec = json.loads(spec) if isinstance(spec, str) else spec
    return Durable(
        created_at=created_at, cursor=int(cursor), catch_up=spec.get("catch_up", "latest")
    )


def read_sqlite(path: Path) -> Found:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT name, created_at, cursor, spec FROM schedules").fetchall()
        keys = [k for (k,) in db.execute("SELECT idempotency_key FROM jobs")]
    return _found({n: _durable(c, cur, s) for n, c, cur, s in rows}, keys)


def read_schedules(store: str, data: Path) -> Found:
    """The schedules and their jobs' ticks in the data directory ``data`` of ``store``."""
    if store == "sqlite":
        return read_sqlite(data / "sqlite" / "sqlq.db")
    if store == "walq":
        return read_walq(data / "walq" / "walq.log")
    raise VerifyError(f"no offline schedule reader for the {store!r} engine")


def read_walq(path: Path) -> Found:
    """The schedules a walq log folds to, and its jobs' keys. The framing and checksums
    are ``sqlq.bench.offline.read_walq``'s to check (the crash verifier runs it on the
    same log); here only the complete lines' records, and every advance's fence."""
    schedules: dict[str, dict[str, Any]] = {}
    keys: list[str | None] = []
    lines = path.read_bytes().split(b"\n")[1:-1]  # the header, and a torn tail, left out
    for line in lines:
        try:
            rec = json.loads(line[24:-1])
        except ValueError:
            break  # a torn last line that happens to end in a newline
        if "snap" in rec:
            keys.append(rec["snap"].get("idempotency_key"))
        elif "sched" in rec:
            schedules[rec["sched"]["name"]] = dict(rec["sched"])
        for op in rec.get("ops", ()):
            if "put" in op:
                keys.append(op["put"].get("idempotency_key"))
            elif "sput" in op:
                new = dict(op["sput"]["schedule"])
                old = schedules.get(new["name"])
                if old is not None and old["cursor"] >= new["cursor"]:  # never back
                    new["cursor"], new["last_job"] = old["cursor"], old.get("last_job")
                schedules[new["name"]] = new
            elif "sdrop" in op:
                schedules.pop(op["sdrop"]["name"], None)
            elif "sadv" in op:
                adv = op["sadv"]
                cur = schedules.get(adv["name"])
                if cur is None or cur["cursor"] != adv["expect_cursor"]:
                    raise VerifyError(f"schedule {adv['name']}: an advance applied off its fence")
                cur["cursor"] = adv["cursor"]
    found = {n: _durable(s["created_at"], s["cursor"], s["spec"]) for n, s in schedules.items()}
    return _found(found, keys)


async def read_pg_schedules(dsn: str) -> Found:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT name, created_at, cursor, spec FROM schedules")
        keys = [r[0] for r in await conn.fetch("SELECT idempotency_key FROM jobs")]
    finally:
        await conn.close()
    return _found({r[0]: _durable(r[1], r[2], r[3]) for r in rows}, keys)
