"""``JobIndex`` (the memory engine's and walq's state) and its ``SortedIds``, against
plain models: what a page returns, and that a page does not look at the jobs it skips."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from sortedcontainers import SortedList  # type: ignore[import-untyped]

from sqlq.common.engine import index as index_module
from sqlq.common.engine.index import JobIndex
from sqlq.common.engine.sortedids import SortedIds
from sqlq.common.models import Job, State
from sqlq.common.store import JobQuery
from tests.helpers import NOW

STATES = list(State)
QUEUES = ["default", "mail", "q2"]
KINDS = ["sleep", "cpu"]


@contextmanager
def small_blocks() -> Iterator[None]:
    """SortedList's blocks of a few ids, so that a few hundred operations split and merge
    them and a page walks across many (its default is a thousand)."""
    old = SortedList.DEFAULT_LOAD_FACTOR
    SortedList.DEFAULT_LOAD_FACTOR = 4
    try:
        yield
    finally:
        SortedList.DEFAULT_LOAD_FACTOR = old


ops = st.lists(
    st.tuples(st.sampled_from(["add", "discard", "page"]), st.integers(0, 300)), max_size=400
)


@settings(max_examples=200, deadline=None)
@given(ops=ops, bulk=st.lists(st.integers(0, 300), unique=True, max_size=60))
def test_sorted_ids_is_a_sorted_set(ops: list[tuple[str, int]], bulk: list[int]) -> None:
    with small_blocks():
        ids = SortedIds(sorted(f"{n:04d}" for n in bulk))
        model = {f"{n:04d}" for n in bulk}
        for op, n in ops:
            x = f"{n:04d}"
            if op == "add" and x not in model:
                ids.add(x)
                model.add(x)
            elif op == "discard":
                ids.discard(x)
                model.discard(x)
            elif op == "page":
                assert list(ids.after(x)) == sorted(y for y in model if y > x)
            assert len(ids) == len(model)
            assert bool(ids) == bool(model)
            assert (x in ids) == (x in model)
        assert list(ids) == sorted(model)
        assert list(ids.after(None)) == sorted(model)


def _job(n: int, queue: str, kind: str) -> Job:
    return Job.new(kind=kind, args={}, now=NOW + n / 1000, queue=queue)


def _moved(job: Job, state: State, n: int) -> Job:
    """``job`` in ``state`` (the index does not check transitions on ``publish``)."""
    return Job(**{**job.to_dict(), "state": state, "updated_at": NOW + n})


queries = st.builds(
    JobQuery,
    state=st.none() | st.sampled_from(STATES),
    queue=st.none() | st.sampled_from([*QUEUES, "none-such"]),
    kind=st.none() | st.sampled_from([*KINDS, "none-such"]),
    limit=st.integers(1, 12),
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("new"), st.sampled_from(QUEUES), st.sampled_from(KINDS)),
        st.tuples(st.just("move"), st.integers(0, 10**6), st.sampled_from(STATES)),
        st.tuples(st.just("forget"), st.integers(0, 10**6)),
        st.tuples(st.just("page"), queries, st.integers(0, 10**6)),
        st.tuples(st.just("drop")),
    ),
    max_size=120,
)


def _change(index: JobIndex, step: Any, n: int, ids: list[str]) -> bool:
    """Apply a step that changes the jobs (new, move, forget); False for any other step."""
    if step[0] == "new":
        job = _job(n, step[1], step[2])
        index.publish({job.id: job})
    elif step[0] == "move" and ids:
        job = index.jobs[ids[step[1] % len(ids)]]
        index.publish({job.id: _moved(job, step[2], n)})
    elif step[0] == "forget" and ids:
        index.forget(ids[step[1] % len(ids)])
    else:
        return step[0] in ("move", "forget")  # nothing to change yet
    return True


@settings(max_examples=300, deadline=None)
@given(steps=steps)
def test_a_page_is_the_filtered_jobs_after_the_cursor_in_id_order(steps: list[Any]) -> None:
    """Whatever was built, changed, forgotten or dropped in between, a page is what a scan of
    every job would find: the jobs matching the filter, after the cursor, in id order."""
    with small_blocks():
        index, n = JobIndex(), 0
        for step in steps:
            n += 1
            ids = sorted(index.jobs)
            if _change(index, step, n, ids):
                continue
            if step[0] == "page":
                query: JobQuery = step[1]
                after = ids[step[2] % len(ids)] if ids and step[2] % 3 else None
                q = JobQuery(
                    state=query.state, queue=query.queue, kind=query.kind, after=after,
                    limit=query.limit,
                )  # fmt: skip
                expect = [index.jobs[i] for i in ids if q.matches(index.jobs[i])]
                expect = [j for j in expect if after is None or j.id > after][: q.limit]
                assert index.page(q) == expect
            elif step[0] == "drop":
                index._drop()


class CountingJobs(dict[str, Job]):
    """The index's jobs, counting every lookup of one job."""

    looked = 0

    def __getitem__(self, key: str) -> Job:
        self.looked += 1
        return super().__getitem__(key)

    def get(self, key: str, default: Any = None) -> Any:
        self.looked += 1
        return super().get(key, default)


def test_a_page_looks_only_at_what_it_returns_and_what_changed() -> None:
    """A filter that matches few jobs costs a bisect, not a scan of every retained job
    (walq's listing scanned all of them, on every dashboard refresh: 73 ms at 200k)."""
    index = JobIndex()
    jobs = CountingJobs()
    index.jobs = jobs
    index.publish({j.id: j for j in (_job(n, QUEUES[n % 3], KINDS[n % 2]) for n in range(5000))})
    dead = index.jobs[sorted(index.jobs)[100]]
    index.publish({dead.id: _moved(dead, State.DEAD, 1)})
    for q in (JobQuery(state=State.DEAD), JobQuery(kind="none-such"), JobQuery(queue="mail")):
        index.page(q)  # the first page that filters this way builds its index: one pass
    for n in range(10):  # changes since then: the next page applies them, and only them
        job = _job(10_000 + n, "mail", "sleep")
        index.publish({job.id: job})
    jobs.looked = 0
    assert index.page(JobQuery(state=State.DEAD)) == [index.jobs[dead.id]]
    assert index.page(JobQuery(kind="none-such")) == []
    assert index.page(JobQuery(state=State.CANCELLED, queue="mail", kind="cpu")) == []
    page = index.page(JobQuery(queue="mail", after=sorted(index.jobs)[2500], limit=20))
    assert len(page) == 20
    assert jobs.looked <= 10 + 1 + 20 + 3  # the changes, the dead job, the page, the asserts


def test_notes_of_changes_are_bounded_when_nobody_lists() -> None:
    """Once listed, every change is noted for the next page; a server that is never listed
    again drops the indexes rather than noting every change it ever makes."""
    index = JobIndex()
    index.publish({j.id: j for j in (_job(n, "default", "sleep") for n in range(100))})
    index.page(JobQuery(state=State.SCHEDULED))
    for n in range(3 * index_module.PENDING_SLACK):
        job = _job(1000 + n, "default", "sleep")
        index.publish({job.id: job})
        index.forget(job.id)
    assert len(index._pending) <= index_module.PENDING_SLACK + len(index.jobs) // 2 + 1
    assert len(index.page(JobQuery(state=State.SCHEDULED, limit=1000))) == 100


def _expect(index: JobIndex, query: JobQuery) -> list[Job]:
    found = [index.jobs[i] for i in sorted(index.jobs) if query.matches(index.jobs[i])]
    return [j for j in found if query.after is None or j.id > query.after][: query.limit]


@settings(max_examples=200, deadline=None)
@given(
    first=st.lists(st.tuples(st.sampled_from(QUEUES), st.sampled_from(KINDS)), max_size=40),
    built=st.none() | queries,
    wanted=queries,
    meanwhile=steps,
    later=queries,
)
def test_a_family_built_off_the_loop_takes_in_what_changed_meanwhile(
    first: list[tuple[str, str]],
    built: JobQuery | None,
    wanted: JobQuery,
    meanwhile: list[Any],
    later: JobQuery,
) -> None:
    """``page_async`` builds from a snapshot on another thread; jobs submitted, moved and
    forgotten meanwhile (and pages of families already built) are in the pages after."""
    with small_blocks():
        index = JobIndex()
        index.publish({j.id: j for j in (_job(n, q, k) for n, (q, k) in enumerate(first))})
        if built is not None:
            index.page(built)
        n = 1000

        async def offload(build: Any) -> Any:
            nonlocal n
            result = await asyncio.to_thread(build)  # the snapshot is taken: now change things
            for step in meanwhile:
                n += 1
                if _change(index, step, n, sorted(index.jobs)):
                    continue
                if step[0] == "page" and built is not None:
                    assert index.page(built) == _expect(index, built)
            return result

        async def run() -> None:
            assert await index.page_async(wanted, offload) == _expect(index, wanted)
            for query in (wanted, later, *([built] if built else [])):
                assert await index.page_async(query, asyncio.to_thread) == _expect(index, query)

        asyncio.run(run())
