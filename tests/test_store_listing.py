"""The store contract, over every engine: listing, idempotency keys, operator retry, pauses."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.errors import DuplicateKeyError, IllegalTransitionError
from sqlq.common.models import Job, State
from sqlq.common.schedule import tick_key
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
        later = await _pruned_then_more(s, listed, clock, job)  # the cursor's job too
        assert await s.get(cursor) is None
        for query in FILTERS:
            await listed.check_pages(query)
            for after in (cursor, first[7].id[:-1] + "g", later[4].id):  # pruned, never, live
                q = JobQuery(state=query.state, kind=query.kind, queue=query.queue, after=after)
                await listed.check_pages(q)
    finally:
        await s.close()


async def _pruned_then_more(
    s: JobStore, listed: Listed, clock: FakeClock, job: Callable[[int], Job]
) -> list[Job]:
    """Past retention: every finished job so far pruned, in the store and in the model;
    then twelve more jobs, a third of them dead."""
    clock.advance(120)
    later = [job(1000 + i) for i in range(12)]
    await listed.submit(later)
    await listed.bury(later[::3], clock.time())
    await s.compact()
    cutoff = clock.time() - 60.0
    listed.jobs = {
        i: j for i, j in listed.jobs.items() if not (j.terminal and j.updated_at < cutoff)
    }
    return later


def _newest_first(listed: Listed, query: JobQuery) -> list[Job]:
    """What a newest-first page of ``query`` holds: the matching jobs below its cursor,
    highest id first (``Listed.expect`` is the oldest-first one)."""
    found = [j for _, j in sorted(listed.jobs.items(), reverse=True) if query.matches(j)]
    return [j for j in found if query.beyond(j.id)][: query.limit]


async def _check_newest_first(listed: Listed, query: JobQuery, limit: int = 3) -> None:
    """Page through ``query`` newest first from its cursor: every page is what the jobs
    say, and the pages together are every matching job below the cursor once."""
    after, seen = query.after, []
    while True:
        q = dataclasses.replace(query, after=after, limit=limit, descending=True)
        page = await listed.store.list_jobs(q)
        assert page == _newest_first(listed, q), q
        seen += [j.id for j in page]
        if len(page) < limit:
            break
        after = page[-1].id
    whole = dataclasses.replace(query, limit=10**6, descending=True)
    assert seen == [j.id for j in _newest_first(listed, whole)]


async def test_pages_come_newest_first_with_filters_changes_and_retention(
    factory: StoreFactory, clock: FakeClock
) -> None:
    """``descending``: every filter (and a schedule's jobs) paged newest first by the
    cursor, with changes and a compaction between pages, and a cursor pruned, never there
    or live, as the oldest-first listing is held above."""
    s = factory(retention=60.0)
    await s.open()
    try:
        listed = Listed(s)
        now = clock.time()

        def job(i: int, key: str | None = None) -> Job:
            kind, queue = ("mail" if i % 3 == 0 else "sleep"), ("q2" if i % 2 else "q1")
            return Job.new(
                kind=kind, args={"n": i}, now=now + i / 1000, queue=queue, idempotency_key=key
            )

        first = [job(i, tick_key("nightly", i) if i % 4 == 1 else None) for i in range(40)]
        await listed.submit(first)
        await listed.bury(first[:20:4], now)
        await listed.move([j.cancel(now) for j in first[21::5]])
        newest = await s.list_jobs(JobQuery(limit=2, descending=True))
        assert [j.id for j in newest] == sorted((j.id for j in first), reverse=True)[:2]
        for query in [
            *FILTERS,
            JobQuery(schedule="nightly"),
            JobQuery(schedule="nightly", state=State.SCHEDULED),
        ]:
            await _check_newest_first(listed, query)
        # Changes and a compaction between one page and the next of the same listing.
        q = JobQuery(state=State.SCHEDULED, limit=4, descending=True)
        page = await s.list_jobs(q)
        assert page == _newest_first(listed, q)
        ahead = _newest_first(listed, dataclasses.replace(q, after=page[-1].id, limit=3))
        await listed.move([ahead[0].cancel(now), page[1].cancel(now)])
        await s.compact()
        await _check_newest_first(listed, dataclasses.replace(q, after=page[-1].id))
        cursor = (await s.list_jobs(JobQuery(state=State.DEAD, limit=2, descending=True)))[-1].id
        later = await _pruned_then_more(s, listed, clock, job)
        assert await s.get(cursor) is None
        for query in FILTERS:
            await _check_newest_first(listed, query)
            for after in (cursor, first[7].id[:-1] + "g", later[4].id):  # pruned, never, live
                await _check_newest_first(listed, dataclasses.replace(query, after=after))
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
