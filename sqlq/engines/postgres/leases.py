"""Claims and remote workers' leases: the statements a claim and ``extend`` run, and their
arguments, on a connection the store hands them.

A claim takes due jobs for a holder: this node's name for its own workers, which leave
out the remote queues (``besides``), or a remote worker's (``worker:<name>``) for the
queues it serves (``only``) and the kinds it runs. A capped queue is claimed on its own,
under its advisory lock, with the same filters. ``extend`` renews remote leases, each
fenced like an outcome, in one statement (queries.sql ``extend``); a node's own
``renew`` is one statement too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import asyncpg
import msgspec

from sqlq.common.fair import Policy
from sqlq.common.models import Job
from sqlq.common.running import Progress
from sqlq.common.store import Extended, Lease
from sqlq.engines.postgres.fair import fair_claim
from sqlq.engines.postgres.flows import job_of
from sqlq.engines.postgres.queries import Q

CAP_LOCK = 0x5371_6C73  # with the queue's hash: one node at a time claims from a capped queue
encode = msgspec.json.Encoder().encode  # progress, as rows.py writes it


async def claim(
    conn: asyncpg.Connection,
    n: int,
    now: float,
    lease_until: float,
    caps: Mapping[str, int],
    holder: str,
    only: Sequence[str] | None,
    besides: Sequence[str],
    kinds: Sequence[str] | None,
    policies: Mapping[str, Policy] | None = None,
    tokens: dict[str, float] | None = None,
) -> list[Job]:
    """Up to ``n`` due jobs for ``holder`` (``SharedStore.claim``), in claim order. A queue
    with a policy that sets a limit is claimed by its own rules (``fair.fair_claim``); each
    such round leaves in ``tokens`` when its queue's buckets next let a held job start
    (the queue left out: none held back)."""
    left_out = set(besides)
    wanted = None if only is None else [q for q in dict.fromkeys(only) if q not in left_out]
    if wanted == [] or n <= 0:
        return []
    kind_list = None if kinds is None else list(dict.fromkeys(kinds))
    # Every queue with a policy, a plain one too (``fair: false``, or no limit): the plain
    # claim leaves every such queue out (the policies are rows it reads), so only a fair
    # round claims from it.
    fair = {q: p for q, p in (policies or {}).items()
            if q not in left_out and (wanted is None or q in wanted)}  # fmt: skip
    capped = sorted(q for q in caps if q not in left_out and q not in fair
                    and (wanted is None or q in wanted))  # fmt: skip
    # capped and fair queues: only through their own claims
    skipped = sorted(left_out | set(caps) | set(policies or ()))
    rows = list(
        await conn.fetch(Q["claim"], now, n, lease_until, skipped, holder, wanted, kind_list)
    )
    jobs = [job_of(r) for r in rows]
    for queue in sorted(fair):
        if len(jobs) >= n:
            break
        got, wake = await fair_claim(conn, queue, n - len(jobs), now, lease_until,
                                     holder, kind_list, caps.get(queue))  # fmt: skip
        jobs += got
        if tokens is not None:
            if wake is None:
                tokens.pop(queue, None)
            else:
                tokens[queue] = wake
    rows = []
    for queue in capped:
        if len(jobs) + len(rows) >= n:
            break
        async with conn.transaction():
            await conn.execute(Q["cap_lock"], CAP_LOCK, queue)
            rows += await conn.fetch(
                Q["claim_capped"], now, n - len(jobs) - len(rows), lease_until, queue, holder,
                caps[queue], kind_list,
            )  # fmt: skip
    jobs += [job_of(r) for r in rows]
    jobs.sort(key=lambda j: (-j.priority, j.ready_at, j.id))
    return jobs


def renew_args(
    node: str,
    now: float,
    lease_until: float,
    held: Sequence[str],
    progress: Mapping[str, Progress] | None,
) -> list[object]:
    """``renew``'s arguments (one statement: the leases, the progress riding on them and
    the cancels asked for, so a node's heartbeat stays one round trip)."""
    ids = list(dict.fromkeys(held))
    given = progress or {}
    texts = [None if (p := given.get(i)) is None else encode(p).decode() for i in ids]
    return [node, now, lease_until, ids, texts]


def extend_args(now: float, leases: Sequence[Lease]) -> list[object]:
    """``extend``'s arguments: the leases as columns, the last of a repeated job's."""
    last = {lease.job_id: lease for lease in leases}.values()
    return [
        now,
        [x.job_id for x in last],
        [x.epoch for x in last],
        [x.holder for x in last],
        [x.lease_until for x in last],
        [None if x.progress is None else encode(x.progress).decode() for x in last],
    ]


async def extend(conn: asyncpg.Connection, now: float, leases: Sequence[Lease]) -> list[Extended]:
    if not leases:
        return []
    rows = await conn.fetch(Q["extend"], *extend_args(now, leases))
    return [Extended(r[0], r[1], r[2]) for r in rows]


def next_token(tokens: dict[str, float], now: float) -> float | None:
    """The earliest of the fair queues' next tokens (``claim``'s ``tokens``). One that has
    come is told once and forgotten (the round it wakes leaves the next), so a queue whose
    policy went away can't keep a claimer awake."""
    if not tokens:
        return None
    token = min(tokens.values())
    for queue in [q for q, t in tokens.items() if t <= now]:
        del tokens[queue]
    return token
