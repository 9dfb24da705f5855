"""The job kind of experiment O (``sqlq.bench.experiments.o_progress``), imported by its
server (``sqlq serve --import sqlq.bench.progresskind``): a job that reports progress
every ``every_ms`` for ``seconds`` (``every_ms`` 0: the same job reporting nothing), so
the store writes its reports cost are the difference between the two. ``checkpoint_kib``
(0: none): the job first saves a checkpoint of about that size, which every write of the
job then carries unless the store writes only what changed."""

from __future__ import annotations

from typing import Any

from sqlq import JobContext, task

IMPORT = "sqlq.bench.progresskind"
KIND = "bench.progress"


@task(name=KIND, timeout=3600)
async def reporting(args: Any, ctx: JobContext) -> Any:
    every, seconds = int(args["every_ms"]) / 1000, float(args["seconds"])
    kib = int(args.get("checkpoint_kib", 0))
    if kib:  # JSON of exactly ``kib`` KiB: {"blob":"xxx..."} is 11 bytes besides the x's
        await ctx.checkpoint({"blob": "x" * (kib * 1024 - 11)})
    clock = ctx.clock
    start = clock.monotonic()
    end = start + seconds
    reports = 0
    while (left := end - clock.monotonic()) > 0:
        await clock.sleep(min(every or 0.05, left))
        ctx.beat()
        if every:
            done = min(100.0, 100 * (clock.monotonic() - start) / seconds)
            ctx.progress(percent=round(done, 2), message=f"report {reports}")
            reports += 1
    if every:
        ctx.progress(percent=100.0, message="done")  # the latest goes with the outcome
        reports += 1
    return {"reports": reports}
