"""Fill a data directory through an engine, for experiments G and K.

``--transitions N``: jobs go submit -> start -> complete in commits of 1,000
changes; about 1 in 30 transitions is a job left scheduled, so recovery has
live work to find. ``--live N``: N jobs delayed by a day, all live at restart.
``--compact``: the engine compacts once the jobs are in (walq: its log becomes the
snapshot a restart reads, one record a job).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from sqlq.common.models import Job
from sqlq.engines.registry import make_store
from sqlq.runtime.kinds import sleep_kind

CHUNK = 1000
# A no-op job's arguments as ``sqlq serve`` stores them (the sleep kind's own validate: its
# defaults left out, so ``{}``, the shared empty dict), not as a client writes them: a
# restart then reads what a server that took these jobs would have written.
NOOP_ARGS = sleep_kind(fault_injection=False).validate({"work_ms": 0})


async def fill(store_name: str, data: str, transitions: int) -> None:
    store = make_store(store_name, data, sync="os")
    await store.open()
    now = time.time()
    live = transitions // 30
    done = (transitions - live) // 3
    for start in range(0, done, CHUNK):
        jobs = [
            Job.new(kind="sleep", args=NOOP_ARGS, now=now) for _ in range(min(CHUNK, done - start))
        ]
        await store.commit(jobs)
        starts = [j.start(now) for j in jobs]
        await store.commit(starts)
        await store.commit(
            [j.apply(t).complete(None, now) for j, t in zip(jobs, starts, strict=True)]
        )
    for start in range(0, live, CHUNK):
        await store.commit(
            [Job.new(kind="sleep", args={}, now=now) for _ in range(min(CHUNK, live - start))]
        )
    await store.close()


async def fill_live(store_name: str, data: str, jobs: int, compact: bool = False) -> None:
    store = make_store(store_name, data, sync="os")
    await store.open()
    now = time.time()
    for start in range(0, jobs, CHUNK):
        await store.commit(
            [Job.new(kind="sleep", args=NOOP_ARGS, now=now, ready_at=now + 86400)
             for _ in range(min(CHUNK, jobs - start))]
        )  # fmt: skip
    if compact:
        await store.compact()
    await store.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--store", required=True)
    p.add_argument("--data", required=True)
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--transitions", type=int)
    how.add_argument("--live", type=int)
    p.add_argument("--compact", action="store_true")
    a = p.parse_args()
    if a.live is not None:
        asyncio.run(fill_live(a.store, a.data, a.live, a.compact))
    else:
        asyncio.run(fill(a.store, a.data, a.transitions))


if __name__ == "__main__":
    main()
