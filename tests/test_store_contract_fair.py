"""The JobStore contract for fair claims (#37), over every engine: a job's key and weight
are stored as given and come back with every read and after a reopen; a queue's policy
is durable like a pause, and None removes it."""

from __future__ import annotations

import msgspec

from sqlq.common.fair import KeyPolicy, Policy, Rate
from sqlq.common.models import Job
from sqlq.common.store import JobQuery, JobStore
from tests.helpers import NOW, StoreFactory
from tests.store_contract_helpers import new_job

POLICY = Policy(
    key_concurrency=2,
    rate=Rate(per_s=10.0, burst=1),
    queue_rate=Rate(per_s=100.0, burst=5),
    keys={"big": KeyPolicy(key_concurrency=5, weight=3)},
)


def keyed(n: int, key: str | None, weight: int = 1) -> Job:
    return msgspec.structs.replace(new_job(n), key=key, weight=weight)


async def test_a_jobs_key_and_weight_round_trip(store: JobStore) -> None:
    jobs = [keyed(1, "tenant-a", 3), keyed(2, None), keyed(3, "x" * 128, 1000)]
    await store.commit(jobs)
    for job in jobs:
        assert await store.get(job.id) == job
    assert await store.get_many([j.id for j in jobs]) == jobs
    assert await store.list_jobs(JobQuery(limit=10)) == sorted(jobs, key=lambda j: j.id)
    started = jobs[0].start(NOW + 1)
    await store.commit([started])  # a transition keeps them
    got = await store.get(jobs[0].id)
    assert got is not None
    assert (got.key, got.weight) == ("tenant-a", 3)


async def test_key_weight_and_policies_survive_a_reopen(reopen_factory: StoreFactory) -> None:
    store = reopen_factory()
    await store.open()
    job = keyed(1, "tenant-a", 7)
    try:
        await store.commit([job])
        await store.set_queue_policy("mail", POLICY)
        await store.set_queue_policy("other", Policy(rate=Rate(per_s=1.0)))
        await store.set_queue_policy("other", None)  # gone
        await store.set_queue_policy("never", None)  # (nothing to remove: no error)
        await store.set_queue_paused("mail", True)  # a pause beside it keeps the policy
    finally:
        await store.close()
    again = reopen_factory()
    recovery = await again.open()
    try:
        assert await again.get(job.id) == job
        assert recovery.queue_policies == {"mail": POLICY}
        assert recovery.paused_queues == ["mail"]
        await again.set_queue_paused("mail", False)
        await again.set_queue_policy("mail", Policy(key_concurrency=1))
    finally:
        await again.close()
    third = reopen_factory()
    recovery = await third.open()
    await third.close()
    assert recovery.queue_policies == {"mail": Policy(key_concurrency=1)}
    assert recovery.paused_queues == []
