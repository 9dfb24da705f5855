"""The JobStore contract, run over every engine. Speaks only the protocol."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sqlq.common.clock import FakeClock
from sqlq.common.errors import (
    DuplicateJobError,
    DuplicateKeyError,
    IllegalTransitionError,
    JobNotFoundError,
    StaleEpochError,
    StoreClosedError,
    StoreLockedError,
    UnencodableError,
)
from sqlq.common.models import Job, State, Transition
from sqlq.common.store import JobQuery, JobStore
from tests.helpers import NOW, StoreFactory


def new_job(n: int = 0, **kw: object) -> Job:
    return Job.new(kind="sleep", args={"n": n, "work_ms": 5}, now=NOW, **kw)  # type: ignore[arg-type]


async def assert_reopened_holds(again: JobStore, expect: dict[str, Job]) -> None:
    """Open ``again`` on the same files and find every job exactly as expected."""
    await again.open()
    try:
        for job_id, job in expect.items():
            assert await again.get(job_id) == job
    finally:
        await again.close()


async def test_round_trip(store: JobStore) -> None:
    job = new_job(1, priority=3, max_attempts=2)
    await store.commit([job])
    assert await store.get(job.id) == job


async def test_unknown_id_is_none(store: JobStore) -> None:
    assert await store.get("nope") is None


async def test_empty_commit_is_a_noop_on_an_open_store_only(factory: StoreFactory) -> None:
    s = factory()
    await s.open()
    job = new_job()
    await s.commit([job])
    await s.commit([])  # nothing happens: the job is as it was, the store still takes work
    assert await s.get(job.id) == job
    await s.close()
    with pytest.raises(StoreClosedError):
        await s.commit([])  # closed comes before empty, on every engine


async def test_duplicate_submission_refused(store: JobStore) -> None:
    job = new_job()
    await store.commit([job])
    with pytest.raises(DuplicateJobError):
        await store.commit([job])


async def test_batch_is_all_or_nothing(store: JobStore) -> None:
    good = new_job(1)
    ghost = new_job(2).start(NOW)  # a transition for a job that does not exist
    with pytest.raises(JobNotFoundError):
        await store.commit([good, ghost])
    assert await store.get(good.id) is None


async def test_large_batch_is_all_or_nothing(store: JobStore) -> None:
    """Big enough that SQLite needs several statements; the last row is the bad one."""
    jobs = [new_job(i) for i in range(2500)]
    await store.commit(jobs[:1])
    with pytest.raises(DuplicateJobError):
        await store.commit(jobs[1:] + jobs[:1])
    assert [await store.get(j.id) for j in jobs[1:4]] == [None, None, None]
    assert await store.get(jobs[-1].id) is None
    await store.commit(jobs[1:])
    starts = [j.start(NOW + 1) for j in jobs]
    await store.commit(starts)
    got = await asyncio.gather(*(store.get(j.id) for j in jobs))  # reads overlap: no 2,500 trips
    assert [j.state if j else None for j in got] == [State.RUNNING] * len(jobs)


async def test_transitions_fold(store: JobStore) -> None:
    job = new_job()
    await store.commit([job])
    start = job.start(NOW + 1)
    await store.commit([start])
    running = await store.get(job.id)
    assert running is not None
    assert (running.state, running.attempts, running.epoch) == (State.RUNNING, 1, 0)
    assert running.started_at == NOW + 1
    await store.commit([running.complete({"ok": True}, NOW + 2)])
    done = await store.get(job.id)
    assert done is not None
    assert (done.state, done.result, done.updated_at) == (State.COMPLETED, {"ok": True}, NOW + 2)
    assert done.started_at == NOW + 1  # completion keeps when the attempt started


async def test_epoch_fences_a_stale_worker(store: JobStore) -> None:
    job = new_job()
    await store.commit([job])
    await store.commit([job.start(NOW)])
    running = await store.get(job.id)
    assert running is not None
    # The health loop requeues it (new epoch), and a worker picks it up again.
    await store.commit([running.retry("worker hung", NOW + 1, NOW + 1)])
    requeued = await store.get(job.id)
    assert requeued is not None
    assert requeued.epoch == 1
    await store.commit([requeued.start(NOW + 2)])
    # The first worker wakes up and tries to complete with the epoch it had.
    with pytest.raises(StaleEpochError):
        await store.commit([running.complete("late", NOW + 3)])
    current = await store.get(job.id)
    assert current is not None
    assert (current.state, current.epoch, current.result) == (State.RUNNING, 1, None)


async def test_illegal_transition_refused(store: JobStore) -> None:
    job = new_job()
    await store.commit([job])
    with pytest.raises(IllegalTransitionError):
        await store.commit([job.complete("skipped running", NOW)])
    assert await store.get(job.id) == job


async def test_terminal_states_are_final(store: JobStore) -> None:
    job = new_job()
    await store.commit([job])
    await store.commit([job.cancel(NOW)])
    cancelled = await store.get(job.id)
    assert cancelled is not None
    assert cancelled.state is State.CANCELLED
    with pytest.raises(IllegalTransitionError):
        await store.commit([cancelled.start(NOW)])


async def test_one_bad_caller_does_not_sink_its_batch(store: JobStore) -> None:
    jobs = [new_job(i) for i in range(50)]
    await store.commit(jobs)
    stale = Transition(
        job_id=jobs[7].id,
        expect_epoch=41,
        state=State.RUNNING,
        epoch=41,
        attempts=1,
        ready_at=NOW,
        updated_at=NOW,
        last_error=None,
        result=None,
    )
    calls = [store.commit([j.start(NOW)]) for j in jobs if j is not jobs[7]]
    calls.insert(7, store.commit([stale]))
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(outcomes[7], StaleEpochError)
    assert all(o is None for i, o in enumerate(outcomes) if i != 7)
    for i, job in enumerate(jobs):
        got = await store.get(job.id)
        assert got is not None
        assert got.state is (State.SCHEDULED if i == 7 else State.RUNNING)


@pytest.mark.parametrize("bad", [object(), "lone \udcff surrogate", {"k": {1: object()}}])
async def test_an_unencodable_value_fails_only_its_caller(store: JobStore, bad: object) -> None:
    """A handler's bad result must not fail the store: only that commit is refused."""
    jobs = [new_job(i) for i in range(20)]
    await store.commit(jobs)
    running = [j.apply(j.start(NOW)) for j in jobs]
    await store.commit([j.start(NOW) for j in jobs])
    results: list[object] = [{"i": i} for i in range(len(running))]
    results[5] = bad
    calls = [store.commit([r.complete(x, NOW + 1)]) for r, x in zip(running, results, strict=True)]
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(outcomes[5], UnencodableError), outcomes[5]
    assert all(o is None for i, o in enumerate(outcomes) if i != 5), outcomes
    assert (await store.get(jobs[5].id)) == running[5]  # unchanged, still running
    later = new_job(99)
    await store.commit([later])  # the store is healthy
    assert await store.get(later.id) == later
    assert store.stats().failed is None


async def test_an_unencodable_value_leaves_a_durable_store_reopenable(
    reopen_factory: StoreFactory,
) -> None:
    s = reopen_factory()
    await s.open()
    job = new_job()
    await s.commit([job])
    await s.commit([job.start(NOW)])
    running = job.apply(job.start(NOW))
    with pytest.raises(UnencodableError):
        await s.commit([running.complete(object(), NOW + 1)])
    await s.commit([running.complete({"ok": 1}, NOW + 2)])
    await s.close()
    await assert_reopened_holds(
        reopen_factory(), {job.id: running.apply(running.complete({"ok": 1}, NOW + 2))}
    )


async def test_concurrent_commits_share_batches(store: JobStore) -> None:
    jobs = [new_job(i) for i in range(300)]
    await asyncio.gather(*(store.commit([j]) for j in jobs))
    for job in jobs:
        assert await store.get(job.id) == job
    stats = store.stats()
    if store.durable:
        assert stats.batches < len(jobs), stats  # group commit merged callers


async def test_closed_store_refuses(factory: StoreFactory) -> None:
    s = factory()
    await s.open()
    await s.close()
    with pytest.raises(StoreClosedError):
        await s.commit([new_job()])
    await s.close()  # idempotent


async def _mixed_history(store: JobStore) -> dict[str, Job]:
    """Jobs in every state, returned as the store should now hold them."""
    jobs = [new_job(i) for i in range(12)]
    await store.commit(jobs)
    expect = {j.id: j for j in jobs}
    for j in jobs[:9]:
        t = j.start(NOW + 1)
        await store.commit([t])
        expect[j.id] = j.apply(t)
    for j in jobs[:3]:
        t = expect[j.id].complete({"n": j.args["n"]}, NOW + 2)
        await store.commit([t])
        expect[j.id] = expect[j.id].apply(t)
    for j in jobs[3:5]:
        t = expect[j.id].bury("boom", NOW + 2)
        await store.commit([t])
        expect[j.id] = expect[j.id].apply(t)
    for j in jobs[5:7]:
        t = expect[j.id].retry("flaky", NOW + 5, NOW + 2)
        await store.commit([t])
        expect[j.id] = expect[j.id].apply(t)
    t = jobs[11].cancel(NOW + 2)
    await store.commit([t])
    expect[jobs[11].id] = jobs[11].apply(t)
    return expect


async def test_second_opener_is_refused_until_the_first_closes(
    durable_factory: StoreFactory,
) -> None:
    factory = durable_factory
    first = factory()
    await first.open()
    try:
        with pytest.raises(StoreLockedError):
            await factory().open()
    finally:
        await first.close()
    second = factory()  # the lock goes with the close
    await second.open()
    await second.close()


async def test_close_and_reopen_keeps_everything(durable_factory: StoreFactory) -> None:
    factory = durable_factory
    s = factory()
    await s.open()
    expect = await _mixed_history(s)
    await s.close()
    again = factory()
    recovery = await again.open()
    try:
        for job_id, job in expect.items():
            assert await again.get(job_id) == job
        live = {j.id: j for j in recovery.jobs}
        assert live == {i: j for i, j in expect.items() if not j.terminal}
        # jobs 7, 8 were left running: their worker died with the process
        assert sorted(recovery.running) == sorted(
            i for i, j in expect.items() if j.state is State.RUNNING
        )
        assert len(recovery.running) == 2
    finally:
        await again.close()


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
TIMES = st.floats(allow_nan=False, allow_infinity=False)


@st.composite
def awkward_history(draw: st.DrawFn) -> list[tuple[Job, Transition, Transition]]:
    """Jobs whose every field is awkward, each started and then finished or retried."""
    out = []
    for _ in range(draw(st.integers(1, 8))):
        job = Job.new(
            # A kind is a registered name; NUL is the one character a PostgreSQL text
            # column refuses (that engine answers UnencodableError, tested below).
            kind=draw(
                st.text(
                    st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), min_size=1
                )
            ),
            args=draw(st.dictionaries(st.text(), JSON_VALUES, max_size=4)),
            now=draw(st.floats(-1e12, 1e12)),  # the id holds its milliseconds
            ready_at=draw(TIMES),
            priority=draw(st.integers(-(2**31), 2**31)),
            max_attempts=draw(st.integers(1, 1000)),
        )
        start = job.start(draw(TIMES))
        running = job.apply(start)
        if draw(st.booleans()):
            end = running.complete(draw(JSON_VALUES), draw(TIMES))
        else:
            end = running.retry(draw(st.text()), draw(TIMES), draw(TIMES))
        out.append((job, start, end))
    return out


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(history=awkward_history())
def test_awkward_values_come_back_exactly(
    factory: StoreFactory, history: list[tuple[Job, Transition, Transition]]
) -> None:
    """Every float bit, every character and every JSON value survives commit and reopen.

    Each step is one batch, so SQLite's multi-row statements are exercised with
    NUL characters, float extremes and big integers in every column.
    """
    expect = {job.id: job.apply(start).apply(end) for job, start, end in history}

    async def go() -> None:
        s = factory(retention=math.inf)  # any timestamp, however old, is kept
        await s.open()
        try:
            await s.commit([job for job, _, _ in history])  # each step one batch
            await s.commit([start for _, start, _ in history])
            await s.commit([end for _, _, end in history])
            for job_id, job in expect.items():
                assert await s.get(job_id) == job
        finally:
            await s.close()
        if s.durable:
            await assert_reopened_holds(factory(retention=math.inf), expect)

    asyncio.run(go())


async def test_compaction_keeps_state_and_survives_reopen(factory: StoreFactory) -> None:
    s = factory()
    await s.open()
    expect = await _mixed_history(s)
    report = await s.compact()
    assert report.jobs_pruned == 0
    for job_id, job in expect.items():
        assert await s.get(job_id) == job
    extra = new_job(99)
    await s.commit([extra])  # appends go on after a compaction
    expect[extra.id] = extra
    await s.close()
    if s.durable:
        await assert_reopened_holds(factory(), expect)


async def test_retention_prunes_only_old_terminal_jobs(
    factory: StoreFactory, clock: FakeClock
) -> None:
    s = factory(retention=60.0)
    await s.open()
    clock.now = NOW
    expect = await _mixed_history(s)
    clock.advance(61.0 + 2)  # terminal jobs were updated at NOW + 2
    report = await s.compact()
    terminal = {i for i, j in expect.items() if j.terminal}
    assert report.jobs_pruned == len(terminal) == 6
    for job_id, job in expect.items():
        assert await s.get(job_id) == (None if job_id in terminal else job)
    await s.close()
    if not s.durable:
        return
    again = factory(retention=60.0)
    await again.open()
    try:
        for job_id, job in expect.items():
            assert await again.get(job_id) == (None if job_id in terminal else job)
    finally:
        await again.close()


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["full", "os"])
def test_kill9_loses_no_acknowledged_transition(
    durable_engine: str, tmp_path: Path, sync: str
) -> None:
    """A real child appends under concurrency; SIGKILL it; every acked change is there."""
    engine = durable_engine
    child = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("_appender.py")),
            "--store",
            engine,
            "--data",
            str(tmp_path),
            "--sync",
            sync,
            "--compact-floor",
            str(32 << 10),  # so walq also compacts, again and again, while it is killed
            "--compact-ratio",
            "1.5",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )
    assert child.stdout is not None
    submitted: set[str] = set()
    started: set[str] = set()
    completed: set[str] = set()
    sets = {"S": submitted, "R": started, "C": completed}
    try:
        assert child.stdout.readline().strip() == "READY"
        while len(started) < 1500:
            line = child.stdout.readline()
            assert line, "appender died on its own"
            tag, job_id = line.split()
            sets[tag].add(job_id)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        for line in child.stdout:  # lines printed before the kill were acknowledged too
            if line.endswith("\n"):
                tag, job_id = line.split()
                sets[tag].add(job_id)
        assert child.stderr is not None
        compactions = [ln for ln in child.stderr.read().splitlines() if "compactions=" in ln]
        if engine == "walq":
            assert compactions, "the child never reported its compaction count"
            assert int(compactions[-1].split("=")[1]) > 0, "walq never compacted"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        if child.stderr is not None:
            child.stderr.close()

    async def check() -> None:
        from sqlq.engines.registry import make_store

        store = make_store(engine, tmp_path, sync=sync)  # type: ignore[arg-type]
        recovery = await store.open()
        try:
            still_running = set()
            for job_id in submitted:
                job = await store.get(job_id)
                assert job is not None, f"acknowledged submission {job_id} lost"
                if job_id in completed:
                    assert job.state is State.COMPLETED, job
                elif job_id in started:
                    assert job.state in (State.RUNNING, State.COMPLETED), job
                if job.state is State.RUNNING:
                    still_running.add(job_id)
            assert set(recovery.running) >= still_running
        finally:
            await store.close()

    asyncio.run(check())


# -- listing, idempotency keys, operator retry (the operations API) -----------------------


async def _dead(store: JobStore, job: Job, now: float = NOW) -> Job:
    """``job``, committed, started, and dead-lettered."""
    await store.commit([job])
    running = job.apply(job.start(now))
    await store.commit([job.start(now)])
    bury = running.bury("boom", now + 1)
    await store.commit([bury])
    return running.apply(bury)


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


FILTERS = [
    JobQuery(state=State.DEAD),
    JobQuery(state=State.SCHEDULED),
    JobQuery(kind="mail"),
    JobQuery(queue="q2"),
    JobQuery(state=State.SCHEDULED, queue="q1"),
    JobQuery(state=State.CANCELLED, kind="mail"),
    JobQuery(queue="q1", kind="sleep"),
    JobQuery(state=State.DEAD, queue="q2", kind="mail"),
    JobQuery(kind="none-such"),
    JobQuery(state=State.RUNNING, queue="none-such"),
    JobQuery(),
]


class Listed:
    """What the store should list: the jobs committed through it, as they are now."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        self.jobs: dict[str, Job] = {}

    async def submit(self, jobs: list[Job]) -> None:
        await self.store.commit(jobs)
        self.jobs.update((j.id, j) for j in jobs)

    async def move(self, changes: list[Transition]) -> None:
        await self.store.commit(changes)
        for t in changes:
            self.jobs[t.job_id] = self.jobs[t.job_id].apply(t)

    async def bury(self, jobs: list[Job], now: float) -> None:
        await self.move([j.start(now) for j in jobs])
        await self.move([self.jobs[j.id].bury("boom", now) for j in jobs])

    def expect(self, query: JobQuery) -> list[Job]:
        found = [j for i, j in sorted(self.jobs.items()) if query.matches(j)]
        return [j for j in found if query.after is None or j.id > query.after][: query.limit]

    async def check_pages(self, query: JobQuery, limit: int = 3) -> None:
        """Page through ``query`` from its cursor: each page is what the jobs say."""
        after = query.after
        while True:
            q = JobQuery(
                state=query.state, kind=query.kind, queue=query.queue, after=after, limit=limit
            )
            page = await self.store.list_jobs(q)
            assert page == self.expect(q), q
            if len(page) < limit:
                return
            after = page[-1].id


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
