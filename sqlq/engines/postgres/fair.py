"""A fair queue's claim on PostgreSQL: the same rules as a queue in one process
(``sqlq.common.fair.plan``), run under the queue's lock on the database's clock.

One transaction a round, one node at a time (``FAIR_LOCK`` with the queue's name):

1. read what the rules decide by (queries.sql ``fair_read``): the database's clock, the
   due jobs by key (walked key by key, at most a round's of each, and past ``WALK_KEYS``
   keys swept a window a round),
   the attempts of each key running under unexpired leases (counted from the rows, never
   kept as a counter that could leak), each key's bucket and finish tag
   (``fair_keys``), the queue's virtual time and bucket (``fair_queues``), and the queue's
   policy as stored now (a node's copy is a census old: it only says which queues have one);
2. plan the round in Python (``plan``: start-time fair queueing, each key's concurrency
   and bucket, the queue's bucket);
3. take the planned jobs (``fair_claim``: each key's next jobs in order, locked) and
   store the state the plan leaves (``fair_save``), in the same commit.

A queue with a policy row is claimed by fair rounds alone: the plain claim reads the
policies and leaves such queues out, so a node that has not heard of a new policy claims
nothing there rather than pass its limits, and a plain policy (``fair: false``, or none of
the limits) is claimed here too. So is a queue without one that held a job with a key at
the node's last census (``leases.claim``): fair between keys, no limit.

The keys come from the due jobs themselves, so a key's row can never strand a job (a
job whose key has no row yet starts with a full bucket at the virtual time), and a claim
never deletes a row. A bucket's state is durable with the claims it counted, so the
bound ``floor(r * W) + burst`` holds across nodes and across any node's kill -9. A key
that the plan charged but whose job another claim had locked (``SKIP LOCKED``: a rescue
or a cancel in between) is charged all the same: its rate can only come out lower.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import msgspec

from sqlq.common.fair import KeyState, Policy, encode_policy, plan, stored_policies
from sqlq.common.models import Job
from sqlq.engines.postgres.flows import job_of
from sqlq.engines.postgres.queries import Q

_PLAIN = Policy()
_DECODED: dict[str, Policy] = {}  # the policies' stored texts, decoded once each
_DECODED_MOST = 64


def _stored(raw: str | None) -> Policy:
    """The queue's policy as stored now: a node learns of a change only by its census, a
    second on, and must not pass the new limits meanwhile. None (the row was deleted): no
    limit, fair between keys. A text that no longer decodes: the same (``stored_policies``)."""
    if raw is None:
        return _PLAIN
    policy = _DECODED.get(raw)
    if policy is None:
        policy = stored_policies([("", raw)], _PLAIN)[""]
        if len(_DECODED) >= _DECODED_MOST:
            _DECODED.clear()
        _DECODED[raw] = policy
    return policy


# How a round reads the due jobs by key (queries.sql due_walked): it walks the keys, an
# index probe a key (any key with a scheduled job, due or not), and reads at most a
# round's jobs of each, however long its backlog (one tenant's flood of 100,000). Up to
# WALK_KEYS keys, a round reads them all and its order is exact. Past that, rounds sweep
# the keys in turns: each reads the next WALK_KEYS keys after where this node's last round
# of the queue went on from (the last key it took, or the last it read), so a round's
# cost is bounded whatever the number of keys, and a key waits at most a sweep. Within a
# round the rules are the same; the order between keys is by start tag among the keys
# read, so past WALK_KEYS fairness is kept a sweep at a time.
WALK_KEYS = 512


@dataclass
class Sweep:
    """Where one claimer's sweep of a fair queue's keys stands: each (queue, kinds, this
    node's or remote workers') has its own, as the tokens do (``leases.Between``)."""

    after: str = ""  # the key its next round reads after ('': from the first)
    left: int = 0  # in a run of short rounds: how many more times it may reach the last key
    wake: float | None = None  # the run's earliest token (a key its bucket held back)

    @property
    def idle(self) -> bool:
        return not self.after and not self.left


def _swept(sweep: Sweep, after: str, due: list[Any], take: dict[str | None, int], short: bool,
           wake: float | None) -> tuple[bool, float | None]:  # fmt: skip
    """Where the sweep goes on once a round (which read ``due`` after ``after``) took
    ``take``: after the last key it took (or the last it read), or from the first once it
    read the last. Whether a round ``short`` of jobs goes on at once: while keys its run of
    short rounds has not read yet may have due jobs, so they are claimed from, not left to
    a poll. A run begun at the first key ends at the last; one begun past it, at the last
    after it went on from the first: never a spin. A round after a run ended was woken by
    something else (a submission, an end): a new run. And the token to sleep until: the
    earliest any round of the run found (``wake``: this round's), so a key its bucket held
    back in an earlier window is not left to a poll either."""
    more = any(d[0] is None for d in due)
    if short:
        if not sweep.left:
            sweep.left, sweep.wake = (2 if after else 1), None
        sweep.left -= 0 if more else 1
        if sweep.wake is not None and (wake is None or sweep.wake < wake):
            wake = sweep.wake
    else:
        sweep.left = 0
    sweep.wake = wake if sweep.left else None
    sweep.after = ""
    if more:
        read = [(d[7], d[0]) for d in due if d[0] not in (None, _NO_KEY)]
        taken = [(depth, key) for depth, key in read if take.get(key)]
        sweep.after = max(taken or read, default=(0, ""))[1]
    return bool(sweep.left), wake


FAIR_LOCK = 0x5371_6C74  # with the queue's hash: one node at a time claims from a fair queue
CAP_LOCK = 0x5371_6C73  # with the queue's hash: a capped queue's claims, fair or plain
_NO_KEY = ""  # a job with no key, in the key tables (a key has a character at least)


async def fair_claim(
    conn: asyncpg.Connection,
    queue: str,
    n: int,
    now: float,
    lease_until: float,
    holder: str,
    kinds: Sequence[str] | None,
    cap: int | None = None,
    since: float | None = None,
    sweep: Sweep | None = None,
) -> tuple[list[Job], float | None, bool]:
    """Up to ``n`` due jobs of ``queue`` by its stored policy (and ``cap``, if any), claimed
    for ``holder``, the queue's state saved with them; and when a due job its buckets held
    back may start, on the caller's clock (``Plan.wake``; None: none was held back).
    ``since``: the ``perf_counter`` when ``now`` was read, so the wake counts the wait for
    the lock. A capped queue's claims take turns with ``claim_capped``'s (``CAP_LOCK``
    first, always in that order): a node that has not heard of a policy yet counts its
    running jobs under the same lock. Last, whether to claim again at once: the round came
    up short of jobs and its ``sweep`` left keys unread, or the token it reports has come
    already (``_swept``)."""
    sweep = Sweep() if sweep is None else sweep
    async with conn.transaction():
        if cap is not None:
            await conn.execute(Q["cap_lock"], CAP_LOCK, queue)
        await conn.execute(Q["fair_lock"], FAIR_LOCK, queue)
        after = sweep.after
        row = await conn.fetchrow(Q["fair_read"], queue, now, now, kinds, n, WALK_KEYS, after)
        due = msgspec.json.decode(row["keys"])
        read = now if since is None else now + (time.perf_counter() - since)
        if row["paused"]:
            return [], None, False
        if cap is not None:
            n = min(n, cap - int(row["running"]))
        if n <= 0:
            return [], None, False  # (a finishing attempt frees a slot: its worker claims)
        keys = {
            (None if k == _NO_KEY else k): KeyState(
                due=int(due), oldest=float(oldest), running=int(running), tat=tat,
                finish=finish, weight=int(weight),
            )
            for k, due, oldest, running, tat, finish, weight, _ in due
            if k is not None and due > 0
        }  # fmt: skip
        if not keys:
            return [], *_went_on(*_swept(sweep, after, due, {}, True, None), read)
        db_now = float(row["db_now"])
        policy = _stored(row["policy"])  # the database's, not the node's copy of it
        made = plan(keys, policy, virtual=row["virtual"] or 0.0, queue_tat=row["queue_tat"],
                    now=db_now, n=n)  # fmt: skip
        wake = None if made.wake is None else read + (made.wake - db_now)
        short = sum(made.take.values()) < n
        wake, go_on = _went_on(*_swept(sweep, after, due, made.take, short, wake), read)
        if not made.take:
            return [], wake, go_on
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
    return [job_of(r) for r in rows], wake, go_on


def _went_on(go_on: bool, wake: float | None, read: float) -> tuple[float | None, bool]:
    """(the token, whether to claim again at once): at once too if the token has come."""
    return wake, go_on or (wake is not None and wake <= read)


async def set_policy(conn: asyncpg.Connection, queue: str, policy: Policy | None) -> None:
    raw = None if policy is None else encode_policy(policy)
    await conn.fetchrow(Q["set_policy"], queue, raw)


async def policies(conn: asyncpg.Connection) -> dict[str, Policy]:
    """Every policy row (one that no longer decodes: no limit, ``stored_policies``)."""
    rows = await conn.fetch(Q["policies"])
    return stored_policies([(r[0], r[1]) for r in rows], _PLAIN)


async def push_back(conn: asyncpg.Connection, queue: str, key: str | None, hold_s: float) -> None:
    """``key``'s bucket in ``queue`` allows no start before ``hold_s`` from now, on the
    database's clock (a handler's ``RateLimited``: ``sqlq.common.fair.push_back``), under
    the queue's lock, so a round in flight can't write its older bucket over it."""
    async with conn.transaction():
        await conn.execute(Q["fair_lock"], FAIR_LOCK, queue)
        await conn.execute(Q["fair_push_back"], queue, key or _NO_KEY, hold_s)
