"""The tick arithmetic on plain numbers: DST gaps and repeats, strictness, the catch-up
policies after a downtime, the bounds of a plan (what the parsers refuse: test_cron).

No clock and no sleeping: every time is a unix second the test names.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any

import pytest
from cronsim import CronSim
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from sqlq.common import ticks
from sqlq.common.errors import ValidationError
from sqlq.common.schedule import CatchUp, ScheduleSpec
from sqlq.common.ticks import ON_TIME_S, WALK_LIMIT, Plan, next_tick, plan, prev_tick

BERLIN = "Europe/Berlin"  # 2026: gap 03-29 02:00 -> 03:00 (01:00Z); repeat 10-25 03:00 -> 02:00
# 2026: gap 03-08 02:00 -> 03:00 (07:00Z); repeat 11-01 02:00 -> 01:00 (06:00Z)
NEW_YORK = "America/New_York"
TRANSITIONS = [  # (zone, the instant its clocks change)
    (BERLIN, 1774746000),  # 2026-03-29 01:00Z
    (BERLIN, 1792890000),  # 2026-10-25 01:00Z
    (NEW_YORK, 1772953200),  # 2026-03-08 07:00Z
    (NEW_YORK, 1793512800),  # 2026-11-01 06:00Z
]


def t(month: int, day: int, hour: int = 0, minute: int = 0, year: int = 2026) -> int:
    """A UTC wall time as unix seconds."""
    return int(datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp())


def cron(expr: str, tz: str = "UTC", **kw: Any) -> ScheduleSpec:
    return ScheduleSpec(kind="k", cron=expr, tz=tz, **kw)


def every(seconds: int, **kw: Any) -> ScheduleSpec:
    return ScheduleSpec(kind="k", every_s=seconds, **kw)


def chain(spec: ScheduleSpec, after: int, until: int) -> Iterator[int]:
    """The ticks in (after, until] by next_tick alone."""
    tick = next_tick(spec, after)
    while tick <= until:
        yield tick
        tick = next_tick(spec, tick)


def due(spec: ScheduleSpec, cursor: int, now: int) -> list[int]:
    """Both ways of listing the ticks in (cursor, now], checked against each other."""
    forward = list(chain(spec, cursor, now))
    catch_all = replace(spec, catch_up=CatchUp.ALL, max_catch_up=10_000)
    assert plan(catch_all, cursor, now) == Plan(forward, 0, forward[-1] if forward else cursor)
    return forward


# -- DST ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "tz", "start", "end", "expected"),
    [
        # a named wall time in the gap fires once, at the first instant after it
        ("30 2 * * *", BERLIN, t(3, 28, 12), t(3, 30, 12), [t(3, 29, 1), t(3, 30, 0, 30)]),
        ("30 2 * * *", NEW_YORK, t(3, 7, 12), t(3, 9, 12), [t(3, 8, 7), t(3, 9, 6, 30)]),
        # a named wall time that happens twice fires once, in its first copy
        ("30 2 * * *", BERLIN, t(10, 24, 12), t(10, 26, 12), [t(10, 25, 0, 30), t(10, 26, 1, 30)]),
        ("30 1 * * *", NEW_YORK, t(10, 31, 12), t(11, 2, 12), [t(11, 1, 5, 30), t(11, 2, 6, 30)]),
        # New York repeats 01:xx, so 02:30 happens once there that day (in EST)
        ("30 2 * * *", NEW_YORK, t(10, 31, 12), t(11, 2, 12), [t(11, 1, 7, 30), t(11, 2, 7, 30)]),
        # a * minute under a named hour keeps the wall-time rules (cronsim alone would give
        # the gap day no tick, and the repeat day eight)
        ("*/15 2 * * *", BERLIN, t(3, 28, 12), t(3, 29, 12), [t(3, 29, 1)]),
        ("*/15 2 * * *", BERLIN, t(10, 24, 12), t(10, 25, 12),
         [t(10, 25, 0, m) for m in (0, 15, 30, 45)]),
        # */2 hours in a half-hour repeat: every even real hour (cronsim lost 02:00 +10:30)
        ("0 */2 * * *", "Australia/Lord_Howe", t(4, 4, 12), t(4, 4, 20),
         [t(4, 4, 13), t(4, 4, 15, 30), t(4, 4, 17, 30), t(4, 4, 19, 30)]),
        # several wall times in the gap fold into one tick; the hour after it goes on
        ("0,30 2,3 * * *", BERLIN, t(3, 28, 23), t(3, 29, 3), [t(3, 29, 1), t(3, 29, 1, 30)]),
    ],
)  # fmt: skip
def test_dst(expr: str, tz: str, start: int, end: int, expected: list[int]) -> None:
    assert due(cron(expr, tz), start, end) == expected


@pytest.mark.parametrize(("tz", "change"), TRANSITIONS)
@pytest.mark.parametrize(("expr", "minutes"), [("0 * * * *", 60), ("*/15 * * * *", 15)])
def test_star_hours_walk_real_time(tz: str, change: int, expr: str, minutes: int) -> None:
    """Every real hour (quarter) across the change: none lost in the gap, and both copies
    of the repeated hour fire (02:00 CEST and 02:00 CET are two hours)."""
    start, end, step = change - 3 * 3600, change + 3 * 3600, minutes * 60
    assert due(cron(expr, tz), start, end) == list(range(start + step, end + 1, step))


def test_a_start_in_the_second_copy_of_a_repeated_hour_never_goes_back() -> None:
    """cronsim drops fold: from 02:10 CET (the second 02:10) it would answer 02:30 CEST,
    40 minutes before the start; the wrapper passes over that."""
    second_copy = t(10, 25, 1, 10)
    assert next_tick(cron("30 2 * * *", BERLIN), second_copy) == t(10, 26, 1, 30)
    # sixty wall times of the first copy lie behind such a start
    assert next_tick(cron("0-59 2 * * *", BERLIN), t(10, 25, 1, 5)) == t(10, 26, 1)
    assert prev_tick(cron("30 2 * * *", BERLIN), second_copy) == t(10, 25, 0, 30)
    assert prev_tick(cron("0-59 2 * * *", BERLIN), second_copy) == t(10, 25, 0, 59)


@pytest.mark.parametrize(
    ("spec", "tick", "step"),
    [(every(1), 1_000_000, 1), (every(90), 90 * 20_000, 90), (every(7), 0, 7),
     (cron("*/5 * * * *"), t(5, 4, 10), 300), (cron("*/5 * * * *", BERLIN), t(5, 4, 10), 300),
     (cron("0 9 * * *", NEW_YORK), t(5, 4, 13), 86400)],
)  # fmt: skip
def test_next_tick_is_strictly_after(spec: ScheduleSpec, tick: int, step: int) -> None:
    assert next_tick(spec, tick - 1) == tick
    assert next_tick(spec, tick) == tick + step
    assert next_tick(spec, tick + step - 1) == tick + step
    assert prev_tick(spec, tick) == tick
    assert prev_tick(spec, tick - 1) == tick - step
    assert prev_tick(spec, tick + step - 1) == tick


def test_three_seconds_down_with_every_s_1() -> None:
    assert plan(every(1), 1000, 1003) == Plan([1003], 2, 1003)
    assert plan(every(1, catch_up=CatchUp.ALL), 1000, 1003) == Plan([1001, 1002, 1003], 0, 1003)
    assert plan(every(1, catch_up=CatchUp.SKIP), 1000, 1003) == Plan([1003], 2, 1003)


def test_an_hour_down() -> None:
    cursor, now = 0, 3600 * 5 + 7  # the newest tick, 18000, is overdue by 7 s: missed
    assert plan(every(60, catch_up=CatchUp.SKIP), cursor, now) == Plan([], 300, 18000)
    assert plan(every(60), cursor, now) == Plan([18000], 299, 18000)
    assert plan(every(60, catch_up_window_s=6.5), cursor, now) == Plan([], 300, 18000)
    catch_all = plan(every(60, catch_up=CatchUp.ALL, max_catch_up=100), cursor, now)
    assert catch_all == Plan(list(range(18000 - 99 * 60, 18001, 60)), 200, 18000)
    small = plan(every(60, catch_up=CatchUp.ALL, max_catch_up=1000), cursor, now)
    assert small == Plan(list(range(60, 18001, 60)), 0, 18000)


def test_an_hour_down_with_cron() -> None:
    cursor, now = t(5, 4, 10), t(5, 4, 11) + 30
    ticks_due = list(range(t(5, 4, 10, 5), t(5, 4, 11) + 1, 300))
    spec = cron("*/5 * * * *", BERLIN)
    assert plan(spec, cursor, now) == Plan([ticks_due[-1]], 11, ticks_due[-1])
    assert plan(spec, t(5, 4), t(5, 4, 10, 1)).skipped == 119  # exact below WALK_LIMIT
    skip = cron("*/5 * * * *", BERLIN, catch_up=CatchUp.SKIP)
    assert plan(skip, cursor, now + ON_TIME_S) == Plan([], 12, ticks_due[-1])
    catch_all = cron("*/5 * * * *", BERLIN, catch_up=CatchUp.ALL, max_catch_up=5)
    assert plan(catch_all, cursor, now) == Plan(ticks_due[-5:], 7, ticks_due[-1])


@pytest.mark.parametrize("policy", list(CatchUp))
def test_a_tick_overdue_by_on_time_s_is_on_time(policy: CatchUp) -> None:
    spec = every(60, catch_up=policy, catch_up_window_s=1)
    assert plan(spec, 0, 60 + ON_TIME_S) == Plan([60], 0, 60)
    late = plan(spec, 0, 60 + ON_TIME_S + 0.001)
    assert late == (Plan([60], 0, 60) if policy == CatchUp.ALL else Plan([], 1, 60))
    assert plan(every(60, catch_up=policy), 0, 60.4) == Plan([60], 0, 60)  # a late wake-up


@pytest.mark.parametrize("policy", list(CatchUp))
def test_nothing_due(policy: CatchUp) -> None:
    for spec in (every(3600, catch_up=policy), cron("0 * * * *", BERLIN, catch_up=policy)):
        assert plan(spec, 3600, 3600) == Plan([], 0, 3600)
        assert plan(spec, 3600, 7199.9) == Plan([], 0, 3600)
        assert plan(spec, 3600, 100.0) == Plan([], 0, 3600)  # the clock went back
        assert plan(spec, 3590, 3600) == Plan([3600], 0, 3600)  # from a creation time


YEAR = 366 * 86400


class CountingCronSim(CronSim):
    steps = 0

    def __next__(self) -> datetime:
        CountingCronSim.steps += 1
        return super().__next__()


def test_a_year_down_every_second() -> None:
    cursor, now = 1_700_000_000, 1_700_000_000 + YEAR
    assert plan(every(1), cursor, now) == Plan([now], YEAR - 1, now)
    catch_all = plan(every(1, catch_up=CatchUp.ALL, max_catch_up=10_000), cursor, now)
    assert catch_all == Plan(list(range(now - 9999, now + 1)), YEAR - 10_000, now)


@pytest.mark.parametrize("expr", ["* * * * *", "*/5 * * * *", "30 2 * * *"])
def test_a_year_down_with_cron(monkeypatch: pytest.MonkeyPatch, expr: str) -> None:
    """The walk back stops WALK_LIMIT ticks past the ones enqueued: skipped is then a
    lower bound, and the cronsim steps are bounded whatever the downtime."""
    monkeypatch.setattr("sqlq.common.cron.CronSim", CountingCronSim)
    cursor = t(1, 1, year=2025)
    now = cursor + YEAR + 30  # no tick is on time
    for spec, enqueued in (
        (cron(expr, BERLIN, catch_up_window_s=2 * 86400), 1),
        (cron(expr, BERLIN, catch_up=CatchUp.SKIP), 0),
        (cron(expr, BERLIN, catch_up=CatchUp.ALL, max_catch_up=300), 300),
    ):
        CountingCronSim.steps = 0
        result = plan(spec, cursor, now)
        walked = max(enqueued, WALK_LIMIT) + 1
        assert CountingCronSim.steps <= walked + 3  # and prev_tick's few
        assert len(result.enqueue) == enqueued
        assert result.skipped == walked - enqueued  # a lower bound: a year has more ticks
        assert result.cursor == prev_tick(spec, now)
        if result.enqueue:  # consecutive ticks, up to the newest
            assert result.enqueue[-1] == result.cursor
            assert all(next_tick(spec, a) == b for a, b in pairwise(result.enqueue))


@settings(max_examples=300, deadline=None)
@given(
    every_s=st.sampled_from([1, 2, 7, 60, 90, 3600]) | st.integers(1, 500),
    cursor=st.integers(-10_000, 10**10), span=st.floats(-10, 3000, allow_nan=False),
    policy=st.sampled_from(list(CatchUp)), window=st.floats(0.1, 4000),
    max_catch_up=st.integers(1, 50),
)  # fmt: skip
def test_plan_of_every_s(
    every_s: int, cursor: int, span: float, policy: CatchUp, window: float, max_catch_up: int
) -> None:
    spec = every(every_s, catch_up=policy, catch_up_window_s=window, max_catch_up=max_catch_up)
    now = cursor + span
    result = plan(spec, cursor, now)
    all_due = [t for t in range(cursor + 1, math.floor(now) + 1) if t % every_s == 0]
    assert result.enqueue == sorted(set(result.enqueue))
    assert all(cursor < t <= now for t in result.enqueue)
    assert set(result.enqueue) <= set(all_due)
    assert len(result.enqueue) + result.skipped == len(all_due)
    assert result.cursor == (all_due[-1] if all_due else cursor)
    if all_due and now - all_due[-1] <= ON_TIME_S:
        assert result.enqueue[-1:] == all_due[-1:]
    if policy == CatchUp.ALL:
        assert result.enqueue == all_due[-max_catch_up:]
    else:
        assert len(result.enqueue) <= 1


@settings(max_examples=60, deadline=None)
@given(
    expr=st.sampled_from(["30 2 * * *", "0 * * * *", "*/15 * * * *", "*/10 1-3 * * *",
                          "0,30 2,3 * * *", "* 2 * * *", "45 1 * * *", "0 */2 * * *"]),
    tz=st.sampled_from([BERLIN, NEW_YORK, "Australia/Lord_Howe", "UTC"]),
    start=st.sampled_from([t(3, 28, 20), t(3, 7, 22), t(10, 24, 20), t(10, 31, 22), t(4, 4, 10),
                           t(10, 3, 10)]),
    offset=st.integers(0, 12 * 3600), span=st.integers(0, 8 * 3600),
)  # fmt: skip
def test_cron_walks_agree(expr: str, tz: str, start: int, offset: int, span: int) -> None:
    """Walking back from now (plan) and forward from the cursor (next_tick) find the same
    ticks, from any second, in zones with DST (Lord Howe shifts by 30 minutes)."""
    cursor = start + offset
    now = cursor + span
    spec = cron(expr, tz)
    found = due(spec, cursor, now)
    assert found == sorted(set(found))
    assert prev_tick(spec, now) == (found[-1] if found else prev_tick(spec, cursor))
    result = plan(spec, cursor, now)
    assert len(result.enqueue) + result.skipped == len(found)
    assert result.cursor == (found[-1] if found else cursor)


def test_describe() -> None:
    assert ticks.describe("30 2 * * *") == "At 02:30"
    assert ticks.describe("*/15 * * * *") == "Every 15 minutes"
    assert ticks.describe("0 18 * * 1-5") == "At 18:00, Monday through Friday"
    assert ticks.describe(90) == "every 90 s"
    assert ticks.describe(300) == "every 5 min"
    assert ticks.describe(3600) == "every hour"
    assert ticks.describe(every(86400 * 2)) == "every 2 d"
    assert ticks.describe(cron("0 0 L * *", BERLIN)) == "At 00:00, on the last day of the month"
    with pytest.raises(ValidationError) as caught:
        ticks.describe("61 * * * *")  # cron-descriptor would say "At 61 minutes past the hour"
    assert caught.value.field == "cron"
