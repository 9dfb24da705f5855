"""Make ``tests/data/walq_v_old/``: a walq log written by the code before a running job
carried anything (no ``cancel_requested_at``, ``progress``, ``checkpoint``, ``snoozes``,
``errors``), for ``tests/test_walq_old_log.py``, which proves today's code replays it.

How it was made (commit ab7b3a9, the tree before the new fields)::

    git worktree add /tmp/walq-old ab7b3a9
    PYTHONPATH=/tmp/walq-old .venv/bin/python tests/data/make_walq_old.py tests/data/walq_v_old
    git worktree remove /tmp/walq-old

It writes jobs in every state (one retried from dead), a paused queue, a schedule and a
tick, then a compaction (the log's snapshot records), then more change records after it;
and ``expected.json``: every job and schedule as that code reads them back, which the
test compares field by field. Deterministic: fixed ids and a fake clock.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import msgspec

import sqlq
from sqlq.common.clock import FakeClock
from sqlq.common.models import Job, Transition
from sqlq.common.schedule import AdvanceSchedule, PutSchedule, Schedule, ScheduleSpec, tick_key
from sqlq.walq.store import WalStore

NOW = 1_700_000_000.0


def job(name: str, **kw: Any) -> Job:
    return Job.new(kind="sleep", args={"name": name}, now=NOW, job_id=f"{name:0>32}", **kw)


async def make(data: Path) -> dict[str, Any]:
    clock = FakeClock(NOW)
    store = WalStore(data, clock=clock)
    await store.open()
    state: dict[str, Job] = {}

    async def put(j: Job) -> Job:
        await store.commit([j])
        state[j.id] = j
        return j

    async def move(j: Job, t: Transition) -> Job:
        await store.commit([t])
        state[j.id] = new = j.apply(t)
        return new

    keyed = job("a0", priority=3, queue="mail", idempotency_key="k-a0", request_hash="h")
    waiting = await put(keyed)
    delayed = await put(job("a1", ready_at=NOW + 3600, max_attempts=3))
    running = await move(r := await put(job("a2")), r.start(NOW + 1))
    done = await move(d := await put(job("a3")), d.start(NOW + 1))
    done = await move(done, done.complete({"answer": 42}, NOW + 2))
    failed = await move(f := await put(job("a4", max_attempts=2)), f.start(NOW + 1))
    failed = await move(failed, failed.retry("boom 1", NOW + 5, NOW + 2))  # scheduled again
    dead = await move(x := await put(job("a5", max_attempts=2)), x.start(NOW + 1))
    dead = await move(dead, dead.retry("boom 1", NOW + 2, NOW + 2))
    dead = await move(dead, dead.start(NOW + 3))
    dead = await move(dead, dead.bury("boom 2", NOW + 4))
    gone = await move(c := await put(job("a6")), c.cancel(NOW + 1))
    revived = await move(v := await put(job("a7", max_attempts=1)), v.start(NOW + 1))
    revived = await move(revived, revived.bury("died", NOW + 2))
    revived = await move(revived, revived.revive(NOW + 3))  # attempts_total 1
    await store.set_queue_paused("mail", True)
    sched = Schedule(
        name="nightly", spec=ScheduleSpec(kind="sleep", every_s=60, args={"n": 1}),
        version=1, cursor=int(NOW), created_at=NOW, updated_at=NOW,
    )  # fmt: skip
    await store.commit([PutSchedule(schedule=sched, expect_version=0)])
    tick = int(NOW) + 60
    ticked = Job.new(
        kind="sleep", args={}, now=tick + 0.5, ready_at=tick,
        idempotency_key=tick_key("nightly", tick), job_id="sched" + "0" * 27,
    )  # fmt: skip
    await store.commit(
        [AdvanceSchedule(name="nightly", expect_version=1, expect_cursor=int(NOW), cursor=tick,
                         job=ticked.id), ticked]
    )  # fmt: skip
    state[ticked.id] = ticked
    await store.compact()  # the log is now a snapshot: header, sched and snap records
    # ... and change records after it.
    late = await put(job("b0"))
    running = await move(running, running.complete({"late": True}, NOW + 10))
    waiting = await move(waiting, waiting.start(NOW + 10))  # running at the close
    failed = await move(failed, failed.start(NOW + 11))
    failed = await move(failed, failed.bury("boom 2", NOW + 12))  # dead, two errors in history
    del late, delayed, done, dead, gone, revived
    await store.close()

    again = WalStore(data, clock=FakeClock(NOW))
    recovery = await again.open()
    jobs = {i: (await again.get(i)) for i in sorted(state)}
    schedules = await again.list_schedules()
    await again.close()
    assert all(j is not None and j == state[i] for i, j in jobs.items()), "read back differs"
    return {
        "jobs": {i: j.to_dict() for i, j in jobs.items() if j is not None},
        "schedules": [msgspec.to_builtins(s) for s in schedules],
        "paused_queues": recovery.paused_queues,
    }


def main() -> None:
    data = Path(sys.argv[1])
    print("sqlq from", sqlq.__file__)
    if data.exists():
        shutil.rmtree(data)
    data.mkdir(parents=True)
    expected = asyncio.run(make(data))
    (data / "walq.lock").unlink(missing_ok=True)
    (data / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
