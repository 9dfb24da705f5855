"""Make tests/data/sqlite_v5.db and sqlite_v5.json with the code of schema version 5.

Run with *that* code on the path, not this tree's (tests/data/README.md says how): the
migration test (tests/test_sqlite_migrate_v6.py) must open a database exactly as users
have it, written by the engine of its day. It writes what version 6 adds a column for: a
remote worker's running job whose cancel was forced (as that code stored it: the cancel
asked for and the lease cut to the grace's end, nothing saying it was forced), beside one
held remotely and not cancelled, one running in process and one scheduled; the JSON beside
it is what was written, as that code's ``to_dict`` gives it, for the test to compare.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

import msgspec

from sqlq.common.models import Job
from sqlq.engines.sqlite.store import SCHEMA_VERSION, SQLiteStore

NOW = 1_700_000_000.0
GRACE_S = 10.0  # cancel_grace_s's default then
OUT = Path(__file__).resolve().parent


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


def main() -> None:
    if "cancel_forced" in Job.__struct_fields__ or SCHEMA_VERSION != "5":
        sys.exit("run this with the version-5 code on PYTHONPATH (tests/data/README.md)")
    with tempfile.TemporaryDirectory() as tmp:
        facts = asyncio.run(_write(Path(tmp)))
        db = Path(tmp) / "sqlq.db"
        # Smaller pages, so the committed file is a few KiB; the rows are as written.
        with sqlite3.connect(db, isolation_level=None) as c:
            c.execute("PRAGMA journal_mode = delete")
            c.execute("PRAGMA page_size = 1024")
            c.execute("VACUUM")
            c.execute("PRAGMA journal_mode = wal")
        c.close()
        shutil.copyfile(db, OUT / "sqlite_v5.db")
    (OUT / "sqlite_v5.json").write_text(json.dumps(facts, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
