"""#37 on PostgreSQL: fair claims across nodes, under each queue's lock on the database's
clock (``sqlq.engines.postgres.fair``). Two nodes on one database in every test."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from sqlq.bench.fairaudit import most_in_window
from sqlq.common import fair
from sqlq.common.fair import Policy, Rate
from sqlq.common.models import State
from sqlq.common.specs import JobSpec
from sqlq.common.store import JobQuery
from sqlq.runtime.service import Service
from sqlq.runtime.shared import SharedClaims
from tests import shared_helpers
from tests.helpers import final, wait_for
from tests.shared_helpers import PEAK, STARTED, Node

nodes = shared_helpers.nodes  # the fixture, by its name


async def _submit(rt: Service, n: int, key: str | None, queue: str = "q", **args: Any) -> list[Any]:
    specs = [JobSpec(kind="work", queue=queue, key=key, args={"name": key, **args})
             for _ in range(n)]  # fmt: skip
    return (await rt.submit(specs, batch=True))[0]


def _count_rounds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The queues of every fair round the claims run from now on, in order."""
    from sqlq.engines.postgres import leases
    from sqlq.engines.postgres.fair import fair_claim as real

    rounds: list[str] = []

    async def counted(conn: Any, queue: str, *args: Any) -> Any:
        rounds.append(queue)
        return await real(conn, queue, *args)

    monkeypatch.setattr(leases, "fair_claim", counted)
    return rounds


async def test_a_keys_concurrency_holds_across_two_nodes(nodes: Node) -> None:
    """The bar: key_concurrency 2 for key A, 50 jobs of 0.5 s, two nodes: never more than 2
    of A at once; B beside it is not held back."""
    a, b = nodes(workers=8), nodes(workers=8)
    for rt in (a, b):
        await rt.start()
    await a.set_policy("q", Policy(key_concurrency=2))
    await b.queues()  # (a count reads the policies again, as the census does on its own)
    jobs = [*await _submit(a, 25, "A", sleep=0.5), *await _submit(b, 25, "A", sleep=0.5),
            *await _submit(b, 4, "B", sleep=0.1)]  # fmt: skip
    for job in jobs:
        assert (await final(a, job.id, within=120)).state is State.COMPLETED
    assert PEAK["q/A"] == 2  # never more than 2 of A at once, counting both nodes
    assert PEAK["q/B"] >= 1
    assert STARTED.count("A") == 50


async def test_a_keys_rate_holds_across_two_nodes(nodes: Node) -> None:
    """Two nodes claim key A, rate 10/s, burst 1, for 2.5 s of the database's clock: at most
    11 starts in any 1 s window, counted on both nodes (the starts read back from rows)."""
    a, b = nodes(workers=8), nodes(workers=8)
    for rt in (a, b):
        await rt.start()
    rate = Rate(per_s=10.0, burst=1)
    await a.set_policy("q", Policy(rate=rate))
    await b.claims.set_policy("q", Policy(rate=rate))  # (as its census would read it)
    await _submit(a, 60, "A")
    await wait_for(lambda: len(STARTED) >= 25, 30)
    done = await a.list_jobs(JobQuery(queue="q", state=State.COMPLETED, limit=1000))
    starts = sorted(j.started_at for j in done if j.started_at is not None)
    most = most_in_window(starts, 1.0)
    assert most <= fair.starts_bound(rate, 1.0) == 11
    assert {j.holder for j in done} == {None}  # (a completed job holds nothing)


async def test_a_claimer_sleeps_until_the_next_token_not_a_poll(nodes: Node) -> None:
    """A rate-held key's jobs start as its tokens come, with a poll far longer than the
    whole run: each round leaves its next token, and the claimer wakes then (before, a
    bucket that held a job back left the claimer asleep for ``poll_s``)."""
    a, b = nodes(workers=4, poll_s=600.0), nodes(workers=4, poll_s=600.0)
    for rt in (a, b):
        await rt.start()
    rate = Rate(per_s=20.0, burst=1)
    await a.set_policy("q", Policy(rate=rate))
    await b.claims.set_policy("q", Policy(rate=rate))
    await _submit(a, 30, "A")
    await wait_for(lambda: len(STARTED) >= 30, 60)  # 1.5 s of tokens; 600 s a poll


async def test_one_key_flood_does_not_hold_back_anothers_job_across_nodes(nodes: Node) -> None:
    a, b = nodes(workers=4), nodes(workers=4)
    for rt in (a, b):
        await rt.start()
    await a.set_policy("q", Policy(queue_rate=Rate(per_s=1_000_000.0, burst=1_000_000)))
    await b.claims.set_policy("q", a.view.policies()["q"])
    await a.pause("q", True)
    await _submit(a, 2000, "A")
    [late] = await _submit(b, 1, "B")
    await a.pause("q", False)
    assert (await final(b, late.id, within=60)).state is State.COMPLETED
    assert STARTED.index("B") <= 16  # a round of the two nodes' workers, not the flood


async def test_a_policy_set_on_one_node_reaches_the_others(nodes: Node) -> None:
    a, b = nodes(workers=1), nodes(workers=1)
    for rt in (a, b):
        await rt.start()
    policy = Policy(key_concurrency=3)
    await a.set_policy("q", policy)
    await b.queues()  # (a count reads the policies again, as the census does on its own)
    assert b.view.policies() == {"q": policy}
    await a.set_policy("q", None)
    await b.queues()
    assert b.view.policies() == {}


async def test_a_queue_with_a_plain_policy_is_claimed(nodes: Node) -> None:
    """``fair: false`` sets no limit: its queue was left out of the plain claim (it has a
    policy) and out of the fair rounds (it had no limit), and its jobs waited for ever."""
    a = nodes(workers=4)
    await a.start()
    await a.set_policy("q", Policy(fair=False))
    jobs = [*await _submit(a, 3, "A"), *await _submit(a, 2, "B")]
    for job in jobs:
        assert (await final(a, job.id, within=30)).state is State.COMPLETED


async def test_a_node_that_has_not_heard_of_a_policy_does_not_pass_it(nodes: Node) -> None:
    """Node b is told nothing of q's policy (a census a second away), and holds a looser
    one for another: it must neither claim q plainly nor by its own copy. The plain claim
    leaves out every queue with a policy row, and a fair round reads the stored policy."""
    a, b = nodes(workers=0), nodes(workers=8, queue_caps={"capped": 8})
    await a.start()
    await b.start()
    tight = Policy(rate=Rate(per_s=2.0, burst=1))
    await a.set_policy("q", tight)
    await a.set_policy("loose", tight)
    await a.set_policy("capped", tight)  # (b caps it: claim_capped must leave it out too)
    # (as if its census had not read the new ones yet: q's, none; loose's, an old one)
    assert isinstance(b.claims, SharedClaims)
    b.claims._policy("q", None)
    b.claims._policy("capped", None)
    b.claims._policy("loose", Policy(rate=Rate(per_s=1000.0, burst=1000)))
    jobs = [*await _submit(b, 10, "A"), *await _submit(b, 10, "A", queue="loose"),
            *await _submit(b, 10, "A", queue="capped")]  # fmt: skip
    await wait_for(lambda: len(STARTED) >= 12, 30)
    for queue in ("q", "loose", "capped"):
        done = await a.list_jobs(JobQuery(queue=queue, limit=1000))
        starts = sorted(j.started_at for j in done if j.started_at is not None)
        most = most_in_window(starts, 1.0)
        assert most <= fair.starts_bound(Rate(per_s=2.0, burst=1), 1.0), (queue, starts)
    assert len(jobs) == 30


async def test_a_stored_policy_that_does_not_decode_leaves_its_queue_claimed(
    nodes: Node, pg_db: str
) -> None:
    """Review: a policy row no node can read (a newer version's field) was left out of
    every node's policies while the plain claim left its queue out: no one claimed it.
    It is taken as no limit, claimed by fair rounds."""
    import asyncpg

    conn = await asyncpg.connect(pg_db)
    try:
        await conn.execute("INSERT INTO policies (name, policy) VALUES ('q', '{\"newer\": 1}')")
    finally:
        await conn.close()
    a = nodes(workers=2)
    await a.start()
    assert "q" in a.view.policies()
    for job in await _submit(a, 5, "A"):
        assert (await final(a, job.id, within=30)).state is State.COMPLETED


async def test_a_backlog_in_a_plain_queue_does_not_starve_a_queue_with_a_policy(
    nodes: Node,
) -> None:
    """Review: the plain claim went first with every waiting worker, then the queues with a
    policy: one worker and a plain backlog left a fair queue's job for last. The sources
    take turns."""
    a = nodes(workers=1)
    await a.start()
    await a.set_policy("fair", Policy(key_concurrency=5))
    await a.pause("plain", True)
    await a.pause("fair", True)
    await _submit(a, 40, "P", queue="plain")
    [late] = await _submit(a, 1, "F", queue="fair")
    await a.pause("plain", False)
    await wait_for(lambda: "P" in STARTED, 30)
    await a.pause("fair", False)
    assert (await final(a, late.id, within=60)).state is State.COMPLETED
    assert STARTED.index("F") < 10  # a few turns in, not after the 40


async def test_a_round_walks_the_keys_and_past_its_window_sweeps_on(pg_db: str) -> None:
    """fair_read's due jobs by key (due_walked): each key's next jobs, at most a round's of
    each, whatever its backlog; past $6 keys a row with a NULL key says more are left, and
    a round begun after a key ($7) reads on from there."""
    import asyncpg

    from sqlq.common.models import Job
    from sqlq.engines.postgres.queries import Q
    from sqlq.engines.postgres.store import PostgresStore

    store = PostgresStore(pg_db)
    await store.open()
    try:
        now = 1_000.0

        def job(key: str | None, at: float = now - 5, kind: str = "k", pri: int = 0) -> Job:
            return Job.new(kind=kind, args=None, now=at, ready_at=at, queue="q", key=key,
                           priority=pri)  # fmt: skip

        elsewhere = Job.new(kind="k", args=None, now=now, queue="other", key="A")
        await store.commit([*(job("A", now - i) for i in range(50)), job("B", now - 1),
                            job("B", now - 60, pri=-1), job(None), job(None, now - 9),
                            job("C", now + 100), job("D", kind="other"), elsewhere])  # fmt: skip
        conn = await asyncpg.connect(pg_db)

        async def read(kinds: list[str] | None, most: int, after: str = "") -> dict[Any, Any]:
            row = await conn.fetchrow(Q["fair_read"], "q", now, now, kinds, 4, most, after)
            return {k: (n, oldest, depth) for k, n, oldest, *_, depth
                    in msgspec.json.decode(row["keys"])}  # fmt: skip

        try:
            every = await read(None, 8)
            assert every == {"A": (4, now - 49, 1), "B": (2, now - 60, 2), "C": (0, None, 3),
                             "D": (1, now - 5, 4), "": (2, now - 9, 0)}  # fmt: skip
            assert (await read(["k"], 8))["D"][0] == 0  # (D's job is of another kind)
            window = await read(None, 2)  # (C's delayed job counts as a key walked)
            assert set(window) == {"A", "B", "", None}
            assert set(await read(None, 2, after="B")) == {"C", "D", ""}
        finally:
            await conn.close()
    finally:
        await store.close()


async def test_past_its_window_a_sweep_serves_every_key_and_holds_the_limits(
    nodes: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More keys than a round reads (WALK_KEYS 3 here, for 12 keys): rounds sweep them in
    turns, every key's jobs are claimed, a key's concurrency holds across two nodes, and a
    round short of jobs goes on to the keys after its window, not to a poll."""
    from sqlq.engines.postgres import fair as pg_fair

    monkeypatch.setattr(pg_fair, "WALK_KEYS", 3)
    a, b = nodes(workers=4, poll_s=600.0), nodes(workers=4, poll_s=600.0)
    for rt in (a, b):
        await rt.start()
    await a.set_policy("q", Policy(key_concurrency=1))
    await b.queues()
    later = [JobSpec(kind="work", queue="q", key=f"a{i}", delay_ms=3_600_000) for i in range(6)]
    await a.pause("q", True)  # (one kick at the resume: no submission's wakes a claimer)
    await a.submit(later, batch=True)  # (the first windows: keys with no due job)
    jobs = [job for i in range(12) for job in await _submit(a, 3, f"k{i:02}", sleep=0.02)]
    await a.pause("q", False)
    for job in jobs:
        assert (await final(a, job.id, within=30)).state is State.COMPLETED
    assert all(PEAK[f"q/k{i:02}"] == 1 for i in range(12))
    assert len(STARTED) == 36


async def test_an_idle_queue_with_a_policy_costs_a_claim_no_round(
    nodes: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S on PostgreSQL: five empty queues with policies took each claim of a plain queue
    through five fair rounds (a transaction and a lock each), and its drain crawled. Only
    a queue with a due job takes its turn."""
    rounds = _count_rounds(monkeypatch)
    a = nodes(workers=2)
    await a.start()
    for q in ("p1", "p2", "p3"):
        await a.set_policy(q, Policy(key_concurrency=1))
    for job in await _submit(a, 40, None, queue="plain"):  # (no key: a plain queue)
        assert (await final(a, job.id, within=60)).state is State.COMPLETED
    assert rounds == []
    [held] = await _submit(a, 1, "A", queue="p1")
    assert (await final(a, held.id, within=60)).state is State.COMPLETED
    assert set(rounds) == {"p1"}


async def _store(pg_db: str) -> Any:
    from sqlq.engines.postgres.store import PostgresStore

    store = PostgresStore(pg_db)
    await store.open()
    return store


def _job(key: str | None, at: float, weight: int = 1, queue: str = "q") -> Any:
    from sqlq.common.models import Job

    return Job.new(kind="k", args=None, now=at, ready_at=at, queue=queue, key=key,
                   weight=weight)  # fmt: skip


def _by_key(jobs: list[Any]) -> dict[str | None, int]:
    out: dict[str | None, int] = {}
    for job in jobs:
        out[job.key] = out.get(job.key, 0) + 1
    return out


async def test_a_queue_without_a_policy_is_fair_between_keys_once_a_census_saw_a_key(
    pg_db: str,
) -> None:
    """Fairness is the default once keys are present, as in one process: a queue with no
    policy was claimed oldest first on PostgreSQL, so B's one job waited for A's flood.
    A census that saw a key makes the queue's claims fair rounds; one that sees none
    makes them plain again."""
    import time

    store = await _store(pg_db)
    try:
        now = time.time()
        await store.commit([*(_job("A", now - 100 + i) for i in range(50)), _job("B", now - 1)])
        first = await store.claim(4, now, now + 60, {})
        assert _by_key(first) == {"A": 4}  # (no census yet: oldest first, no limit passed)
        await store.census()
        fair_round = await store.claim(4, now, now + 60, {})
        assert _by_key(fair_round) == {"A": 3, "B": 1}
        rest = await store.claim(100, now, now + 60, {})
        assert _by_key(rest) == {"A": 43}
        await store.commit([_job(None, now - 1)])
        await store.census()  # (no scheduled job with a key left: plain again)
        assert not store._between.keyed
        assert _by_key(await store.claim(4, now, now + 60, {})) == {None: 1}
    finally:
        await store.close()


async def test_keys_share_a_queue_by_their_jobs_weights(pg_db: str) -> None:
    """A job's weight counted on PostgreSQL only by a per-key override: A's jobs of weight 3
    against B's of 1 took a round half each. Now a key's due jobs' weight is its share."""
    import time

    store = await _store(pg_db)
    try:
        now = time.time()
        await store.commit([*(_job("A", now - 50 + i, weight=3) for i in range(40)),
                            *(_job("B", now - 50 + i) for i in range(40))])  # fmt: skip
        await store.census()
        taken = await store.claim(20, now, now + 60, {})
        assert _by_key(taken) == {"A": 15, "B": 5}
    finally:
        await store.close()


async def test_a_pushed_back_key_starts_nothing_until_then_on_any_node(pg_db: str) -> None:
    """A handler's RateLimited moves its key's bucket in the database, for every node: on
    PostgreSQL it moved nothing, and the key's next job started at its next token."""
    import time

    store, other = await _store(pg_db), await _store(pg_db)
    try:
        policy = Policy(rate=Rate(per_s=1.0, burst=1))
        await store.set_queue_policy("q", policy)
        now = time.time()
        await store.commit([*(_job("A", now - 9 + i) for i in range(5)),
                            *(_job("B", now - 9 + i) for i in range(5))])  # fmt: skip
        await store.push_back("q", "A", 3600.0)
        await store.push_back("q", "A", 1.0)  # (a shorter one never brings it forward)
        await store.push_back("q", "C", 5.0)  # (a key with no row yet gets one)
        taken = await other.claim(10, now, now + 60, {}, policies={"q": policy})
        assert _by_key(taken) == {"B": 1}  # (burst 1: one a round; A's bucket is an hour out)
        token = await other.next_due(time.time())
        assert token is not None
        assert token < time.time() + 2
        conn = await other._db.writer()
        rows = dict(await conn.fetch("SELECT key, tat FROM fair_keys WHERE queue = 'q'"))
        assert rows["A"] > time.time() + 3500
        assert time.time() < rows["C"] < time.time() + 6
    finally:
        await store.close()
        await other.close()


async def test_a_handlers_rate_limited_holds_its_keys_other_jobs_across_nodes(
    nodes: Node,
) -> None:
    """End to end: key A at 1/s; its first job's handler says "not for 2 s". A's next job
    started a token (1 s) later on PostgreSQL; now not before the 2 s are over, on
    either node."""
    a, b = nodes(workers=4), nodes(workers=4)
    for rt in (a, b):
        await rt.start()
    await a.set_policy("q", Policy(rate=Rate(per_s=1.0, burst=1)))
    await b.queues()
    [first] = await _submit(a, 1, "A", limited=2.0)
    await wait_for(lambda: STARTED.count("A") >= 1, 30)
    [second] = await _submit(b, 1, "A")
    done = await final(a, second.id, within=60)
    assert done.state is State.COMPLETED
    assert done.started_at is not None
    assert done.started_at - first.created_at >= 2.0
    assert (await final(a, first.id, within=60)).state is State.COMPLETED


def test_a_run_of_short_rounds_reads_every_key_once_and_then_stops() -> None:
    """The sweep's rule on numbers (``_swept``): a round short of jobs goes on while keys its
    run has not read may have jobs, ends once it has read them all (never a spin), and a
    round woken anew after that starts a new run (never a stall). The run's earliest token
    is the one it reports at its end: a key held back in an earlier window is not lost."""
    from sqlq.engines.postgres import fair as pg_fair

    sweep = pg_fair.Sweep()

    def window(*keys: str, more: bool) -> list[Any]:
        rows = [[k, 1, 0.0, 0, None, None, 1, i + 1] for i, k in enumerate(keys)]
        return rows + ([[None, 0, 0, 1, len(keys) + 1]] if more else [])

    def go(due: list[Any], take: dict[str | None, int], short: bool,
           wake: float | None = None) -> tuple[bool, float | None]:  # fmt: skip
        return pg_fair._swept(sweep, sweep.after, due, take, short, wake)

    assert go(window("a", "b", more=True), {"a": 2}, False) == (False, None)  # its fill
    assert sweep.after == "a"  # (on after the last key it took)
    assert go(window("b", "c", more=True), {}, True, wake=50.0) == (True, 50.0)  # on at once
    assert sweep.after == "c"  # (none taken: after the last it read)
    assert go(window("d", more=False), {}, True) == (True, 50.0)  # the last: on from the first
    assert sweep.after == ""
    assert go(window("a", "b", more=True), {"b": 1}, True, wake=60.0) == (True, 50.0)
    assert go(window("c", "d", more=False), {}, True) == (False, 50.0)  # all read: it ends
    assert sweep.idle
    assert go(window("a", "b", more=True), {}, True) == (True, None)  # woken anew: a new run
    assert go(window("c", "d", more=False), {}, True) == (False, None)
    assert go(window("a", more=False), {}, True) == (False, None)  # every key read at once
    assert sweep.idle


async def test_a_wake_tells_every_node_which_queues_were_given_keys(pg_db: str) -> None:
    """S on two nodes: B's one job behind A's flood waited for 64 of A's in a queue without
    a policy, because the other node's census had not seen a key yet and claimed it oldest
    first. The wake that a submission's commit sends names the queues given keys."""
    import time

    store, other = await _store(pg_db), await _store(pg_db)
    try:
        other.listen(lambda: None, lambda _: None)
        await wait_for(lambda: other._listener is not None, 30, "the listener")
        now = time.time()
        await store.commit([_job(None, now, queue="plain")])  # (a wake without keys)
        await store.commit([_job("A", now, queue="q1"), _job("B", now, queue="q2")])
        await wait_for(lambda: {"q1", "q2"} <= other._between.keyed, 30, "the keyed wake")
        assert "plain" not in other._between.keyed
    finally:
        await store.close()
        await other.close()


async def test_the_plain_claim_runs_only_while_it_may_find_a_job(pg_db: str) -> None:
    """Behind a fair queue's backlog the plain claim walked every due job it leaves out to
    find none: 47 ms a claim at 100,000. It now runs only after a wake, or while the last
    census saw a scheduled job in a queue it claims; and nothing waits longer than that."""
    import time

    store, other = await _store(pg_db), await _store(pg_db)
    try:
        now = time.time()
        await store.set_queue_policy("q", Policy(key_concurrency=1_000))
        await store.commit([_job(f"k{i}", now - 5) for i in range(50)])
        policies = {"q": Policy(key_concurrency=1_000)}
        await store.census()
        assert not store._between.woken
        assert not store._between.plain_may(["q"], None)
        await other.commit([_job(None, now - 1, queue="plain")])  # (no wake reaches store)
        got = await store.claim(60, now, now + 60, {}, policies=policies)
        assert _by_key(got) == {f"k{i}": 1 for i in range(50)}  # the plain claim was skipped
        await store.census()  # (it sees the plain queue's job)
        assert store._between.plain_may(["q"], None)
        assert _by_key(await store.claim(60, now, now + 60, {}, policies=policies)) == {None: 1}
        await store.census()
        await other.commit([_job(None, now - 1, queue="plain")])
        store._between.heard([])  # (the wake its commit sent)
        assert _by_key(await store.claim(60, now, now + 60, {}, policies=policies)) == {None: 1}
        await store.census()
        await store.commit([_job(None, now - 1, queue="plain")])  # (its own: no wake needed)
        assert _by_key(await store.claim(60, now, now + 60, {}, policies=policies)) == {None: 1}
    finally:
        await store.close()
        await other.close()


async def test_a_prune_forgets_the_keys_no_round_could_tell_from_none(pg_db: str) -> None:
    """fair_keys kept a row for every key ever claimed: 100,000 tenants seen once, 100,000
    rows for ever. A prune forgets an idle key (no live job, a full bucket), as a queue in
    one process does; it keeps any other."""
    import time

    store = await _store(pg_db)
    try:
        await store.set_queue_policy("q", Policy(rate=Rate(per_s=1000.0, burst=1)))
        policies = {"q": Policy(rate=Rate(per_s=1000.0, burst=1))}
        now = time.time()
        await store.commit([_job(k, now - 5) for k in ("done", "live", "pushed")])
        await store.commit([_job("live", now - 4)])
        claimed = await store.claim(10, now, now + 600, {}, policies=policies)
        assert _by_key(claimed) == {"done": 1, "live": 1, "pushed": 1}
        await store.commit([j.complete(None, time.time()) for j in claimed])
        await store.push_back("q", "pushed", 3600.0)
        conn = await store._db.writer()
        await wait_for(lambda: time.time() > now + 0.01, 5)  # (every bucket full again)
        await store.compact()
        rows = {r[0] for r in await conn.fetch("SELECT key FROM fair_keys WHERE queue = 'q'")}
        assert rows == {"live", "pushed"}  # "done" is forgotten
        again = await store.claim(10, time.time(), time.time() + 600, {}, policies=policies)
        assert _by_key(again) == {"live": 1}
    finally:
        await store.close()


async def test_a_wake_heard_while_a_census_reads_is_kept() -> None:
    """The census cleared the wake when it began: a NOTIFY heard while it read (its job
    perhaps not in the census's snapshot) was lost, and the plain claim skipped the job
    for a poll. The keyed queues a wake named meanwhile were lost the same way."""
    import asyncio

    from sqlq.engines.postgres.leases import Between

    between = Between()
    rows: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
    census = asyncio.create_task(between.counted(lambda: rows))
    await asyncio.sleep(0)
    between.heard(["q1", "bad name!"])  # (during the read; a name no queue has is dropped)
    rows.set_result([("q0", "scheduled", 3, 3), ("paused", "scheduled", 1, 0)])
    await census
    assert between.woken  # (still: the wake came after the census began)
    assert between.keyed == {"q0", "q1"}
    assert between.plain_may(set(), None)
    await between.counted(lambda: rows)  # (a census with no wake while it read)
    assert not between.woken
    assert between.keyed == {"q0"}
    assert between.plain_may(set(), None)  # (q0 and "paused" hold scheduled jobs)
    between.paused = frozenset({"paused"})
    assert not between.plain_may({"q0"}, None)
    assert not between.plain_may(set(), {"paused"})


async def test_a_paused_fair_queue_costs_a_claim_no_round(
    nodes: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fair_due left pauses to the round: a paused queue with keyed due jobs cost every
    claim a transaction, the lock and a read of up to 512 keys, to take nothing."""
    rounds = _count_rounds(monkeypatch)
    a = nodes(workers=2)
    await a.start()
    await a.pause("held", True)
    await _submit(a, 20, "A", queue="held")
    await a.queues()  # (a census: "held" holds keyed jobs)
    for job in await _submit(a, 20, None, queue="plain"):
        assert (await final(a, job.id, within=60)).state is State.COMPLETED
    assert "held" not in rounds
