"""#37: a fair queue's lanes (``sqlq.runtime.fairlanes``) and the bucket arithmetic
(``sqlq.common.fair``), pure: every decision takes ``now``, so time here is a number."""

from __future__ import annotations

import itertools

import msgspec
import pytest

from sqlq.common import fair
from sqlq.common.fair import KeyPolicy, Policy, Rate
from sqlq.common.models import Job
from sqlq.runtime.fairlanes import FairLanes

T0 = 1_700_000_000.0
_ids = itertools.count()


def job(key: str | None, *, priority: int = 0, ready_at: float = T0, weight: int = 1) -> Job:
    n = next(_ids)
    return Job(id=f"{n:032x}", kind="k", args=None, ready_at=ready_at, priority=priority,
               created_at=T0, updated_at=T0, key=key, weight=weight)  # fmt: skip


def lanes(policy: Policy, started_at: float = T0 - 3600) -> FairLanes:
    return FairLanes(lambda _: True, policy, started_at)


def fill(fl: FairLanes, jobs: list[Job], now: float = T0) -> None:
    for j in jobs:
        fl.push(j, j.ready_at, j.priority, now)


def drain(fl: FairLanes, now: float = T0) -> list[Job]:
    out = []
    while (j := fl.pop(now)) is not None:
        out.append(j)
    return out


def drain_n(fl: FairLanes, n: int, now: float = T0) -> list[Job]:
    out = [fl.pop(now) for _ in range(n)]
    assert all(j is not None for j in out)
    return [j for j in out if j is not None]


# -- the bucket -----------------------------------------------------------------------------


def test_gcra_spaces_starts_and_allows_a_burst() -> None:
    rate = Rate(per_s=10.0, burst=3)
    tat = 0.0  # a full bucket (times relative to a start, as the lanes keep them)
    starts: list[float] = []
    now = 0.0
    while len(starts) < 10:
        if fair.allowed_at(rate, tat) <= now:
            starts.append(now)
            tat = fair.take(rate, tat, now)
        else:
            now = fair.allowed_at(rate, tat)
    assert starts[:3] == [0.0] * 3  # the burst
    assert [b - a for a, b in itertools.pairwise(starts[2:])] == pytest.approx([0.1] * 7)
    assert fair.starts_bound(rate, 1.0) == 13


def test_an_empty_bucket_allows_its_first_start_one_interval_later() -> None:
    rate = Rate(per_s=4.0, burst=5)
    assert fair.allowed_at(rate, fair.empty(rate, T0)) == pytest.approx(T0 + 0.25)
    pushed = fair.push_back(rate, T0, T0, 30.0)  # an upstream's 429: not before 30 s
    assert fair.allowed_at(rate, pushed) == pytest.approx(T0 + 30)


def test_a_policy_decodes_with_bounds_named() -> None:
    policy = fair.decode_policy(b'{"rate":{"per_s":10,"burst":1},"key_concurrency":2}')
    assert policy == Policy(rate=Rate(per_s=10.0, burst=1), key_concurrency=2)
    with pytest.raises(msgspec.ValidationError, match=r"rate.per_s"):
        fair.decode_policy(b'{"rate":{"per_s":0}}')
    with pytest.raises(msgspec.ValidationError, match="key_concurrency"):
        fair.decode_policy(b'{"key_concurrency":0}')
    assert Policy().plain
    assert not Policy(fair=False, key_concurrency=1).plain


# -- the fair order -------------------------------------------------------------------------


def test_one_keys_flood_never_delays_anothers_job_past_a_round() -> None:
    fl = lanes(Policy())
    fill(fl, [job("a") for _ in range(1000)])
    b = job("b")
    fill(fl, [b])
    first = [fl.pop(T0) for _ in range(2)]
    assert b in first


def test_keys_share_by_weight() -> None:
    fl = lanes(Policy())
    fill(fl, [job("a", weight=3) for _ in range(300)] + [job("b") for _ in range(300)])
    served = [j.key for j in drain_n(fl, 400)]
    assert served.count("a") == 300  # 3 to 1 ...
    assert served.count("b") == 100
    fl2 = lanes(Policy(keys={"b": KeyPolicy(weight=3)}))  # an override's weight wins
    fill(fl2, [job("a") for _ in range(100)] + [job("b") for _ in range(100)])
    served = [j.key for j in drain_n(fl2, 40)]
    assert served.count("b") == 30


def test_a_key_back_from_idle_banks_no_credit() -> None:
    fl = lanes(Policy())
    fill(fl, [job("a") for _ in range(50)])
    for _ in range(20):
        assert fl.pop(T0) is not None  # a alone: the virtual time moves on
    fill(fl, [job("b") for _ in range(20)])
    served = [j.key for j in drain_n(fl, 10)]
    assert served.count("b") <= 6  # alternating, not b's twenty in a row


def test_priority_orders_jobs_within_a_key_only() -> None:
    fl = lanes(Policy())
    low, high = job("a", priority=0), job("a", priority=9)
    other = job("b", priority=-5)
    fill(fl, [low, other, high])
    order = drain(fl)
    assert order.index(high) < order.index(low)
    assert order.index(other) <= 1  # b's turn comes whatever a's priorities


def test_with_fair_off_keys_are_served_by_priority_then_age_under_their_limits() -> None:
    fl = lanes(Policy(fair=False, key_concurrency=10))
    old = job("a", ready_at=T0 - 5)
    young = job("b", ready_at=T0 - 1)
    urgent = job("c", priority=5, ready_at=T0)
    fill(fl, [young, old, urgent])
    assert drain(fl) == [urgent, old, young]


# -- limits ---------------------------------------------------------------------------------


def test_key_concurrency_holds_and_a_freed_slot_opens_the_key() -> None:
    fl = lanes(Policy(key_concurrency=2))
    a = [job("a") for _ in range(5)]
    b = job("b")
    fill(fl, [*a, b])
    got = drain(fl)
    assert sorted(j.id for j in got) == sorted([a[0].id, a[1].id, b.id])
    assert fl.top() is None  # a is full, b is empty
    fl.ended(a[0], T0)
    assert fl.pop(T0) == a[2]
    assert fl.pop(T0) is None
    assert fl.keys()["a"] == (2, 2)  # two due, two running


def test_a_rate_holds_in_every_window_and_the_wakeup_is_the_next_token() -> None:
    rate = Rate(per_s=10.0, burst=1)
    fl = lanes(Policy(rate=rate))
    fill(fl, [job("a") for _ in range(300)] + [job("b") for _ in range(5)])
    starts: list[tuple[float, str | None]] = []
    now = T0
    while now < T0 + 20:
        got = fl.pop(now)
        if got is not None:
            starts.append((now, got.key))
            fl.ended(got, now)
            continue
        wake = fl.next_wakeup()
        assert wake is not None
        assert wake > now
        now = wake
    a = [t for t, k in starts if k == "a"]
    for t in a:
        assert sum(1 for u in a if t <= u <= t + 1.0) <= fair.starts_bound(rate, 1.0) == 11
    assert len(a) >= 199  # work-conserving: within one of r * W over 20 s
    assert len([k for _, k in starts if k == "b"]) == 5


def test_a_bucket_restarts_empty() -> None:
    rate = Rate(per_s=2.0, burst=4)
    fl = lanes(Policy(rate=rate), started_at=T0)  # this process started now
    fill(fl, [job("a") for _ in range(10)])
    assert fl.pop(T0) is None
    assert fl.next_wakeup() == pytest.approx(T0 + 0.5)
    assert fl.pop(T0 + 0.5) is not None
    later = lanes(Policy(rate=rate), started_at=T0 - 10)  # long enough ago: a full bucket
    fill(later, [job("a") for _ in range(10)])
    assert len(drain(later)) == 4


def test_a_queue_rate_holds_every_key_together() -> None:
    fl = lanes(Policy(queue_rate=Rate(per_s=5.0, burst=2)))
    fill(fl, [job(k) for k in "abcdef" for _ in range(3)])
    assert len(drain(fl)) == 2
    assert fl.next_wakeup() == pytest.approx(T0 + 0.2)
    assert fl.pop(T0 + 0.2) is not None
    assert fl.pop(T0 + 0.2) is None


def test_pushed_back_moves_a_keys_bucket_forward() -> None:
    fl = lanes(Policy(rate=Rate(per_s=100.0, burst=10)))
    fill(fl, [job("a") for _ in range(3)])
    fl.pushed_back("a", 30.0, T0)
    assert fl.pop(T0) is None
    assert fl.next_wakeup() == pytest.approx(T0 + 30)


# -- bookkeeping ----------------------------------------------------------------------------


def test_delayed_jobs_wait_in_the_shared_lane_until_due() -> None:
    fl = lanes(Policy(key_concurrency=5))
    later = job("a", ready_at=T0 + 10)
    fill(fl, [later])
    assert fl.pop(T0) is None
    assert fl.next_wakeup() == T0 + 10
    assert fl.sizes() == {"immediate": 0, "delayed": 1}
    assert fl.pop(T0 + 10) == later


def test_a_discarded_entry_is_never_served_and_idle_keys_are_forgotten() -> None:
    live: set[str] = set()
    fl = FairLanes(lambda j: j.id in live, Policy(key_concurrency=3), T0 - 3600)
    jobs = [job("a"), job("b"), job("b", ready_at=T0 + 5)]
    live.update(j.id for j in jobs)
    fill(fl, jobs)
    live.discard(jobs[1].id)
    fl.discard(jobs[1].ready_at, jobs[1])
    live.discard(jobs[2].id)
    fl.discard(jobs[2].ready_at, jobs[2])
    assert len(fl) == 1
    assert drain(fl, T0 + 10) == [jobs[0]]
    fl.ended(jobs[0], T0 + 10)
    assert fl.keys() == {}
    assert fl.entries == 0


def test_a_new_policy_places_every_key_again() -> None:
    fl = lanes(Policy(key_concurrency=1))
    a = [job("a") for _ in range(3)]
    fill(fl, a)
    assert len(drain(fl)) == 1
    fl.set_policy(Policy(key_concurrency=3), T0)
    assert len(drain(fl)) == 2


def test_idle_keys_held_stay_bounded_by_the_keys_in_use() -> None:
    fl = lanes(Policy(rate=Rate(per_s=1.0, burst=1)))
    now = T0
    for i in range(10_000):  # a new key each second: each one's bucket fills before long
        j = job(f"k{i}")
        fill(fl, [j], now)
        assert fl.pop(now) == j
        fl.ended(j, now)
        now += 1.0
    assert len(fl.keys()) < 200


# -- a shared queue's plan (the same rules over state read under the queue's lock) -------


def states(**given: fair.KeyState) -> dict[str | None, fair.KeyState]:
    return {(None if k == "none" else k): v for k, v in given.items()}


def test_a_plan_serves_keys_fairly_under_their_limits() -> None:
    policy = Policy(key_concurrency=2, rate=Rate(per_s=10.0, burst=1))
    keys = states(a=fair.KeyState(due=100), b=fair.KeyState(due=1),
                  c=fair.KeyState(due=5, running=2), none=fair.KeyState(due=3))  # fmt: skip
    made = fair.plan(keys, policy, virtual=0.0, queue_tat=None, now=T0, n=16)
    assert made.take == {"a": 1, "b": 1, None: 1}  # burst 1 each; c is full
    assert made.tat["a"] == pytest.approx(T0 + 0.1)
    later = states(a=fair.KeyState(due=99, tat=made.tat["a"], finish=made.finish["a"]))
    again = fair.plan(later, policy, virtual=made.virtual, queue_tat=None, now=T0 + 0.05, n=16)
    assert again.take == {}  # its token comes at +0.1
    assert again.wake == pytest.approx(T0 + 0.1)  # and the claimer sleeps until then
    assert made.wake == pytest.approx(T0 + 0.1)  # a's, the first held back (c is full)
    full = states(c=fair.KeyState(due=5, running=2))
    assert fair.plan(full, policy, virtual=0.0, queue_tat=None, now=T0, n=16).wake is None
    flood = states(a=fair.KeyState(due=100_000), b=fair.KeyState(due=1))
    made = fair.plan(flood, Policy(), virtual=0.0, queue_tat=None, now=T0, n=2)
    assert made.take == {"a": 1, "b": 1}
    even = states(a=fair.KeyState(due=100), b=fair.KeyState(due=100))
    weighted = fair.plan(even, Policy(keys={"a": KeyPolicy(weight=3)}), virtual=0.0,
                         queue_tat=None, now=T0, n=8)  # fmt: skip
    assert weighted.take == {"a": 6, "b": 2}
    ten = states(a=fair.KeyState(due=10), b=fair.KeyState(due=10))
    queue = fair.plan(ten, Policy(queue_rate=Rate(per_s=1.0, burst=3)), virtual=0.0,
                      queue_tat=None, now=T0, n=10)  # fmt: skip
    assert sum(queue.take.values()) == 3
    assert queue.wake == pytest.approx(T0 + 1.0)  # the queue's next token
    assert fair.plan(ten, Policy(), virtual=0.0, queue_tat=None, now=T0, n=4).wake is None


async def test_running_counts_hold_when_a_queue_turns_fair_while_jobs_run() -> None:
    """Review: jobs popped while a queue was plain went uncounted when it turned fair, and
    their ends then took slots from jobs counted since, so key_concurrency was passed. New
    fair lanes count what runs (the claims' account) and an end counts only what was."""
    from sqlq.common.clock import FakeClock
    from sqlq.runtime.scheduler import Scheduler

    sch = Scheduler(FakeClock(T0))
    popped: list[Job] = []
    sch.running = lambda queue: [j for j in popped if j.queue == queue]
    for _ in range(3):
        sch.add(job(None))
    popped += [await sch.take() for _ in range(3)]
    sch.add(job("A"))  # the queue turns fair: the three running are counted
    sch.set_policy("default", Policy(key_concurrency=2))
    sch.add(job(None))
    sch.add(job(None))
    first = await sch.take()
    assert first.key == "A"  # no-key's three run: it is full
    assert sch.keys("default")[None] == (2, 3)
    for j in popped[:2]:
        sch.ended(j)
    sch.ended(job(None))  # an end of a job these lanes never counted: nothing
    assert sch.keys("default")[None] == (2, 1)
    nxt = await sch.take()
    assert nxt.key is None
    assert sch.keys("default")[None] == (1, 2)


async def test_a_queue_turned_fair_again_relanes_the_keyed_jobs_waiting() -> None:
    """Review: after ``{"fair": false}`` and back, keyed jobs already waiting stayed in the
    plain order until the next keyed job came."""
    from sqlq.common.clock import FakeClock
    from sqlq.runtime.scheduler import Scheduler

    sch = Scheduler(FakeClock(T0))
    sch.set_policy("default", Policy(fair=False))
    for _ in range(5):
        sch.add(job("A"))
    sch.add(job("B"))
    sch.set_policy("default", None)
    got = [await sch.take() for _ in range(2)]
    assert {j.key for j in got} == {"A", "B"}


def test_a_stored_policy_from_a_newer_version_keeps_the_limits_this_one_knows() -> None:
    """Review: a field this version does not know made the whole policy undecodable, taken
    as no limit on PostgreSQL, so a rolling upgrade dropped every limit of the queue. The
    fields it knows are kept; what does not decode even so is ``otherwise``."""
    newer = ('{"rate": {"per_s": 2, "burst": 1, "jitter": 3}, "key_concurrency": 2, '
             '"newer": true, "keys": {"A": {"weight": 2, "x": 1}}}')  # fmt: skip
    got = fair.stored_policies([("q", newer), ("bad", '{"rate": 5}')], Policy())
    assert got["q"] == Policy(rate=Rate(per_s=2.0, burst=1), key_concurrency=2,
                              keys={"A": KeyPolicy(weight=2)})  # fmt: skip
    assert got["bad"] == Policy()
    assert "bad" not in fair.stored_policies([("bad", '{"rate": 5}')])
    too_big = '{"key_concurrency": 0, "newer": 1}'  # (below today's bound: not a limit)
    assert fair.stored_policies([("q", too_big)], Policy())["q"] == Policy()
