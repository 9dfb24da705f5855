"""What the PostgreSQL writer tells a batch's callers when the database will not take it:
each caller hears ``StoreUnavailableError`` (the runtime writes an outcome again on that,
``write_fenced``) rather than a "failed batch" it gives up on, and nothing waits on the
database past the call deadline.

Found by the crash trials: a writer that could not connect again while PostgreSQL came back,
and a batch PostgreSQL chose as a deadlock's victim, each dropped the outcomes in it, and
those jobs ran again once their leases ran out."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from sqlq.bench.client.server import free_port
from sqlq.common.clock import SYSTEM_CLOCK
from sqlq.common.errors import IllegalTransitionError, StoreUnavailableError
from sqlq.common.models import Job, State
from sqlq.common.store import Fence
from sqlq.engines.postgres.store import PostgresStore
from sqlq.runtime.leases import write_fenced
from tests.helpers import NOW, wait_for


async def test_a_writer_that_cannot_connect_again_is_unavailable_to_each_caller(
    pg_db: str,
) -> None:
    store = PostgresStore(pg_db, node="n1")
    await store.open()
    try:
        (await store._db.writer()).terminate()  # lost: the next batch connects again
        store._db.dsn = f"postgresql://sqlq@127.0.0.1:{free_port()}/gone"  # and cannot
        jobs = [Job.new(kind="k", args=None, now=NOW) for _ in range(3)]
        outcomes = await asyncio.gather(*(store.commit([j]) for j in jobs), return_exceptions=True)
        assert [type(o) for o in outcomes] == [StoreUnavailableError] * 3
        assert "the batch failed" not in str(outcomes[0])
        store._db.dsn = pg_db
        await store.commit(jobs)
        assert [await store.get(j.id) for j in jobs] == jobs
    finally:
        await store.close()


async def test_an_outcome_is_written_again_until_the_writer_connects_again(pg_db: str) -> None:
    """The runtime's outcome path over the real engine: the outcome a node could not write
    while PostgreSQL came back lands once it is back, within the lease."""
    store = PostgresStore(pg_db, node="n1")
    await store.open()
    try:
        await store.commit([job := Job.new(kind="k", args=None, now=NOW)])
        now = SYSTEM_CLOCK.time()
        [running] = await store.claim(1, now, now + 60.0, {})
        done = running.complete(None, now)
        (await store._db.writer()).terminate()
        store._db.dsn = f"postgresql://sqlq@127.0.0.1:{free_port()}/gone"
        before = store._db.unavailable
        fence = Fence(holder="n1", lease_from=now)
        write = asyncio.create_task(
            write_fenced(store, SYSTEM_CLOCK, done, fence, give_up=lambda: False)
        )
        await wait_for(lambda: store._db.unavailable > before, within=10)
        assert not write.done()  # written again, not dropped
        store._db.dsn = pg_db
        await asyncio.wait_for(write, 10)
        found = await store.get(job.id)
        assert found is not None
        assert found.state is State.COMPLETED
    finally:
        await store.close()


class Victim:
    """The writer's connection, whose next batch PostgreSQL picks as a deadlock's victim
    (as it did when a node's lease renewal locked the same rows in another order)."""

    def __init__(self, real: asyncpg.Connection) -> None:
        self.real = real
        self.deadlocks = 1

    async def fetchrow(self, *args: Any) -> Any:
        if self.deadlocks:
            self.deadlocks -= 1
            raise asyncpg.exceptions.DeadlockDetectedError("deadlock detected")
        return await self.real.fetchrow(*args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


async def test_a_batch_chosen_as_a_deadlocks_victim_is_written_caller_by_caller(
    pg_db: str,
) -> None:
    store = PostgresStore(pg_db, node="n1")
    await store.open()
    try:
        store._db._writer = Victim(await store._db.writer())
        jobs = [Job.new(kind="k", args=None, now=NOW) for _ in range(3)]
        await store.commit(jobs)
        assert [await store.get(j.id) for j in jobs] == jobs
        assert store.slow_batches == 1
        # Deadlocked again in a caller's own transaction: that caller may write again.
        store._db._writer = victim = Victim(store._db._writer.real)
        victim.deadlocks = 2
        job = Job.new(kind="k", args=None, now=NOW)
        with pytest.raises(StoreUnavailableError, match="rolled the write back"):
            await store.commit([job])
        await store.commit([job])
        assert await store.get(job.id) == job
    finally:
        await store.close()


async def test_naming_a_refusal_waits_for_a_connection_no_longer_than_the_deadline(
    pg_db: str,
) -> None:
    """A refused change is named by reading its row on a pooled connection; with every
    pooled connection taken, the writer (and every caller behind it) waits the deadline,
    not for ever."""
    store = PostgresStore(pg_db, node="n1", pool_size=1, deadline_s=0.3)
    await store.open()
    try:
        await store.commit([job := Job.new(kind="k", args=None, now=NOW)])
        start = job.start(NOW)
        await store.commit([start, job.apply(start).complete(None, NOW)])
        async with store._db.pool.acquire():  # the pool's one connection, held
            with pytest.raises(StoreUnavailableError):
                await asyncio.wait_for(store.commit([start]), 10)
        with pytest.raises(IllegalTransitionError):  # named once a connection is free
            await store.commit([start])
    finally:
        await store.close()


async def test_a_renewal_chosen_as_a_deadlocks_victim_may_be_sent_again(pg_db: str) -> None:
    """The other side of the deadlock: a renewal (any pooled statement) rolled back is
    ``StoreUnavailableError``, which the renewal loop logs and tries again, not a bug."""
    store = PostgresStore(pg_db, node="n1")
    await store.open()
    try:

        async def deadlocked(_: asyncpg.Connection) -> None:
            raise asyncpg.exceptions.DeadlockDetectedError("deadlock detected")

        with pytest.raises(StoreUnavailableError, match="rolled the statement back"):
            await store._read(deadlocked)
    finally:
        await store.close()
