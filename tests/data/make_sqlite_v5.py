"""What schema version 5's code writes into tests/data/sqlite_v5.db (``make_sqlite.py 5``).

Run with *that* code on the path, not this tree's (tests/data/README.md says how): the
migration test (tests/test_sqlite_migrate_v6.py) must open a database exactly as users
have it, written by the engine of its day. It writes what version 6 adds a column for: a
remote worker's running job whose cancel was forced (as that code stored it: the cancel
asked for and the lease cut to the grace's end, nothing saying it was forced), beside one
held remotely and not cancelled, one running in process and one scheduled; the JSON beside
it is what was written, as that code's ``to_dict`` gives it, for the test to compare.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from sqlq.common.models import Job
from sqlq.engines.sqlite.store import SCHEMA_VERSION, SQLiteStore

NOW = 1_700_000_000.0
GRACE_S = 10.0  # cancel_grace_s's default then


def _id(i: int) -> str:
    return f"018bcfe56900{i:020x}"


async def _write(data: Path) -> dict[str, object]:
    store = SQLiteStore(data)
    await store.open()
    jobs: dict[str, Job] = {}

    async def put(job: Job, *moves: object) -> Job:
        await store.commit([job])
        for make in moves:
            t = make(job)  # type: ignore[operator]
            await store.commit([t])
            job = job.apply(t)
        jobs[job.id] = job
        return job

    def claim(worker: str, at: float) -> object:
        return lambda j: j.start(at, holder=f"worker:{worker}", lease_until=at + 60)

    def forced(at: float) -> object:
        # what remote_local.LocalSide.cancel wrote for a forced cancel at schema version 5
        return lambda j: msgspec.structs.replace(
            j.request_cancel(at), lease_until=min(at + GRACE_S, j.lease_until)
        )

    await put(Job.new(kind="noop", args={"i": 1}, now=NOW, job_id=_id(1), queue="r"),
              claim("w1", NOW + 1), forced(NOW + 2))  # fmt: skip
    await put(Job.new(kind="noop", args={"i": 2}, now=NOW, job_id=_id(2), queue="r"),
              claim("w2", NOW + 1))  # fmt: skip
    await put(Job.new(kind="noop", args={"i": 3}, now=NOW, job_id=_id(3)),
              lambda j: j.start(NOW + 1))  # fmt: skip
    await put(Job.new(kind="noop", args={"i": 4}, now=NOW, job_id=_id(4)))
    await store.close()
    return {
        "made_by": "611e927 (schema version 5), tests/data/make_sqlite_v5.py",
        "schema_version": SCHEMA_VERSION,
        "jobs": [j.to_dict() for j in jobs.values()],
    }
