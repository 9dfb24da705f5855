"""A child process for the kill -9 tests: appends forever, printing what was acked.

Each ``S``/``R``/``C`` line on stdout is printed only after the commit returned, so every
such line the parent reads names a change the engine acknowledged as durable. A ``K n``
line says walq has compacted n times (checked every 50 ms), so the parent can wait for
a compaction before it kills, instead of hoping one happened.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from sqlq.common.models import Job
from sqlq.engines.registry import make_store


def _report_compactions(store: object, told: int = 0) -> None:
    count = store.stats().detail["compactions"]  # type: ignore[attr-defined]
    if count > told:
        sys.stdout.write(f"K {count}\n")
        sys.stdout.flush()
    asyncio.get_running_loop().call_later(0.05, _report_compactions, store, count)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--sync", default="full")
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--compact-floor", type=int, default=64 << 20)
    parser.add_argument("--compact-ratio", type=float, default=4.0)
    args = parser.parse_args()
    options = (
        {"compact_floor_bytes": args.compact_floor, "compact_ratio": args.compact_ratio}
        if args.store == "walq"
        else {}
    )
    store = make_store(args.store, args.data, sync=args.sync, **options)
    await store.open()
    out = sys.stdout
    n = 0

    async def writer(w: int) -> None:
        nonlocal n
        while True:
            n += 1
            # Timestamps far in the future: nothing is ever old enough to be pruned.
            job = Job.new(kind="sleep", args={"w": w, "n": n}, now=4e9)
            await store.commit([job])
            out.write(f"S {job.id}\n")
            start = job.start(now=4e9 + 1)
            await store.commit([start])
            out.write(f"R {job.id}\n")
            if n % 2:
                await store.commit([job.apply(start).complete({"n": n}, now=4e9 + 2)])
                out.write(f"C {job.id}\n")
            out.flush()

    print("READY", flush=True)
    if args.store == "walq":
        asyncio.get_running_loop().call_later(0.05, _report_compactions, store)
    await asyncio.gather(*(writer(w) for w in range(args.writers)))


if __name__ == "__main__":
    asyncio.run(main())
