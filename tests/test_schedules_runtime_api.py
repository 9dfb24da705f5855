"""The runtime's schedule API: put, get, list, delete, trigger, the fields it refuses, and
the code-defined schedules a server upserts at start (and never deletes)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.engine.memory import MemoryStore
from sqlq.common.errors import ValidationError
from sqlq.common.models import State
from sqlq.common.schedule import ScheduleSpec, schedule_of, tick_key
from sqlq.runtime.kinds import Registry, task
from sqlq.runtime.service import Service
from tests.helpers import NOW, ServiceFactory, final
from tests.schedules_helpers import (
    Reopenable,
    cursor_of,
    every,
    jobs_at_least,
    jobs_of,
    start,
)


async def test_trigger_makes_a_job_now_outside_the_ticks(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    store = Reopenable(clock=fake_clock)
    rt = start(services, fake_clock, store)
    await rt.start()
    await rt.schedules.put("t", every(3600, paused=True, args={"work_ms": 5}))
    job = await rt.schedules.trigger("t")
    assert job is not None
    assert job.ready_at == fake_clock.time()
    made = schedule_of(job.idempotency_key)
    assert made == ("t", None)
    assert job.args == {"work_ms": 5}  # stored without the kind's defaults
    done = await final(rt, job.id)
    assert done.state is State.COMPLETED
    assert await cursor_of(store, "t") == int(NOW)  # the ticks are untouched
    assert [j.id for j in await jobs_of(store, "t")] == [job.id]
    assert await rt.schedules.trigger("nope") is None


async def test_put_get_list_delete(fake_clock: FakeClock, services: ServiceFactory) -> None:
    store = Reopenable(clock=fake_clock)
    rt = start(services, fake_clock, store)
    await rt.start()
    await rt.schedules.put("d", every(1))
    await jobs_at_least(store, "d", 2)
    before = await store.get_schedule("d")
    assert before is not None
    _view, created = await rt.schedules.put("d", every(60, catch_up="all"))
    after = await store.get_schedule("d")
    assert after is not None
    assert not created
    assert (after.version, after.last_job) == (before.version + 1, before.last_job)
    assert after.cursor >= before.cursor
    assert after.spec.every_s == 60
    got = await rt.schedules.get("d")
    assert got is not None
    assert got.last_job is not None
    assert got.last_tick is not None
    assert got.last_job.id == after.last_job
    assert got.last_tick == after.cursor
    assert [v.name for v in await rt.schedules.list()] == ["d"]
    assert b'sqlq_schedule_ticks_enqueued_total{schedule="d"}' in rt.metrics.exposition()
    assert b"sqlq_schedule_lateness_seconds_count" in rt.metrics.exposition()
    assert await rt.schedules.delete("d") is True
    assert await rt.schedules.delete("d") is False
    assert await rt.schedules.get("d") is None
    assert await rt.schedules.list() == []
    assert b'schedule="d"' not in rt.metrics.exposition()  # a deleted schedule's series go
    assert len(await jobs_of(store, "d")) >= 2  # its jobs stay


@pytest.mark.parametrize(
    ("name", "spec", "field"),
    [
        ("a:b", every(1), "name"),
        ("ok", ScheduleSpec(kind="nosuch", every_s=1), "kind"),
        ("ok", every(1, args={"work_ms": -1}), "args.work_ms"),
        ("ok", every(1, args={"fail_prob": 0.5}), "args.fail_prob"),
    ],
)
async def test_a_put_names_the_field_it_refuses(
    fake_clock: FakeClock, services: ServiceFactory, name: str, spec: ScheduleSpec, field: str
) -> None:
    rt = services(clock=fake_clock, fault_injection=False)
    await rt.start()
    with pytest.raises(ValidationError) as caught:
        await rt.schedules.put(name, spec)
    assert caught.value.field == field
    assert await rt.store.list_schedules() == []


async def test_code_defined_schedules_are_upserted_and_never_deleted(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    store = Reopenable(clock=fake_clock)
    rt = start(services, fake_clock, store)
    await rt.start()
    await rt.schedules.put("theirs", every(3600))  # another node's code defined this one
    await rt.schedules.put("mine", every(3600, args={"work_ms": 1}))
    await rt.schedules.pause("mine")
    await rt.stop(0)
    mine = store._index.schedules["mine"]

    registry = Registry()

    @task(registry=registry, every_s=7200, args={"work_ms": 2})
    async def nightly(args: Any) -> Any:
        return None

    from sqlq.runtime.kinds import schedule

    schedule("mine", "sleep", registry=registry, every_s=3600, args={"work_ms": 3})
    rt = Service(store, kinds=registry, clock=fake_clock, define_schedules=True)
    await rt.start()
    await rt.stop(0)
    listed = dict(store._index.schedules)
    assert set(listed) == {"mine", "nightly", "theirs"}  # "theirs" stays
    assert listed["nightly"].spec == ScheduleSpec(kind="nightly", every_s=7200,
                                                  args={"work_ms": 2})  # fmt: skip
    new = listed["mine"]
    assert new.spec.args == {"work_ms": 3}
    assert new.spec.paused
    assert (new.version, new.cursor) == (mine.version + 1, mine.cursor)
    rt = Service(store, kinds=registry, clock=fake_clock, define_schedules=True)
    await rt.start()
    await rt.stop(0)
    assert store._index.schedules["mine"] == new  # the same spec: left alone


def test_a_bad_code_defined_schedule_fails_at_definition() -> None:
    registry = Registry()
    from sqlq import schedule

    with pytest.raises(ValueError, match="every_s"):
        schedule("x", "sleep", registry=registry, every_s=0)
    with pytest.raises(ValueError, match="name"):
        schedule("a b", "sleep", registry=registry, every_s=1)
    with pytest.raises(ValueError, match="cron"):
        schedule("y", "sleep", registry=registry)
    schedule("z", "nosuch", registry=registry, every_s=1)
    with pytest.raises(ValueError, match="kind"):  # the kind is checked by the server
        Service(MemoryStore(), kinds=registry, define_schedules=True)
    assert msgspec.json.decode(msgspec.json.encode(registry.schedules["z"]))["every_s"] == 1
    assert tick_key("z", 5) == "sched:z:5"


def test_task_with_cron_defines_a_schedule_of_its_kind() -> None:
    registry = Registry()

    @task(registry=registry, cron="30 2 * * *", tz="Europe/Berlin", args={"full": True})
    def backup(args: Any) -> Any:
        return None

    assert "backup" in registry
    assert registry.schedules == {
        "backup": ScheduleSpec(
            kind="backup", cron="30 2 * * *", tz="Europe/Berlin", args={"full": True}
        )
    }
    with pytest.raises(ValueError, match="tz"):
        task("bad", registry=registry, every_s=60, tz="Mars/Olympus")(lambda args: None)
    assert "bad" not in registry  # a bad schedule registers neither the kind nor itself


async def test_a_schedule_made_again_never_takes_an_old_version(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """Deleted and made again under its name in the same second, a schedule must not
    match an evaluator's old (version, cursor): its first version is not reused."""
    store = Reopenable(clock=fake_clock)
    rt = start(services, fake_clock, store)
    await rt.start()
    await rt.schedules.put("again", every(3600))
    old = await store.get_schedule("again")
    assert await rt.schedules.delete("again")
    fake_clock.advance(0.01)
    await rt.schedules.put("again", every(3600))
    new = await store.get_schedule("again")
    assert old is not None
    assert new is not None
    assert new.cursor == old.cursor  # the same second
    assert new.version != old.version


async def test_a_new_expression_starts_its_ticks_from_now(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """Hourly changed to every second under ``all``: the new ticks between the old cursor
    and now were never due, so none of them is enqueued."""
    store = Reopenable(clock=fake_clock)
    rt = start(services, fake_clock, store)
    await rt.start()
    await rt.schedules.put("edit", every(3600, catch_up="all", max_catch_up=10_000))
    fake_clock.advance(1800)
    await rt.schedules.put("edit", every(1, catch_up="all", max_catch_up=10_000))
    assert await cursor_of(store, "edit") >= int(NOW) + 1800
    await jobs_at_least(store, "edit", 2)
    await rt.stop(0)
    assert all(j.ready_at >= NOW + 1800 for j in await jobs_of(store, "edit"))
