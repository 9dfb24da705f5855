"""The fair crash trial's audit (#37): what three PostgreSQL nodes did with a fair queue
while one was killed, judged against its policy from the database, not the engine's code.

- **Starts.** An audit trigger (``install``) on ``jobs`` records every move into running
  in the fair queue with the clock of the fair round that counted it (``sqlq_audit.fair_now``,
  which the claim sets for its own transaction). It commits or rolls back with the claim,
  so a node killed mid-claim leaves neither. A start with no round's clock was claimed by
  no fair round: a problem.
- **Rate.** Per key, in every window of ``W`` seconds (1 and 10), at most
  ``floor(r * W) + burst`` starts (``sqlq.common.fair.starts_bound``).
- **Concurrency.** ``sample`` reads the attempts of each key running under unexpired
  leases, every 10 ms. The leases are compared with the database's clock read after the
  statement's snapshot, so a lease counted here was counted by every claim committed
  before it: never more than ``key_concurrency``.
- **Refill.** ``refill`` waits until key ``R`` holds nothing, scheduled or running, then
  submits as many of it as may start at once. Each must be claimed within one poll of
  being due: no key row, and no race of a claim with a submit, strands it.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import msgspec

from sqlq.bench.client.http import HTTPError, HttpPool
from sqlq.bench.crashload import Ledger
from sqlq.bench.offline_pg import sql
from sqlq.common.fair import Policy, Rate, encode_policy, starts_bound

QUEUE = "fair"
RATE = Rate(per_s=100.0, burst=5)
CONCURRENCY = 3
POLICY = Policy(rate=RATE, key_concurrency=CONCURRENCY)
FLAGS = ("--queue-policy", f"{QUEUE}={encode_policy(POLICY)}")  # every node's, from its start
FLOOD_KEYS = ("A", "A", "A", "A", "B", "C", "D", "E")  # A: half of every submission
REFILL_KEY = "R"
REFILL_SIZE = min(RATE.burst, CONCURRENCY)  # as many as may start at once
POLL_S = 1.0  # the nodes' poll (``RuntimeConfig.poll_s``, not set by the trial's nodes)
WINDOWS_S = (1.0, 10.0)
SAMPLE_EVERY_S = 0.01

AUDIT = f"""
CREATE TABLE fair_starts (id text NOT NULL, key text, epoch int NOT NULL, at float8,
                          node text);
CREATE FUNCTION fair_start() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fair_starts
    VALUES (NEW.id, NEW.key, NEW.epoch,
            nullif(current_setting('sqlq_audit.fair_now', true), '')::float8, NEW.node);
    RETURN NULL;
END $$;
CREATE TRIGGER fair_start AFTER UPDATE OF state ON jobs FOR EACH ROW
    WHEN (NEW.state = 'running' AND OLD.state <> 'running' AND NEW.queue = '{QUEUE}')
    EXECUTE FUNCTION fair_start();
"""

RUNNING = f"""
SELECT coalesce(key, ''), count(*) FROM jobs
 WHERE queue = '{QUEUE}' AND state = 'running'
   AND lease_until > extract(epoch FROM clock_timestamp())
 GROUP BY 1
"""


async def install(dsn: str) -> None:
    """The audit trigger, in the trial's database once the nodes made their schema."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(AUDIT)  # (several statements: not a prepared one)
    finally:
        await conn.close()


def spec(rng: random.Random) -> tuple[dict[str, Any], bool, str]:
    """One flood submission, which never fails: half of them A's 2 ms jobs, which its rate
    holds back (3 slots would start 1,500 a second), the rest B to E's jobs of 40-120 ms,
    which their concurrency holds back (3 slots start about 37 a second)."""
    key = rng.choice(FLOOD_KEYS)
    work_ms = 2 if key == "A" else rng.randint(40, 120)
    body = {"kind": "sleep", "args": {"work_ms": work_ms}, "queue": QUEUE, "key": key}
    return body, False, ""


async def sample(dsn: str, stop: asyncio.Event, peaks: dict[str, int]) -> int:
    """Each key's most attempts running under unexpired leases at any sampled instant,
    into ``peaks``, until ``stop``; the number of samples."""
    import asyncpg

    samples = 0
    conn: asyncpg.Connection | None = None
    while not stop.is_set():
        try:
            if conn is None:
                conn = await asyncpg.connect(dsn)
            for key, n in await conn.fetch(RUNNING):
                peaks[key] = max(peaks.get(key, 0), int(n))
            samples += 1
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            conn = None  # the database is coming back: the next sample reconnects
        await asyncio.sleep(SAMPLE_EVERY_S)
    if conn is not None:
        await conn.close()
    return samples


async def refill(
    dsn: str, pool: Callable[[], HttpPool | None], ledger: Ledger, stop: asyncio.Event
) -> list[str]:
    """Key R emptied and refilled until ``stop``: each round waits until R holds nothing,
    scheduled or running, then submits ``REFILL_SIZE`` of it (to a live node); the ids."""
    ids: list[str] = []
    job: dict[str, Any] = {"kind": "sleep", "args": {"work_ms": 5}, "queue": QUEUE,
                           "key": REFILL_KEY}  # fmt: skip
    body = msgspec.json.encode(job)
    while not stop.is_set():
        rows = await sql(dsn, f"SELECT count(*) FROM jobs WHERE key = '{REFILL_KEY}' "
                              "AND state IN ('scheduled', 'running')")  # fmt: skip
        if rows[0][0] > 0:
            await asyncio.sleep(SAMPLE_EVERY_S)
            continue
        for _ in range(REFILL_SIZE):
            while not stop.is_set() and (p := pool()) is not None:
                try:
                    status, reply = await p.json("POST", "/jobs", body)
                except (HTTPError, OSError, TimeoutError):
                    await asyncio.sleep(SAMPLE_EVERY_S)  # (the clients drop a dead node)
                    continue
                if status == 201:
                    ledger.acknowledged(reply["id"], job, False, "")
                    ids.append(reply["id"])
                    break
                await asyncio.sleep(SAMPLE_EVERY_S)
    return ids


def most_in_window(times: list[float], window_s: float) -> int:
    """The most of sorted ``times`` in any closed window of ``window_s`` seconds."""
    most, lo = 0, 0
    for hi, t in enumerate(times):
        while times[lo] < t - window_s:
            lo += 1
        most = max(most, hi - lo + 1)
    return most


async def judge(dsn: str, peaks: dict[str, int], samples: int, refills: list[str]
                ) -> dict[str, Any]:  # fmt: skip
    """The audit's figures and problems, read back from the database after the trial."""
    problems: list[str] = []
    starts = await sql(dsn, "SELECT coalesce(key, ''), at FROM fair_starts ORDER BY at")
    unclocked = sum(1 for _, at in starts if at is None)
    if unclocked:
        problems.append(f"{unclocked} starts of the fair queue outside a fair round")
    by_key: dict[str, list[float]] = defaultdict(list)
    for key, at in starts:
        if at is not None:
            by_key[key].append(float(at))
    most: dict[str, dict[str, int]] = {}
    for w in WINDOWS_S:
        bound = starts_bound(RATE, w)
        most[f"{w:g}s"] = counted = {k: most_in_window(ts, w) for k, ts in sorted(by_key.items())}
        over = {k: n for k, n in counted.items() if n > bound}
        if over:
            problems.append(f"more than {bound} starts in a {w:g} s window: {over}")
    crowded = {k: n for k, n in peaks.items() if n > CONCURRENCY}
    if crowded:
        problems.append(f"more than {CONCURRENCY} of a key running at once: {crowded}")
    if not samples:
        problems.append("no sample of the running attempts was taken")
    waits = await sql(dsn, "SELECT j.id, min(s.at) - j.ready_at FROM jobs j "
                           "JOIN fair_starts s ON s.id = j.id WHERE j.id = ANY($1::text[]) "
                           "GROUP BY j.id, j.ready_at", refills)  # fmt: skip
    waited = sorted(float(w) for _, w in waits if w is not None)
    if len(waits) < len(refills):
        problems.append(f"{len(refills) - len(waits)} of key {REFILL_KEY}'s refills never started")
    late = [w for w in waited if w > POLL_S]
    if late:
        problems.append(f"{len(late)} of key {REFILL_KEY}'s refills waited past a poll "
                        f"({POLL_S:g} s), the longest {max(late):.3f} s")  # fmt: skip
    return {
        "fair_policy": msgspec.to_builtins(POLICY),
        "fair_starts": len(starts),
        "fair_most_starts": most,
        "fair_starts_bound": {f"{w:g}s": starts_bound(RATE, w) for w in WINDOWS_S},
        "fair_peak_running": dict(sorted(peaks.items())),
        "fair_samples": samples,
        "fair_refills": len(refills),
        "fair_refill_wait_max_s": round(waited[-1], 4) if waited else None,
        "fair_refill_wait_p50_s": round(waited[len(waited) // 2], 4) if waited else None,
        "fair_problems": problems,
    }
