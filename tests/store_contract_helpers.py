"""What the store contract tests share: jobs, awkward histories, the reopen check."""

from __future__ import annotations

from hypothesis import strategies as st

from sqlq.common.models import Job, State, Transition
from sqlq.common.store import JobQuery, JobStore
from tests.helpers import NOW


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


# -- listing, idempotency keys, operator retry (the operations API) -----------------------


async def _dead(store: JobStore, job: Job, now: float = NOW) -> Job:
    """``job``, committed, started, and dead-lettered."""
    await store.commit([job])
    running = job.apply(job.start(now))
    await store.commit([job.start(now)])
    bury = running.bury("boom", now + 1)
    await store.commit([bury])
    return running.apply(bury)


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
