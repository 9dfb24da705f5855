"""Schedules through kill -9: no tick lost, none run twice (``sqlq crashcheck --workload
schedules``).

Each trial: a fresh data directory; ``sqlq serve``; ``SCHEDULES`` schedules created over
HTTP, every one ticking each second (``every_s: 1``), most with ``catch_up: all`` and one
with ``latest``; SIGKILL at a random moment; a restart on the same data, which runs the
schedules on for a few ticks; every schedule paused, the queue drained, a clean stop.
Then the files are read without the engine's code (``sqlq.bench.offline``): each
schedule's cursor and creation time, and every job's idempotency key (``sched:<name>:
<tick>``). The verdict, ``judge_ticks``:

- no (schedule, tick) has more than one job (the key index would refuse a second one
  with the same key, so this counts ticks, whatever the key);
- under ``all``, every tick after the creation up to the durable cursor has exactly one
  job;
- under ``latest``, a tick up to the cursor may be missing only if it fell due while no
  server ran (between the kill and the restart being ready), and then only one tick of
  that downtime is there;
- no job is for a tick past its schedule's cursor (a job never outruns its cursor);
- a schedule the client saw created is there, and the restarted server moved every
  cursor on by ``TICKS_AFTER_RESTART`` ticks (a server that stopped ticking fails).
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from pathlib import Path
from typing import Any

import msgspec
import uvloop

from sqlq.bench.client.http import HTTPError, HttpPool
from sqlq.bench.client.loadgen import wait_drained
from sqlq.bench.client.server import ServerProcess
from sqlq.bench.crashload_pg import NODES, node, start_all, stop_all
from sqlq.bench.offline import VerifyError
from sqlq.bench.offline_schedules import Durable, read_pg_schedules, read_schedules

SCHEDULES = 6  # per trial; the last one is ``latest``, the others ``all``
TICKS_AFTER_RESTART = 3  # ticks the restarted server must enqueue before the stop
ALL_WITHIN_S = 30.0  # how long the restarted server has to get there


def spec(n: int) -> dict[str, Any]:
    latest = n == SCHEDULES - 1
    return {
        "kind": "sleep",
        "args": {"work_ms": 1},
        "every_s": 1,
        "catch_up": "latest" if latest else "all",
        "max_catch_up": 10_000,
    }


def judge_ticks(
    created: set[str],
    schedules: dict[str, Durable],
    ticks: dict[str, list[int | None]],
    downtime: tuple[float, float],
    restarted_at: float = 0.0,
) -> tuple[list[str], dict[str, int]]:
    """The problems of one trial (see the module's docstring) and their counts; ``ticks``:
    each schedule's jobs' ticks as their keys say (None for a triggered job), ``downtime``:
    (kill, ready), wall-clock seconds; ``restarted_at``: when the restarted server was
    ready (its schedules must have ticked ``TICKS_AFTER_RESTART`` times since)."""
    problems = []
    counts = {"doubled": 0, "missing": 0, "ahead": 0, "gone": 0, "passed_over": 0, "stalled": 0}
    counts["gone"] = len(created - set(schedules))
    for name in sorted(created - set(schedules)):
        problems.append(f"schedule {name} was created and is gone")
    down_from, down_to = downtime
    for name, s in sorted(schedules.items()):
        seen = [t for t in ticks.get(name, []) if t is not None]
        doubled = sorted({t for t in seen if seen.count(t) > 1})
        counts["doubled"] += len(doubled)
        if doubled:
            problems.append(f"{name}: {len(doubled)} ticks have two jobs, e.g. {doubled[0]}")
        if s.cursor < int(restarted_at) + TICKS_AFTER_RESTART:
            counts["stalled"] += 1
            problems.append(f"{name}: cursor {s.cursor}: no progress after the restart")
        first = int(s.created_at) + 1
        expected = set(range(first, s.cursor + 1))
        ahead = sorted(set(seen) - expected)
        counts["ahead"] += len(ahead)
        if ahead:
            problems.append(f"{name}: jobs for ticks the cursor never reached, e.g. {ahead[0]}")
        missing = sorted(expected - set(seen))
        if s.catch_up == "all" and missing:
            counts["missing"] += len(missing)
            problems.append(f"{name}: {len(missing)} ticks without a job, e.g. {missing[0]}")
        if s.catch_up == "latest":
            outside = [t for t in missing if not down_from - 1 <= t <= down_to + 1]
            counts["missing"] += len(outside)
            counts["passed_over"] += len(missing) - len(outside)
            if outside:
                problems.append(f"{name}: ticks missing while a server ran, e.g. {outside[0]}")
    return problems, counts


async def _create(url: str) -> set[str]:
    created = set()
    async with HttpPool(url, 1) as pool:
        for n in range(SCHEDULES):
            try:
                status, _ = await pool.json("PUT", f"/schedules/s{n}", msgspec.json.encode(spec(n)))
            except (HTTPError, OSError):
                continue  # not acknowledged: the verdict expects nothing of it
            if status in (200, 201):
                created.add(f"s{n}")
    return created


async def _run_on_and_stop(url: str, ready_at: float) -> dict[str, Any]:
    """Until every schedule has a tick ``TICKS_AFTER_RESTART`` seconds past the restart,
    then pause them all and drain."""
    async with HttpPool(url, 1) as pool:
        deadline = time.time() + ALL_WITHIN_S
        while time.time() < deadline:
            _, body = await pool.json("GET", "/schedules")
            ticks = [s["last_tick"] or 0 for s in body["schedules"]]
            if ticks and min(ticks) >= int(ready_at) + TICKS_AFTER_RESTART:
                break
            await asyncio.sleep(0.2)
        for n in range(SCHEDULES):
            await pool.json("POST", f"/schedules/s{n}/pause")
        return await wait_drained(pool)


def run_trial(store: str, sync: str, kill_after_s: float, workdir: Path) -> dict[str, Any]:
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    flags = ("--workers", "16")
    srv = ServerProcess.engine(store=store, data_dir=str(data), sync=sync, flags=flags)
    again = ServerProcess.engine(store=store, data_dir=str(data), sync=sync, flags=flags)
    try:
        srv.start()
        created = uvloop.run(_create(srv.url))  # none acknowledged: the trial fails below
        time.sleep(kill_after_s)  # the ticks run; the kill lands anywhere in a second
        killed_at = time.time()
        srv.kill()
        again.start()
        ready_at = time.time()
        recovery = uvloop.run(_run_on_and_stop(again.url, ready_at))
        again.stop(signal.SIGTERM)
    finally:  # a trial that fails midway leaves no server ticking behind it
        srv.stop()
        again.stop()
    problems: list[str] = []
    try:
        schedules, ticks = read_schedules(store, data)
    except (VerifyError, ValueError, KeyError) as exc:
        problems.append(f"unreadable store: {exc}")
        schedules, ticks = {}, {}
    found, counts = judge_ticks(created, schedules, ticks, (killed_at, ready_at), ready_at)
    problems += found + ([] if created else ["no schedule was acknowledged"])
    return {
        "store": store,
        "sync": sync,
        "workload": "schedules",
        "kill_after_s": round(kill_after_s, 3),
        "schedules": len(schedules),
        "ticks": sum(len(t) for t in ticks.values()),
        "downtime_s": round(ready_at - killed_at, 3),
        **counts,
        "recovery": recovery,
        "problems": problems,
        "ok": not problems,
    }


def kill_after(rng: random.Random) -> float:
    return rng.uniform(0.5, 3.0)


async def run_pg_trial(dsn: str, kill_after_s: float, victim: int, workdir: Path) -> dict[str, Any]:
    """Three nodes share the schedules on one database; one is killed and started again.
    Some node runs all along, so under ``latest`` no tick may be passed over at all."""
    nodes = [node(dsn, 2.0, workdir, i) for i in range(NODES)]
    started = list(nodes)
    try:
        await start_all(nodes)
        created = await _create(nodes[0].url)
        await asyncio.sleep(kill_after_s)
        nodes[victim].kill()
        again = node(dsn, 2.0, workdir, NODES + 1)
        started.append(again)
        again.spawn()
        await asyncio.to_thread(again.wait_ready)
        nodes[victim] = again
        ready_at = time.time()
        recovery = await _run_on_and_stop(nodes[(victim + 1) % NODES].url, ready_at)
        await stop_all(nodes, signal.SIGTERM)
        problems: list[str] = []
        schedules, ticks = await read_pg_schedules(dsn)
        found, counts = judge_ticks(created, schedules, ticks, (0.0, 0.0), ready_at)
        problems += found + ([] if created else ["no schedule was acknowledged"])
    finally:
        await stop_all(started)
    return {
        "store": "postgres",
        "sync": "full",
        "workload": "schedules",
        "kill_after_s": round(kill_after_s, 3),
        "schedules": len(schedules),
        "ticks": sum(len(t) for t in ticks.values()),
        "downtime_s": 0.0,
        **counts,
        "recovery": recovery,
        "problems": problems,
        "ok": not problems,
    }
