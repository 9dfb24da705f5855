"""Pure scheduling logic: literal timestamps, a seeded RNG, no clock, no loop."""

from __future__ import annotations

import random

import pytest

from sqlq.common.backoff import FAST_RETRY, RetryPolicy, TaskRetry, retry_delay, should_retry
from sqlq.runtime.lanes import Lanes


class FixedRandom(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize(
    ("attempt", "expected"), [(1, 0.010), (2, 0.020), (3, 0.040), (4, 0.080), (10, 5.0)]
)
def test_delay_doubles_then_caps_without_jitter(attempt: int, expected: float) -> None:
    assert retry_delay(attempt, FAST_RETRY, FixedRandom(0.0)) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [(1, 15.0), (2, 30.0), (3, 60.0), (5, 240.0), (10, 7680.0), (11, 15360.0), (12, 21600.0)],
)
def test_the_default_starts_at_15_s_and_grows_to_hours(attempt: int, expected: float) -> None:
    """Sized for real work (Oban's, Sidekiq's): an outage of minutes outlasted, not spent."""
    assert retry_delay(attempt, RetryPolicy(), FixedRandom(0.0)) == pytest.approx(expected)


def test_a_bad_backoff_is_refused() -> None:
    with pytest.raises(ValueError, match="backoff needs"):
        RetryPolicy(base_s=-1.0)
    with pytest.raises(ValueError, match="backoff needs"):
        RetryPolicy(cap_s=-1.0)
    with pytest.raises(ValueError, match="backoff needs"):
        RetryPolicy(jitter=1.5)


def test_task_rules_decide_retry_and_delay() -> None:
    rules = TaskRetry(max_attempts=3, backoff=RetryPolicy(base_s=2.0, jitter=0.0),
                      retry_on=(OSError,), no_retry_on=(FileNotFoundError,))  # fmt: skip
    assert rules.retries(ConnectionError())
    assert not rules.retries(ValueError())
    assert not rules.retries(FileNotFoundError())  # no_retry_on wins over retry_on
    f = rules.failure("OSError: x", "tb", True, 2, FixedRandom(0.0))
    assert (f.retry, f.delay_s, f.traceback) == (True, 4.0, "tb")
    assert not rules.failure("OSError: x", None, True, 3, FixedRandom(0.0)).retry  # its max
    assert TaskRetry().failure("e", None, True, 1, FixedRandom(0.0)).delay_s is None


def test_jitter_adds_at_most_half() -> None:
    policy = FAST_RETRY
    assert retry_delay(2, policy, FixedRandom(0.999999)) == pytest.approx(0.030, rel=1e-4)
    delays = [retry_delay(3, policy, random.Random(seed)) for seed in range(200)]
    assert all(0.040 <= d < 0.060 for d in delays)
    assert len({round(d, 9) for d in delays}) > 150  # it really is spread


def test_seeded_jitter_repeats() -> None:
    a = [retry_delay(i, RetryPolicy(), random.Random(7)) for i in range(1, 6)]
    b = [retry_delay(i, RetryPolicy(), random.Random(7)) for i in range(1, 6)]
    assert a == b


def test_should_retry() -> None:
    assert should_retry(1, 5, RetryPolicy())
    assert not should_retry(5, 5, RetryPolicy())
    assert not should_retry(1, 5, RetryPolicy(retries=False))


def test_ready_job_skips_the_heap() -> None:
    lanes: Lanes[str] = Lanes()
    assert lanes.push("now", ready_at=100.0, priority=0, now=100.0) is False
    assert lanes.push("later", ready_at=105.0, priority=0, now=100.0) is True
    assert lanes.sizes() == {"immediate": 1, "delayed": 1}
    assert lanes.next_wakeup() == 105.0
    assert lanes.pop(100.0) == "now"
    assert lanes.pop(104.999) is None
    assert lanes.pop(105.0) == "later"
    assert lanes.next_wakeup() is None


def test_among_due_jobs_higher_priority_first_then_fifo() -> None:
    lanes: Lanes[str] = Lanes()
    lanes.push("c", ready_at=110.0, priority=0, now=100.0)
    lanes.push("b2", ready_at=105.0, priority=1, now=100.0)
    lanes.push("a", ready_at=105.0, priority=0, now=100.0)
    lanes.push("b1", ready_at=105.0, priority=1, now=100.0)
    assert lanes.pop(106.0) == "b2"  # c is not due yet; of the due ones, priority 1 first
    lanes.push("z", ready_at=0.0, priority=-5, now=106.0)
    lanes.push("h", ready_at=0.0, priority=9, now=106.0)
    assert [lanes.pop(200.0) for _ in range(6)] == ["h", "b1", "a", "c", "z", None]
    assert len(lanes) == 0


def test_one_priority_level_is_plain_fifo() -> None:
    lanes: Lanes[str] = Lanes()
    for i in range(1000):
        lanes.push(f"j{i}", ready_at=100.0, priority=0, now=100.0)
    assert list(lanes.ready) == [0]  # one deque, no per-job heap work
    assert [lanes.pop(100.0) for _ in range(1000)] == [f"j{i}" for i in range(1000)]


def test_due_delayed_jobs_go_before_later_immediate_ones() -> None:
    lanes: Lanes[str] = Lanes()
    lanes.push("delayed", ready_at=101.0, priority=0, now=100.0)
    lanes.push("immediate", ready_at=102.0, priority=0, now=102.0)
    assert lanes.pop(102.0) == "delayed"
    assert lanes.pop(102.0) == "immediate"


def test_loading_many_at_once_hands_them_out_as_pushing_them_one_by_one_does() -> None:
    """Recovery loads the lanes in bulk (one heapify); the order out must not change."""
    rng = random.Random(3)
    now = 100.0
    jobs = [(f"j{i:04d}", now + rng.uniform(-50, 50), rng.choice([0, 0, 1, 5])) for i in range(500)]
    pushed: Lanes[str] = Lanes()
    loaded: Lanes[str] = Lanes()
    for job_id, ready_at, priority in sorted(jobs, key=lambda j: j[1]):  # in due order
        pushed.push(job_id, ready_at, priority, now)
    ids, due, priorities = (list(column) for column in zip(*jobs, strict=True))
    loaded.load(ids, due, priorities, now)
    assert len(loaded) == len(pushed) == 500
    assert loaded.sizes() == pushed.sizes()
    out_pushed, out_loaded = [], []
    for t in (now, now + 10, now + 60):
        while (a := pushed.pop(t)) is not None:
            out_pushed.append(a)
        while (b := loaded.pop(t)) is not None:
            out_loaded.append(b)
    assert out_loaded == out_pushed
    assert len(out_loaded) == 500


class Wanted:
    """What the lanes ask of an entry once something was discarded: still wanted?"""

    def __init__(self) -> None:
        self.gone: set[str] = set()

    def __call__(self, item: str) -> bool:
        return item not in self.gone


def test_a_discarded_delayed_entry_leaves_the_sizes_at_once_and_is_never_handed_out() -> None:
    wanted = Wanted()
    lanes: Lanes[str] = Lanes(wanted)
    lanes.push("keep", ready_at=110.0, priority=0, now=100.0)
    for i in range(3):
        lanes.push(f"gone{i}", ready_at=105.0, priority=0, now=100.0)
    lanes.push("due", ready_at=100.0, priority=0, now=100.0)
    wanted.gone.add("gone0")
    lanes.discard(105.0)  # in the heap: counted out of it at once
    assert lanes.sizes() == {"immediate": 1, "delayed": 3}
    assert len(lanes) == 4
    assert [lanes.pop(200.0) for _ in range(5)] == ["due", "gone1", "gone2", "keep", None]
    assert lanes.sizes() == {"immediate": 0, "delayed": 0}
    assert lanes.entries == 0


def test_a_discarded_due_entry_is_skipped_at_the_front() -> None:
    wanted = Wanted()
    lanes: Lanes[str] = Lanes(wanted)
    for name in ("a", "b", "c", "d"):
        lanes.push(name, ready_at=100.0, priority=0, now=100.0)
    wanted.gone.add("a")
    lanes.discard(100.0)
    assert lanes.sizes()["immediate"] == 3
    assert lanes.peek(100.0) == 0
    assert [lanes.pop(100.0) for _ in range(4)] == ["b", "c", "d", None]


def test_stale_entries_are_purged_once_they_are_half_so_they_hold_no_memory() -> None:
    wanted = Wanted()
    lanes: Lanes[str] = Lanes(wanted)
    for i in range(10):
        lanes.push(f"j{i}", ready_at=1000.0 + i, priority=0, now=100.0)
    for i in range(6):
        wanted.gone.add(f"j{i}")
        lanes.discard(1000.0 + i)
    assert lanes.entries == len(lanes) == 4  # purged at the sixth: nothing stale is held
    assert lanes.stale_delayed == 0
    assert lanes.next_wakeup() == 1006.0
    lone: Lanes[str] = Lanes(wanted)
    lone.push("j0", ready_at=5000.0, priority=0, now=100.0)
    lone.discard(5000.0)
    assert lone.entries == 0  # its only entry was stale: empty at once, not at its due time


def test_a_clock_that_steps_back_never_hides_a_due_entry() -> None:
    lanes: Lanes[str] = Lanes()
    lanes.push("a", ready_at=100.0, priority=0, now=100.0)
    assert lanes.pop(110.0) == "a"
    # the wall clock stepped back to 105: a job due at 107 was due at 110 already
    assert lanes.push("b", ready_at=107.0, priority=0, now=105.0) is False
    assert lanes.sizes() == {"immediate": 1, "delayed": 0}


def test_the_last_live_entry_popped_takes_the_stale_ones_with_it() -> None:
    """A cancelled job due in a year must not keep its lanes (and its args) for a year once
    the live job beside it has gone."""
    wanted = Wanted()
    lanes: Lanes[str] = Lanes(wanted)
    lanes.push("a-year-away", ready_at=100.0 + 365 * 86400, priority=0, now=100.0)
    lanes.push("now", ready_at=100.0, priority=0, now=100.0)
    wanted.gone.add("a-year-away")
    lanes.discard(100.0 + 365 * 86400)  # one of two: no purge yet
    assert lanes.entries == 2
    assert lanes.pop(100.0) == "now"
    assert lanes.entries == 0
    assert lanes.next_wakeup() is None


@pytest.mark.parametrize("seed", range(6))
def test_the_delayed_lane_hands_out_in_due_then_arrival_order_in_or_out_of_order(
    seed: int,
) -> None:
    """The delayed lane keeps entries that come in order as columns and the rest in a heap;
    whatever the mix (a batch delayed alike, then one due sooner, ties, pops between pushes,
    a purge), what comes out is what one heap on (ready_at, arrival) would give."""
    import heapq

    rng = random.Random(seed)
    lanes: Lanes[str] = Lanes()
    model: list[tuple[float, int, str]] = []
    now, n, out, expected = 0.0, 0, [], []
    for _ in range(400):
        roll = rng.random()
        if roll < 0.6:  # mostly in order, sometimes a tie, sometimes earlier than the last
            at = now + rng.choice([50.0, 50.0, rng.uniform(1, 100)])
            name = f"j{n}"
            assert lanes.push(name, at, 0, now)
            heapq.heappush(model, (at, n, name))
            n += 1
        elif roll < 0.9:
            now += rng.uniform(0, 20)
            while (got := lanes.pop(now)) is not None:
                out.append(got)
            while model and model[0][0] <= now:
                expected.append(heapq.heappop(model)[2])
        else:  # drop every third of what waits: the lane keeps the rest in order
            gone = {name for _, k, name in model if k % 3 == 0}
            lanes.current = lambda item, gone=gone: item not in gone  # type: ignore[misc]
            lanes.purge()
            model = [e for e in model if e[2] not in gone]
            heapq.heapify(model)
        assert len(lanes) == len(model)
        assert lanes.next_wakeup() == (model[0][0] if model else None)
    now += 1000
    while (got := lanes.pop(now)) is not None:
        out.append(got)
    expected.extend(heapq.heappop(model)[2] for _ in range(len(model)))
    assert out == expected
    assert len(lanes) == 0


def test_loading_jobs_already_in_due_order_hands_them_out_as_pushing_does() -> None:
    """Recovery's jobs mostly come in due order (no sort then): due ones, ties, delayed ones."""
    now = 100.0
    times = [90.0, 95.0, 95.0, 100.0, 150.0, 150.0, 160.0, 200.0]
    jobs = [(f"j{i}", t, i % 2) for i, t in enumerate(times)]
    pushed: Lanes[str] = Lanes()
    loaded: Lanes[str] = Lanes()
    for job_id, ready_at, priority in jobs:
        pushed.push(job_id, ready_at, priority, now)
    ids, due, priorities = (list(column) for column in zip(*jobs, strict=True))
    loaded.load(ids, due, priorities, now)
    assert loaded.sizes() == pushed.sizes() == {"immediate": 4, "delayed": 4}
    out = [[lanes.pop(t) for t in (now, now, now, now, 155.0, 155.0, 300.0, 300.0, 300.0)]
           for lanes in (pushed, loaded)]  # fmt: skip
    assert out[0] == out[1]
    assert out[0][-1] is None
