"""The schedule crash verifier can fail: each kind of broken promise is named (pure, on
synthetic facts), and the offline readers fold real files the engines wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

from sqlq.bench.crashsched import judge_ticks
from sqlq.bench.offline_schedules import Durable, read_schedules, tick_of
from sqlq.common.models import Job
from sqlq.common.schedule import (
    AdvanceSchedule,
    PutSchedule,
    Schedule,
    ScheduleSpec,
    tick_key,
)
from sqlq.engines.registry import DURABLE, make_store

T0 = 1_700_000_000


def durable(cursor: int, catch_up: str = "all") -> Durable:
    return Durable(created_at=T0 + 0.4, cursor=cursor, catch_up=catch_up)


def test_a_whole_history_passes() -> None:
    problems, counts = judge_ticks(
        {"a"}, {"a": durable(T0 + 3)}, {"a": [T0 + 1, T0 + 2, T0 + 3, None]}, (0, 0)
    )
    assert problems == []
    assert counts["missing"] == counts["doubled"] == counts["ahead"] == 0


@pytest.mark.parametrize(
    ("ticks", "named"),
    [
        ([T0 + 1, T0 + 2, T0 + 2, T0 + 3], "two jobs"),
        ([T0 + 1, T0 + 3], "without a job"),
        ([T0 + 1, T0 + 2, T0 + 3, T0 + 4], "never reached"),
    ],
)
def test_each_broken_promise_is_named(ticks: list[int | None], named: str) -> None:
    problems, _ = judge_ticks({"a"}, {"a": durable(T0 + 3)}, {"a": ticks}, (0, 0))
    assert any(named in p for p in problems), problems


def test_latest_may_pass_over_only_the_downtime() -> None:
    facts = {"a": durable(T0 + 10, "latest")}
    during = [t for t in range(T0 + 1, T0 + 11) if not T0 + 4 <= t <= T0 + 6]
    assert judge_ticks({"a"}, facts, {"a": list(during)}, (T0 + 4.5, T0 + 5.5))[0] == []
    outside = [t for t in during if t != T0 + 9]
    problems, _ = judge_ticks({"a"}, facts, {"a": list(outside)}, (T0 + 4.5, T0 + 5.5))
    assert any("while a server ran" in p for p in problems)


def test_a_server_that_stops_ticking_after_the_restart_fails() -> None:
    facts = {"a": durable(T0 + 3)}
    problems, counts = judge_ticks({"a"}, facts, {"a": [T0 + 1, T0 + 2, T0 + 3]}, (0, 0), T0 + 2)
    assert counts["stalled"] == 1
    assert any("no progress" in p for p in problems)


def test_a_schedule_the_client_saw_created_must_be_there() -> None:
    problems, counts = judge_ticks({"a", "b"}, {"a": durable(T0)}, {}, (0, 0))
    assert counts["gone"] == 1
    assert any("b was created" in p for p in problems)


def test_keys_are_read_as_the_engines_write_them() -> None:
    assert tick_of(tick_key("a.b-c", 60)) == ("a.b-c", 60)
    assert tick_of("sched:a:trigger-0123") == ("a", None)
    assert tick_of("user-key") is None
    assert tick_of(None) is None


@pytest.mark.parametrize("engine", DURABLE)
async def test_the_offline_reader_folds_an_engines_own_files(engine: str, tmp_path: Path) -> None:
    """A schedule, two ticks and a triggered job, written by the engine, read back by the
    reader without the engine's code."""
    store = make_store(engine, tmp_path)
    await store.open()
    s = Schedule(
        name="a",
        spec=ScheduleSpec(kind="noop", every_s=1, catch_up="latest"),  # type: ignore[arg-type]
        version=1,
        cursor=T0,
        created_at=T0 + 0.4,
        updated_at=T0 + 0.4,
    )
    await store.commit([PutSchedule(schedule=s, expect_version=0)])
    for tick in (T0 + 1, T0 + 2):
        job = Job.new(kind="noop", args={}, now=tick, idempotency_key=tick_key("a", tick))
        advance = AdvanceSchedule(
            name="a", expect_version=1, expect_cursor=tick - 1, cursor=tick, job=job.id
        )
        await store.commit([advance, job])
    await store.commit([Job.new(kind="noop", args={}, now=T0, idempotency_key="sched:a:trigger-x")])
    await store.close()
    schedules, ticks = read_schedules(engine, tmp_path)
    assert schedules == {"a": Durable(created_at=T0 + 0.4, cursor=T0 + 2, catch_up="latest")}
    assert sorted(ticks["a"], key=str) == sorted([T0 + 1, T0 + 2, None], key=str)


@pytest.mark.slow
@pytest.mark.parametrize("engine", DURABLE)
def test_a_few_schedule_kill9_trials_lose_and_double_no_tick(engine: str, tmp_path: Path) -> None:
    """Real servers, real files: schedules ticking each second through kill -9 and restart
    (``sqlq crashcheck --workload schedules`` runs 50 of these per engine)."""
    from sqlq.bench.crashcheck import run_trials

    rows = run_trials(
        store=engine, sync="full", trials=2, jobs=0, seed=3, out=tmp_path, progress=False,
        workload="schedules",
    )  # fmt: skip
    assert [r["problems"] for r in rows] == [[], []]
    assert all(r["ticks"] > 0 for r in rows)
