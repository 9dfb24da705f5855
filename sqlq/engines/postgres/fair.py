"""A fair queue's claim on PostgreSQL: the same rules as a queue in one process
(``sqlq.common.fair.plan``), run under the queue's lock on the database's clock.

One transaction a round, one node at a time (``FAIR_LOCK`` with the queue's name):

1. read what the rules decide by (queries.sql ``fair_read``): the database's clock, the
   due jobs by key, the attempts of each key running under unexpired leases (counted from
   the rows, never kept as a counter that could leak), each key's bucket and finish tag
   (``fair_keys``), the queue's virtual time and bucket (``fair_queues``);
2. plan the round in Python (``plan``: start-time fair queueing, each key's concurrency
   and bucket, the queue's bucket);
3. take the planned jobs (``fair_claim``: each key's next jobs in order, locked) and
   store the state the plan leaves (``fair_save``), in the same commit.

The keys come from the due jobs themselves, so a key's row can never strand a job (a
job whose key has no row yet starts with a full bucket at the virtual time), and a claim
never deletes a row. A bucket's state is durable with the claims it counted, so the
bound ``floor(r * W) + burst`` holds across nodes and across any node's kill -9. A key
that the plan charged but whose job another claim had locked (``SKIP LOCKED``: a rescue
or a cancel in between) is charged all the same: its rate can only come out lower.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import msgspec

from sqlq.common.fair import KeyState, Policy, plan
from sqlq.common.models import Job
from sqlq.engines.postgres.flows import job_of
from sqlq.engines.postgres.queries import Q

FAIR_LOCK = 0x5371_6C74  # with the queue's hash: one node at a time claims from a fair queue
_NO_KEY = ""  # a job with no key, in the key tables (a key has a character at least)


async def fair_claim(
    conn: asyncpg.Connection,
    queue: str,
    policy: Policy,
    n: int,
    now: float,
    lease_until: float,
    holder: str,
    kinds: Sequence[str] | None,
    cap: int | None = None,
) -> tuple[list[Job], float | None]:
    """Up to ``n`` due jobs of ``queue`` by ``policy`` (and its ``cap``, if any), claimed
    for ``holder``, the queue's state saved with them; and when a due job its buckets held
    back may start, on the caller's clock (``Plan.wake``; None: none was held back)."""
    async with conn.transaction():
        await conn.execute(Q["fair_lock"], FAIR_LOCK, queue)
        row = await conn.fetchrow(Q["fair_read"], queue, now, now, kinds)
        if row["paused"]:
            return [], None
        if cap is not None:
            n = min(n, cap - int(row["running"]))
        if n <= 0:
            return [], None  # (a finishing attempt frees a slot, and its worker claims)
        keys = {
            (None if k == _NO_KEY else k): KeyState(
                due=int(due), oldest=float(oldest), running=int(running), tat=tat,
                finish=finish,
            )
            for k, due, oldest, running, tat, finish in msgspec.json.decode(row["keys"])
        }  # fmt: skip
        if not keys:
            return [], None
        db_now = float(row["db_now"])
        made = plan(keys, policy, virtual=row["virtual"] or 0.0, queue_tat=row["queue_tat"],
                    now=db_now, n=n)  # fmt: skip
        wake = None if made.wake is None else now + (made.wake - db_now)
        if not made.take:
            return [], wake
        keyed = [(k, c) for k, c in made.take.items() if k is not None]
        rows = await conn.fetch(
            Q["fair_claim"], now, n, lease_until, queue, holder, [k for k, _ in keyed],
            [c for _, c in keyed], kinds, made.take.get(None, 0),
        )  # fmt: skip
        touched = sorted(set(made.tat) | set(made.finish), key=lambda k: k or _NO_KEY)
        await conn.execute(
            Q["fair_save"], queue, [k or _NO_KEY for k in touched],
            [made.tat.get(k, keys[k].tat) for k in touched],
            [made.finish.get(k, keys[k].finish) for k in touched],
            made.virtual, made.queue_tat,
        )  # fmt: skip
    return [job_of(r) for r in rows], wake
