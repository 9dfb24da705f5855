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

import re
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import msgspec

from sqlq.common.fair import Policy
from sqlq.common.models import Job
from sqlq.common.running import Progress
from sqlq.common.specs import QUEUE_PATTERN
from sqlq.common.store import Extended, Lease
from sqlq.engines.postgres.fair import CAP_LOCK, Sweep, fair_claim
from sqlq.engines.postgres.flows import job_of
from sqlq.engines.postgres.queries import Q

encode = msgspec.json.Encoder().encode  # progress, as rows.py writes it


Tokens = dict[tuple[str, tuple[str, ...] | None], float]  # (queue, kinds) -> next token


SweepKey = tuple[str, tuple[str, ...] | None, bool]  # (queue, kinds, a remote worker's)
SWEEPS_MOST = 1024  # sweeps kept (a hint: one forgotten starts over from the first key)
KEYED_HEARD_MOST = 4096  # queues a node takes as keyed from wakes between censuses
_QUEUE = re.compile(QUEUE_PATTERN)


@dataclass
class Between:
    """What a store's claims remember from one to the next: the fair queues' next tokens,
    of this node's claims and of remote workers' apart (``next_token``), and whether a
    sweep said to claim again at once (``go_on``); the turns; the queues that hold a job
    with a key (``keyed``); where each fair queue's sweep of its keys goes on; and whether
    the plain claim may find a job (``plain_may``)."""

    own: Tokens = field(default_factory=dict)
    remote: Tokens = field(default_factory=dict)
    go_on: list[bool] = field(default_factory=lambda: [False, False])  # own, remote
    turns: list[int] = field(default_factory=lambda: [0, 0])  # this node's claims', remote
    keyed: frozenset[str] = frozenset()
    sweeps: dict[SweepKey, Sweep] = field(default_factory=dict)
    # The queues that held a scheduled job, and those paused, at the last census (None:
    # not counted yet); whether a wake was heard since that census began, and the wakes
    # heard (with the keyed queues they named since it began, which it may have missed).
    scheduled: frozenset[str] | None = None
    paused: frozenset[str] = frozenset()
    woken: bool = True
    wakes: int = 0
    heard_keyed: set[str] = field(default_factory=set)

    def heard(self, keyed: Sequence[str] = ()) -> None:
        """A wake (a submission, a job due again, a resume: any node's commit, this one's
        too), naming the queues it gave jobs with a key: fair from this node's next claim,
        not its next census. Names are checked and bounded (anyone may NOTIFY)."""
        self.wakes += 1
        self.woken = True
        named = [q for q in keyed if q not in self.keyed and _QUEUE.fullmatch(q)]
        if named and len(self.keyed) + len(named) <= KEYED_HEARD_MOST:
            self.keyed = self.keyed.union(named)
            self.heard_keyed.update(named)

    async def counted(self, census: Callable[[], Awaitable[list[Any]]]) -> list[Any]:
        """The census's rows (queue, state, jobs, jobs with a key), read by ``census``: which
        queues hold a scheduled job, and which one with a key. A wake heard while it reads
        may be of a job it missed: it stays heard, and the keyed queues it named stay."""
        began = self.wakes
        self.heard_keyed = set()
        rows = await census()
        self.keyed = frozenset(r[0] for r in rows if r[3] and r[1] == "scheduled").union(
            self.heard_keyed
        )
        self.scheduled = frozenset(r[0] for r in rows if r[1] == "scheduled")
        self.woken = self.wakes != began
        return rows

    def plain_may(self, skipped: Collection[str], wanted: Collection[str] | None) -> bool:
        """Whether the plain claim may find a due job: a wake came since the last census, or
        that census saw a scheduled job in a queue it claims. Otherwise it would only walk
        past the due jobs of the queues it leaves out (a fair, capped or paused queue's
        backlog of 100,000 cost every plain claim 47 ms) to find none. Every way a job comes
        due wakes (a submission, a retry, a rescue, a resume, a tick) or was counted (a
        delayed job is scheduled); a wake that is lost waits for the next census."""
        if self.woken or self.scheduled is None:
            return True
        return any(q not in skipped and q not in self.paused and (wanted is None or q in wanted)
                   for q in self.scheduled)  # fmt: skip

    def sweep(self, queue: str, kinds: tuple[str, ...] | None, remote: bool) -> Sweep:
        key = (queue, kinds, remote)
        sweep = self.sweeps.get(key)
        if sweep is None:
            if len(self.sweeps) >= SWEEPS_MOST:
                self.sweeps = {k: v for k, v in self.sweeps.items() if not v.idle}
                if len(self.sweeps) >= SWEEPS_MOST:
                    self.sweeps.clear()
            sweep = self.sweeps[key] = Sweep()
        return sweep


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
    between: Between | None = None,
    remote: bool = False,
) -> list[Job]:
    """Up to ``n`` due jobs for ``holder`` (``SharedStore.claim``), in claim order.

    The queues are claimed from in turns: the plain claim (one statement for every queue
    with neither a cap nor a policy), each queue with a policy by its own rules
    (``fair.fair_claim``), each capped queue under its lock. A queue without a policy that
    held a job with a key at the last census (``between.keyed``) is fair between its keys
    too, as a queue in one process is while it holds one: no limit, so a node whose census
    is a second old claims it plainly meanwhile, and passes nothing but the order. Which
    goes first moves on by one each claim, so a backlog in one never starves the others
    when the workers waiting are few. A fair queue takes a turn only while it has a due
    job (``fair_due``, one statement for all of them): an idle one would cost every claim
    a transaction, and the plain claim only while it may find one (``Between.plain_may``).
    Each fair round leaves in the tokens when its queue's buckets next let a held job
    start (the entry gone: none held back). Both are kept in ``between``, the tokens of a
    ``remote`` worker's claim apart."""
    started = time.perf_counter()
    left_out = set(besides)
    wanted = None if only is None else [q for q in dict.fromkeys(only) if q not in left_out]
    if wanted == [] or n <= 0:
        return []
    kind_list = None if kinds is None else list(dict.fromkeys(kinds))
    kinds_key = None if kind_list is None else tuple(sorted(kind_list))
    # Every queue with a policy, a plain one too (``fair: false``, or no limit): the plain
    # and the capped claims leave every such queue out (the policies are rows they read),
    # so only a fair round claims from it.
    between = between or Between()
    ruled = set(policies or ()) | between.keyed
    fair = {q for q in ruled if q not in left_out and (wanted is None or q in wanted)}
    capped = sorted(q for q in caps if q not in left_out and q not in fair
                    and (wanted is None or q in wanted))  # fmt: skip
    skipped_set = left_out | set(caps) | ruled
    skipped = sorted(skipped_set)
    tokens = between.remote if remote else between.own
    if fair:  # only those with a due job pay a round (an idle one holds nothing back)
        due = {r[0] for r in await conn.fetch(Q["fair_due"], sorted(fair), now, kind_list)}
        for queue in fair - due:
            tokens.pop((queue, kinds_key), None)
        fair = due
    wanted_set = None if wanted is None else set(wanted)
    plain: list[str | None] = [None] if between.plain_may(skipped_set, wanted_set) else []
    sources: list[str | None] = [*plain, *sorted(fair), *capped]  # None: the plain claim
    if not sources:
        return []
    turn = between.turns[remote] % len(sources)  # (apart: each side's turns its own)
    between.turns[remote] += 1
    jobs: list[Job] = []
    for source in sources[turn:] + sources[:turn]:
        if len(jobs) >= n:
            break
        if source is None:
            rows = await conn.fetch(Q["claim"], now, n - len(jobs), lease_until, skipped,
                                    holder, wanted, kind_list)  # fmt: skip
        elif source in fair:
            got, wake, go_on = await fair_claim(
                conn, source, n - len(jobs), now, lease_until, holder, kind_list,
                caps.get(source), started, between.sweep(source, kinds_key, remote),
            )  # fmt: skip
            jobs += got
            between.go_on[remote] |= go_on
            if wake is None:
                tokens.pop((source, kinds_key), None)
            else:
                tokens[(source, kinds_key)] = wake
            continue
        else:
            async with conn.transaction():
                await conn.execute(Q["cap_lock"], CAP_LOCK, source)
                rows = await conn.fetch(
                    Q["claim_capped"], now, n - len(jobs), lease_until, source, holder,
                    caps[source], kind_list,
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


def next_due(between: Between, remote: bool, due: float | None, now: float) -> float | None:
    """``SharedStore.next_due`` from the earliest delayed job (``due``): ``now`` if a sweep
    said to claim again at once (said once: the next answer is the tokens'), else the
    earlier of ``due`` and the next token."""
    if between.go_on[remote]:
        between.go_on[remote] = False
        return now
    token = next_token(between.remote if remote else between.own, now)
    return token if token is not None and (due is None or token < due) else due


def next_token(tokens: Tokens, now: float) -> float | None:
    """The earliest of the fair queues' next tokens still ahead of ``now`` (``claim``'s
    tokens). One that has come is forgotten (the round it woke, or the next, leaves the
    next), so a queue whose policy went away can't keep a claimer awake, and a waiter
    that reads again at once never reads a past time twice."""
    for key in [k for k, t in tokens.items() if t <= now]:
        del tokens[key]
    return min(tokens.values(), default=None)


async def nodes(conn: asyncpg.Connection, now: float, me: str) -> list[dict[str, Any]]:
    """The nodes seen in the last hour, each with the jobs it holds (``SharedStore.nodes``)."""
    rows = await conn.fetch(Q["nodes"], now - 3600)
    return [
        {"name": r[0], "started_at": r[1], "seen_at": r[2], "running": int(r[3]),
         "this": r[0] == me}
        for r in rows
    ]  # fmt: skip
