"""The store contract, over every engine: listing, idempotency keys, operator retry, pauses."""

from __future__ import annotations

import asyncio

import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.errors import DuplicateKeyError, IllegalTransitionError
from sqlq.common.models import Job, State
from sqlq.common.store import JobQuery, JobStore
from tests.helpers import NOW, StoreFactory
from tests.store_contract_helpers import FILTERS, Listed, _dead, new_job


async def test_pages_come_in_id_order_with_filters(store: JobStore) -> None:
    jobs = [new_job(i, queue="q1" if i % 2 else "default") for i in range(25)]
    await store.commit(jobs)
    dead = await _dead(store, new_job(99))
    ids = sorted(j.id for j in [*jobs, dead])
    got: list[str] = []
    after: str | None = None
    while True:
        page = await store.list_jobs(JobQuery(after=after, limit=7))
        got += [j.id for j in page]
        if len(page) < 7:
            break
        after = page[-1].id
    assert got == ids  # every job once, in id order, across pages
    assert [j.id for j in await store.list_jobs(JobQuery(state=State.DEAD))] == [dead.id]
    q1 = await store.list_jobs(JobQuery(queue="q1", limit=1000))
    assert sorted(j.id for j in q1) == sorted(j.id for j in jobs if j.queue == "q1")
    assert await store.list_jobs(JobQuery(kind="nope")) == []


async def test_filtered_pages_hold_across_changes_compaction_and_retention(
    factory: StoreFactory, clock: FakeClock
) -> None:
    """Every filter (state, kind, queue, any two, all three, none matching), paged by the
    cursor: with jobs changing between pages, a compaction between them, and the cursor's
    own job pruned past retention (or never there)."""
    s = factory(retention=60.0)
    await s.open()
    try:
        listed = Listed(s)
        now = clock.time()

        def job(i: int) -> Job:
            kind, queue = ("mail" if i % 3 == 0 else "sleep"), ("q2" if i % 2 else "q1")
            return Job.new(kind=kind, args={"n": i}, now=now + i / 1000, queue=queue)

        first = [job(i) for i in range(40)]
        await listed.submit(first)
        await listed.bury(first[:20:4], now)
        await listed.move([j.cancel(now) for j in first[21::5]])
        for query in FILTERS:
            await listed.check_pages(query)
        # Changes and a compaction between one page and the next of the same listing.
        page = await s.list_jobs(JobQuery(state=State.SCHEDULED, limit=4))
        assert page == listed.expect(JobQuery(state=State.SCHEDULED, limit=4))
        ahead = listed.expect(JobQuery(state=State.SCHEDULED, after=page[-1].id, limit=3))
        await listed.move([ahead[0].cancel(now), page[1].cancel(now)])
        await s.compact()
        await listed.check_pages(JobQuery(state=State.SCHEDULED, after=page[-1].id))
        cursor = (await s.list_jobs(JobQuery(state=State.DEAD, limit=2)))[-1].id
        # Past retention: every finished job so far is pruned, the cursor's among them.
        clock.advance(120)
        later = [job(1000 + i) for i in range(12)]
        await listed.submit(later)
        await listed.bury(later[::3], clock.time())
        await s.compact()
        cutoff = clock.time() - 60.0
        listed.jobs = {
            i: j for i, j in listed.jobs.items() if not (j.terminal and j.updated_at < cutoff)
        }
        assert await s.get(cursor) is None
        for query in FILTERS:
            await listed.check_pages(query)
            for after in (cursor, first[7].id[:-1] + "g", later[4].id):  # pruned, never, live
                q = JobQuery(state=query.state, kind=query.kind, queue=query.queue, after=after)
                await listed.check_pages(q)
    finally:
        await s.close()


async def test_an_idempotency_key_belongs_to_one_job(store: JobStore) -> None:
    first = new_job(1, idempotency_key="k-1", request_hash="h")
    await store.commit([first])
    assert await store.find_key("k-1") == first
    assert await store.find_key("k-2") is None
    with pytest.raises(DuplicateKeyError):
        await store.commit([new_job(2, idempotency_key="k-1")])
    a, b = new_job(3, idempotency_key="k-3"), new_job(4, idempotency_key="k-3")
    outcomes = await asyncio.gather(store.commit([a]), store.commit([b]), return_exceptions=True)
    assert sorted(type(o).__name__ for o in outcomes) == ["DuplicateKeyError", "NoneType"]
    with pytest.raises(DuplicateKeyError):  # one batch holding the key twice: all or nothing
        await store.commit([new_job(5, idempotency_key="k-5"), new_job(6, idempotency_key="k-5")])
    assert await store.find_key("k-5") is None


async def test_a_key_is_freed_when_its_job_is_pruned(
    factory: StoreFactory, clock: FakeClock
) -> None:
    s = factory(retention=60.0)
    await s.open()
    try:
        done = await _dead(s, new_job(1, idempotency_key="k"), now=clock.time())
        clock.advance(3600)
        await s.compact()
        assert await s.get(done.id) is None
        assert await s.find_key("k") is None
        await s.commit([new_job(2, idempotency_key="k")])  # the key may be used again
    finally:
        await s.close()


async def test_retry_from_dead_gives_a_fresh_budget_and_keeps_history(store: JobStore) -> None:
    dead = await _dead(store, new_job(1, max_attempts=1))
    revive = dead.revive(NOW + 5)
    await store.commit([revive])
    got = await store.get(dead.id)
    assert got is not None
    assert (got.state, got.attempts, got.attempts_total) == (State.SCHEDULED, 0, 1)
    assert (got.epoch, got.ready_at, got.last_error) == (dead.epoch + 1, NOW + 5, "boom")
    with pytest.raises(IllegalTransitionError):
        await store.commit([got.revive(NOW + 6)])  # only dead or cancelled jobs revive


async def test_keys_pages_and_revivals_survive_reopen(reopen_factory: StoreFactory) -> None:
    s = reopen_factory()
    await s.open()
    keyed = new_job(1, idempotency_key="k", request_hash="h", queue="mail")
    await s.commit([keyed])
    dead = await _dead(s, new_job(2))
    await s.commit([dead.revive(NOW + 5)])
    revived = dead.apply(dead.revive(NOW + 5))
    await s.close()
    again = reopen_factory()
    await again.open()
    try:
        assert await again.find_key("k") == keyed
        assert await again.get(revived.id) == revived
        page = await again.list_jobs(JobQuery(queue="mail"))
        assert page == [keyed]
        with pytest.raises(DuplicateKeyError):
            await again.commit([new_job(3, idempotency_key="k")])
    finally:
        await again.close()


async def test_a_paused_queue_stays_paused_across_reopen(reopen_factory: StoreFactory) -> None:
    s = reopen_factory()
    await s.open()
    await s.set_queue_paused("mail", True)
    await s.set_queue_paused("reports", True)
    await s.set_queue_paused("reports", False)
    await s.set_queue_paused("mail", True)  # idempotent
    await s.close()
    again = reopen_factory()
    recovery = await again.open()
    await again.close()
    assert recovery.paused_queues == ["mail"]
