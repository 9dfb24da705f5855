"""A claim that carries outcomes (``ClaimRequest.outcomes``): both written, each answered
whatever the other's fate, and the claim never waits."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from sqlq.common.clock import SYSTEM_CLOCK, FakeClock
from sqlq.common.engine.memory import MemoryStore
from sqlq.common.errors import ForbiddenError, StoreUnavailableError
from sqlq.common.models import State, Transition
from sqlq.common.protocol import UNAVAILABLE, ClaimRequest, CompleteIn, Outcome
from sqlq.common.roles import ADMIN
from sqlq.common.store import Change
from sqlq.runtime import remote as remote_module
from tests.helpers import ServiceFactory, StoreFactory, submit
from tests.remote_helpers import claim, remote_on, stored, worker


def _carrying(granted: Sequence[str], **req: object) -> ClaimRequest:
    outcomes = [Outcome(token=t, complete=CompleteIn(result=i)) for i, t in enumerate(granted)]
    return ClaimRequest(queues=["r"], worker="w1", outcomes=outcomes, **req)  # type: ignore[arg-type]


class Failing(MemoryStore):
    """Fails, as a database gone (or, ``bug``, with a bug's exception), every commit holding
    a claim (``fail_claims``) or a completion (``fail_ends``)."""

    fail_claims = False
    fail_ends = False
    bug = False

    async def commit(self, changes: Sequence[Change]) -> None:
        for c in changes:
            if isinstance(c, Transition) and (
                (self.fail_claims and c.state is State.RUNNING)
                or (self.fail_ends and c.state is State.COMPLETED)
            ):
                if self.bug:
                    raise RuntimeError("a bug (test)")
                raise StoreUnavailableError("the database is gone (test)")
        await super().commit(changes)


async def test_the_outcomes_land_and_more_jobs_are_claimed_in_the_one_call(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_on(services, MemoryStore(clock=fake_clock), fake_clock, 4)
    first = await claim(rt, max=2)
    answer = await rt.remote.claim(_carrying([g.token for g in first], max=5), ADMIN)
    assert [(a.token, a.state) for a in answer.outcomes or []] == [
        (g.token, "completed") for g in first
    ]
    assert [(await stored(rt, g.job.id)).result for g in first] == [0, 1]
    assert len(answer.claims) == 2
    assert {g.job.id for g in answer.claims}.isdisjoint(g.job.id for g in first)
    assert rt.stats()["remote"]["complete"] == 2


async def test_a_claim_that_carries_outcomes_does_not_wait(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_on(services, MemoryStore(clock=fake_clock), fake_clock, 1)
    [g] = await claim(rt)
    at = fake_clock.time()
    answer = await rt.remote.claim(_carrying([g.token], wait_s=30), ADMIN)
    assert answer.claims == []
    assert fake_clock.time() == at  # answered at once: the clock never had to move
    assert [a.state for a in answer.outcomes or []] == ["completed"]


async def test_a_claim_refused_writes_none_of_its_outcomes(
    fake_clock: FakeClock, services: ServiceFactory
) -> None:
    rt = await remote_on(services, MemoryStore(clock=fake_clock), fake_clock, 1)
    [g] = await claim(rt)
    req = _carrying([g.token])
    with pytest.raises(ForbiddenError):
        await rt.remote.claim(req, worker("mailer", "mail"))
    assert (await stored(rt, g.job.id)).state is State.RUNNING


@pytest.mark.parametrize("bug", [False, True])
async def test_a_claim_that_fails_beside_its_outcomes_still_answers_them(
    fake_clock: FakeClock, services: ServiceFactory, bug: bool
) -> None:
    store = Failing(clock=fake_clock)
    store.bug = bug
    rt = await remote_on(services, store, fake_clock, 3)
    first = await claim(rt, max=2)
    store.fail_claims = True
    answer = await rt.remote.claim(_carrying([g.token for g in first], max=1), ADMIN)
    assert answer.claims == []
    assert [a.state for a in answer.outcomes or []] == ["completed", "completed"]
    assert [(await stored(rt, g.job.id)).state for g in first] == [State.COMPLETED] * 2


@pytest.mark.parametrize("bug", [False, True])
async def test_outcomes_that_fail_beside_a_claim_answer_unavailable_each(
    fake_clock: FakeClock, services: ServiceFactory, bug: bool
) -> None:
    """The claim landed, so its jobs are answered (never held unanswered until their lease
    runs out), and each outcome says to report it again."""
    store = Failing(clock=fake_clock)
    store.bug = bug
    rt = await remote_on(services, store, fake_clock, 3)
    first = await claim(rt, max=2)
    store.fail_ends = True
    answer = await rt.remote.claim(_carrying([g.token for g in first], max=1), ADMIN)
    [more] = answer.claims  # the claim landed: its job is this worker's, and said so
    assert (await stored(rt, more.job.id)).state is State.RUNNING
    assert [(a.token, a.error) for a in answer.outcomes or []] == [
        (g.token, UNAVAILABLE) for g in first
    ]
    assert [(await stored(rt, g.job.id)).state for g in first] == [State.RUNNING] * 2


async def test_both_failing_fails_the_call(fake_clock: FakeClock, services: ServiceFactory) -> None:
    store = Failing(clock=fake_clock)
    rt = await remote_on(services, store, fake_clock, 3)
    first = await claim(rt, max=2)
    store.fail_claims = store.fail_ends = True
    with pytest.raises(StoreUnavailableError):
        await rt.remote.claim(_carrying([g.token for g in first], max=1), ADMIN)


async def test_on_a_capped_queue_the_carried_outcomes_free_its_room_first(
    durable_factory: StoreFactory, services: ServiceFactory
) -> None:
    """The claim takes the room the outcomes free: written alongside them, it would find
    the queue's cap still full (a durable engine's commit yields; the memory one's not)."""
    rt = services(durable_factory(clock=SYSTEM_CLOCK), remote_queues=frozenset({"r"}),
                  workers=0, all_remote=False, queue_caps={"r": 2})  # fmt: skip
    await rt.start()
    for _ in range(4):
        await submit(rt, "k", queue="r")
    first = await claim(rt, max=2)
    assert await claim(rt, max=2) == []  # the cap: two running at once
    answer = await rt.remote.claim(_carrying([g.token for g in first], max=2), ADMIN)
    assert [a.state for a in answer.outcomes or []] == ["completed", "completed"]
    assert len(answer.claims) == 2


async def test_a_claim_whose_answer_cannot_be_built_gives_its_jobs_back(
    fake_clock: FakeClock, services: ServiceFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug after the take (here, in building a job's view) fails the claim, and the
    jobs it took are scheduled again at once, their attempt not counted, not held by
    nobody until the lease ran out."""
    rt = await remote_on(services, MemoryStore(clock=fake_clock), fake_clock, 2)

    def broken(job: object, **_: object) -> object:
        raise RuntimeError("a bug (test)")

    monkeypatch.setattr(remote_module, "job_view", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        await claim(rt, max=2)
    monkeypatch.undo()
    assert rt.remote.counts["release"] == 2  # counted as a worker's /claims/release is
    again = await claim(rt, max=2)
    assert len(again) == 2  # due again now, not after a lease
    assert all(g.job.attempts == 1 for g in again)  # the lost claim's attempt given back
    assert rt.remote.seen.view().workers[0].held == 2  # counted once, not for the lost claim
