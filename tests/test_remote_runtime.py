"""Remote workers' claims in local mode (``sqlq.runtime.remote``, ``remote_local``): which
jobs a claim takes and in what order, who may claim, the long-poll, and that in-process
workers never take a remote queue's job. On the memory engine and the fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial

import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.errors import ForbiddenError, StoreUnavailableError, ValidationError
from sqlq.common.models import State
from sqlq.common.protocol import ClaimRequest, Granted, remote_holder
from sqlq.common.roles import ADMIN
from sqlq.common.specs import JobSpec
from sqlq.runtime import events
from sqlq.runtime import polls as polls_module
from sqlq.runtime.local import LocalClaims
from sqlq.runtime.remote_lanes import RemoteLanes
from tests.helpers import ServiceFactory, final, submit
from tests.remote_helpers import claim, remote_service, stored, worker


async def test_a_claim_takes_the_due_jobs_by_priority_then_due_order(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    low = await submit(rt, "resize", queue="r", args={"w": 1})
    fake_clock.advance(1)
    high = await submit(rt, "resize", queue="r", priority=5)
    fake_clock.advance(1)
    low2 = await submit(rt, "resize", queue="r")
    later = await submit(rt, "resize", queue="r", priority=9, delay_ms=60_000)  # not yet due
    granted = await claim(rt, max=10, lease_s=20)
    assert [g.job.id for g in granted] == [high.id, low.id, low2.id]
    now = fake_clock.time()
    for g in granted:
        assert g.lease_until == now + 20
        assert (g.job.state, g.job.holder, g.job.lease_until) == (
            State.RUNNING, remote_holder("w1"), now + 20,
        )  # fmt: skip
        job = await stored(rt, g.job.id)  # durable before it is answered
        assert (job.state, job.attempts, job.holder) == (State.RUNNING, 1, "worker:w1")
    assert granted[0].job.args == {}
    assert granted[1].job.args == {"w": 1}
    assert (await rt.view.queue("r")).depth == 1
    fake_clock.advance(60)
    [g] = await claim(rt)
    assert g.job.id == later.id


async def test_max_bounds_a_claim_and_the_rest_wait_in_order(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    jobs = [await submit(rt, "k", queue="r") for _ in range(5)]
    first = await claim(rt, max=2)
    second = await claim(rt, max=2)
    third = await claim(rt, max=2)
    assert [g.job.id for g in first + second + third] == [j.id for j in jobs]
    assert await claim(rt, max=2) == []


async def test_a_claim_over_several_queues_merges_them_by_priority_then_due(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    a1 = await submit(rt, "k", queue="r")
    fake_clock.advance(1)
    b1 = await submit(rt, "k", queue="r2")
    fake_clock.advance(1)
    a2 = await submit(rt, "k", queue="r")
    b2 = await submit(rt, "k", queue="r2", priority=1)
    granted = await claim(rt, ("r", "r2"), max=3)
    assert [g.job.id for g in granted] == [b2.id, a1.id, b1.id]
    [g] = await claim(rt, ("r2", "r"), max=3)
    assert g.job.id == a2.id


async def test_a_kinds_filter_takes_only_those_kinds_and_leaves_the_rest_in_order(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    jobs = [await submit(rt, kind, queue="r") for kind in ("a", "b", "a", "c", "b")]
    granted = await claim(rt, kinds=["b", "c"], max=10)
    assert [g.job.id for g in granted] == [jobs[1].id, jobs[3].id, jobs[4].id]
    granted = await claim(rt, max=10)
    assert [g.job.id for g in granted] == [jobs[0].id, jobs[2].id]


async def test_cancelled_jobs_at_the_front_cost_no_claim_its_jobs(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """Stale (cancelled) entries at a queue's front are dropped as a claim meets them, by
    a claim over several queues or with kinds as by a plain one."""
    rt = await remote_service(services, fake_clock)
    jobs, _ = await rt.submit([JobSpec(kind="k", queue="r") for _ in range(50)], batch=True)
    for job in jobs[:24]:  # fewer than half: the lanes keep them as stale entries
        await rt.cancel(job.id)
    assert (await rt.view.queue("r")).depth == 26
    first = await claim(rt, ("r", "r2"), max=5)
    second = await claim(rt, ("r",), kinds=["k"], max=5)
    third = await claim(rt, ("r",), max=5)
    assert [g.job.id for g in first + second + third] == [j.id for j in jobs[24:39]]
    assert (await rt.view.queue("r")).depth == 11
    assert isinstance(rt.claims, LocalClaims)
    assert rt.claims.remote_side.lanes.sizes()["immediate"] == 11


async def test_jobs_of_a_kind_nobody_claims_never_hide_the_kinds_asked_for(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """A remote queue takes any kind: many jobs of a kind nobody runs (a typo, a worker
    that is down) at its front stand in no kinds claim's way (``sqlq worker`` sends its
    kinds), and a claim without kinds still takes them in order."""
    rt = await remote_service(services, fake_clock)
    typos, _ = await rt.submit([JobSpec(kind="typo", queue="r") for _ in range(2000)], batch=True)
    fake_clock.advance(1)
    wanted, _ = await rt.submit([JobSpec(kind="k", queue="r") for _ in range(5)], batch=True)
    granted = await claim(rt, ("r", "r2"), kinds=["k", "other"], max=10)
    assert [g.job.id for g in granted] == [j.id for j in wanted]
    assert (await rt.view.queue("r")).depth == 2000
    granted = await claim(rt, ("r",), max=3)
    assert [g.job.id for g in granted] == [j.id for j in typos[:3]]
    later = asyncio.ensure_future(claim(rt, ("r",), kinds=["k"], max=1, wait_s=10))
    await asyncio.sleep(0)
    job = await submit(rt, "k", queue="r")
    [g] = await later
    assert g.job.id == job.id


async def test_a_paused_queue_is_passed_over_and_its_resume_wakes_a_waiting_claim(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    await rt.pause("r", True)
    job = await submit(rt, "k", queue="r")
    assert await claim(rt) == []
    start = fake_clock.time()
    waiting = asyncio.create_task(claim(rt, wait_s=30))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done()
    await rt.pause("r", False)
    [g] = await waiting
    assert g.job.id == job.id
    assert fake_clock.time() - start < 1  # woken by the resume, not the wait's end


async def test_queues_must_be_remote_and_a_worker_may_name_only_its_own(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    await submit(rt, "k", queue="r")
    with pytest.raises(ValidationError) as bad:
        await claim(rt, ("r", "default"))
    assert bad.value.field == "queues[1]"
    with pytest.raises(ForbiddenError):
        await claim(rt, ("r", "r2"), who=worker("pi", "r"))
    [g] = await claim(rt, ("r",), who=worker("pi", "r"))
    assert g.job.queue == "r"
    assert rt.remote.is_remote("r")
    assert not rt.remote.is_remote("default")


async def test_a_long_poll_is_woken_by_a_submit_into_its_queue(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    start = fake_clock.time()
    waiting = asyncio.create_task(claim(rt, wait_s=30))
    for _ in range(5):
        await asyncio.sleep(0)
    await submit(rt, "k", queue="r2")  # another queue: no wake
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done()
    job = await submit(rt, "k", queue="r")
    [g] = await waiting
    assert g.job.id == job.id
    assert fake_clock.time() - start < 1
    assert rt.remote.waiting() == 0


async def test_a_long_poll_answers_empty_after_wait_s_and_takes_a_delayed_job_when_due(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    start = fake_clock.time()
    assert await claim(rt, wait_s=7.5) == []
    assert fake_clock.time() - start == pytest.approx(7.5)
    job = await submit(rt, "k", queue="r", delay_ms=4_000)
    start = fake_clock.time()
    [g] = await claim(rt, wait_s=30)
    assert g.job.id == job.id
    assert 4.0 <= fake_clock.time() - start < 4.01  # (one timer tick past: float due times)


async def test_many_waiting_claims_past_the_bound_are_refused(
    fake_clock: FakeClock, services: ServiceFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(polls_module, "MAX_WAITING_CLAIMS", 2)
    rt = await remote_service(services, fake_clock)
    waiting = [asyncio.create_task(claim(rt, wait_s=30)) for _ in range(2)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert rt.remote.waiting() == 2
    with pytest.raises(StoreUnavailableError):
        await claim(rt, wait_s=30)
    assert await claim(rt) == []  # no wait: answered at once, as always
    jobs = [await submit(rt, "k", queue="r") for _ in range(2)]
    got = [g.job.id for task in waiting for g in await task]
    assert sorted(got) == sorted(j.id for j in jobs)


async def test_one_workers_long_polls_never_make_anothers_a_503(
    fake_clock: FakeClock, services: ServiceFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#37: one worker token confined to one queue fills the budget; another principal's
    long polls still get in, each taking a slot of the one that holds the most (answered
    empty at once), until the two hold half each; then the newcomer is the one refused."""
    monkeypatch.setattr(polls_module, "MAX_WAITING_CLAIMS", 10)
    rt = await remote_service(services, fake_clock)  # (no time passes: every wait holds)
    flood, other = worker("flood", "r"), worker("other", "r2")
    hogs = [asyncio.create_task(claim(rt, who=flood, worker_name="f", wait_s=30))
            for _ in range(10)]  # fmt: skip
    await _turns(lambda: rt.remote.waiting() == 10)
    with pytest.raises(StoreUnavailableError):  # the flood holds every slot: not one more
        await claim(rt, who=flood, worker_name="f", wait_s=30)
    mine: list[asyncio.Task[list[Granted]]] = []
    for n in range(1, 6):  # flood 10 against 0, 9 against 1, ... 6 against 4: each gets in
        mine.append(asyncio.create_task(claim(rt, ["r2"], who=other, worker_name="o", wait_s=30)))
        await _turns(partial(lambda n: sum(t.done() for t in hogs) == n, n))
        await _turns(lambda: rt.remote.waiting() == 10)
    assert [await t for t in hogs if t.done()] == [[]] * 5  # evicted: answered empty
    assert not any(t.done() for t in mine)
    with pytest.raises(StoreUnavailableError):  # 5 against 5: other holds its share now
        await claim(rt, ["r2"], who=other, worker_name="o", wait_s=30)
    job = await submit(rt, "k", queue="r2")
    done, _ = await asyncio.wait(mine, return_when=asyncio.FIRST_COMPLETED)
    assert [g.job.id for g in done.pop().result()] == [job.id]
    await rt.stop(0)
    for t in [*hogs, *mine]:
        await t


async def _turns(holds: Callable[[], bool]) -> None:
    """Let the loop run until ``holds``, with no time passing (the waits must not end)."""
    for _ in range(1000):
        if holds():
            return
        await asyncio.sleep(0)
    raise AssertionError("never held")


async def test_a_stop_answers_waiting_claims_empty(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    waiting = asyncio.create_task(claim(rt, wait_s=30))
    for _ in range(5):
        await asyncio.sleep(0)
    start = fake_clock.time()
    await rt.stop(0)
    assert await waiting == []
    assert fake_clock.time() - start < 1


async def test_in_process_workers_never_take_a_remote_queues_job(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock, workers=4)
    remote_job = await submit(rt, "sleep", queue="r", args={"work_ms": 1})
    local_job = await submit(rt, "sleep", queue="default", args={"work_ms": 1})
    assert (await final(rt, local_job.id)).state is State.COMPLETED
    assert (await stored(rt, remote_job.id)).state is State.SCHEDULED
    assert isinstance(rt.claims, LocalClaims)
    assert rt.claims.scheduler.depth("r") == 0  # never in the in-process scheduler
    [g] = await claim(rt)
    assert g.job.id == remote_job.id


async def test_a_remote_queue_accepts_any_kind_and_args_and_a_local_one_does_not(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    job = await submit(rt, "made.up/kind", queue="r", args={"any": [1, {"x": None}]})
    assert job.args == {"any": [1, {"x": None}]}
    with pytest.raises(ValidationError) as bad:
        await submit(rt, "made.up/kind", queue="default")
    assert bad.value.field == "kind"
    nested: dict[str, object] = {}
    for _ in range(70):
        nested = {"x": nested}
    with pytest.raises(ValidationError) as deep:  # the shape bounds hold for remote queues too
        await submit(rt, "k", queue="r", args=nested)
    assert deep.value.field == "args"


async def test_workers_0_serves_every_queue_remotely_with_no_worker_here(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock, workers=0, remote_queues=frozenset())
    assert rt.pool.live == []
    assert rt.readiness() == (True, "ready")
    job = await submit(rt, "anything", queue="whatever")
    [g] = await claim(rt, ("whatever",))
    assert g.job.id == job.id
    info = await rt.queues()
    assert info["whatever"].remote
    assert info["whatever"].running == 1


async def test_a_queue_cap_holds_for_remote_claims(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock, queue_caps={"r": 2})
    for _ in range(4):
        await submit(rt, "k", queue="r")
    assert len(await claim(rt, max=10)) == 2
    assert await claim(rt, max=10) == []


async def test_the_listing_marks_remote_queues_and_warns_when_nobody_serves_one(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_service(services, fake_clock)
    await submit(rt, "k", queue="r")
    await submit(rt, "sleep", queue="default", delay_ms=3_600_000)
    queues = await rt.queues()
    assert queues["r"].remote
    assert not queues["default"].remote
    assert queues["r"].warning is not None
    assert "no worker" in queues["r"].warning
    assert queues["r2"].remote
    assert queues["r2"].warning is None
    assert queues["default"].warning is None
    await claim(rt, ("r", "r2"), max=1)
    await submit(rt, "k", queue="r")
    assert (await rt.queues())["r"].warning is None  # a worker claimed from it just now
    fake_clock.advance(61)
    assert (await rt.queues())["r"].warning is not None


def test_lanes_pick_takes_nothing_of_a_queue_without_room() -> None:
    clock = FakeClock()
    lanes = RemoteLanes(clock, lambda _: True)
    assert lanes.pick(["r"], 5, clock.time(), None, lambda _: 0) == []


async def test_a_claim_before_start_or_of_nothing_is_plain(services: ServiceFactory) -> None:
    rt = services(remote_queues=frozenset({"r"}))
    with pytest.raises(StoreUnavailableError):
        await rt.remote.claim(ClaimRequest(queues=["r"], worker="w"), ADMIN)
    await rt.start()
    assert (await rt.remote.claim(ClaimRequest(queues=["r"], worker="w"), ADMIN)).claims == []
    [_job], _ = await rt.submit([JobSpec(kind="k", queue="r")])
    assert (await rt.remote.claim(ClaimRequest(queues=["r"], worker="w"), ADMIN)).claims


async def test_5000_kind_names_on_a_remote_queue_make_a_bounded_number_of_series(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    """A remote queue accepts any kind name: the first ``MAX_OTHER_KINDS`` outside the
    registry keep their label, every later one counts as ``other``."""
    rt = await remote_service(services, fake_clock)
    before = rt.metrics.exposition().count(b"sqlq_jobs_total{")
    specs = [JobSpec(kind=f"k{i:05d}", queue="r") for i in range(5000)]
    for i in range(0, len(specs), 500):
        await rt.submit(specs[i : i + 500], batch=True)
    text = rt.metrics.exposition()
    assert text.count(b"sqlq_jobs_total{") - before == events.MAX_OTHER_KINDS + 1
    assert b'kind="k00000"' in text
    assert b'kind="k04999"' not in text
    other = [line for line in text.splitlines() if b'kind="other"' in line]
    assert len(other) == 1
    assert other[0].endswith(b" 4900.0"), other
    await submit(rt, "sleep", queue="r")  # a kind the server runs keeps its own label
    assert b'kind="sleep"' in rt.metrics.exposition()
