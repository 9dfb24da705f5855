"""The crash trials' own job kinds, imported by the server they kill (``sqlq serve --import
sqlq.bench.crashtasks``): handlers that use what a running job carries (issue 22).

- ``crash.checkpoint``: reads the checkpoint it started with, saves its own
  (``{"epoch": its epoch, "read": the epoch it read}``) and waits for it to be durable,
  appends that epoch to the handlers' ledger (fsynced: the file named by
  ``$SQLQ_CRASH_SAVED``), reports progress while it works a while, then fails its first
  ``fail_first`` attempts on purpose and completes with the same two epochs as its
  result. The verifier (``sqlq.bench.verdict``) checks from the files alone that the
  attempt which completed read at least the newest checkpoint an earlier attempt saw
  durable, so a checkpoint survives a failure and a kill -9 alike.
- ``crash.snooze``: snoozes until the job has snoozed ``snoozes`` times, then completes;
  its attempts must not count the snoozes.
- ``crash.stubborn``: a plain (thread) handler that works ``work_ms`` and ignores a
  cancel: asked while it runs, it completes, unless a kill lands first; then the
  restart must end it cancelled, never run it again.

- ``crash.doomed``: fails every attempt up to the ``fail_first``-th the job ever made
  (``Job.all_attempts``), so a workflow member dies at once and an operator's retry of
  its workflow gets past it (``sqlq.bench.crashflow``).
- ``crash.fan``: completes by spawning ``n`` short ``sleep`` jobs (``sqlq.spawn``), which
  must exist exactly when it completed, each after it; their refs name it
  (``spawned:<its id>.<i>``), so a verifier tells them from a client's unacknowledged job.

An attempt's epoch names it: every requeue (a failure, a snooze, a rescue at a restart)
takes a new one, so two attempts of a job never share one.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import sqlq
from sqlq import JobContext, task

SAVED_ENV = "SQLQ_CRASH_SAVED"  # the handlers' ledger: "<job id> <epoch>" per durable save
IMPORT = "sqlq.bench.crashtasks"  # what ``sqlq serve --import`` is given
SPAWNED = "spawned:"  # the refs of the jobs ``crash.fan`` spawns begin so


def _append(line: str) -> None:
    path = os.environ.get(SAVED_ENV)
    if not path:
        return
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _epoch(value: Any) -> int | None:
    return value.get("epoch") if isinstance(value, dict) else None


@task(name="crash.checkpoint", timeout=60)
async def checkpointing(args: Any, ctx: JobContext) -> Any:
    job = ctx.job
    read = _epoch(ctx.checkpoint_data)
    ctx.progress(percent=0.0, message=f"attempt {job.attempts} read epoch {read}")
    await ctx.checkpoint({"epoch": job.epoch, "read": read})
    await asyncio.to_thread(_append, f"{job.id} {job.epoch}\n")  # only once it is durable
    clock = ctx.clock
    deadline = clock.monotonic() + int(args.get("work_ms", 50)) / 1000
    step = 0
    while (left := deadline - clock.monotonic()) > 0:
        await clock.sleep(min(0.01, left))
        step += 1
        ctx.progress(percent=min(99.0, float(step)), message=f"step {step}")
        ctx.beat()
    if job.attempts <= int(args.get("fail_first", 1)):
        raise RuntimeError(f"attempt {job.attempts} fails on purpose, after its checkpoint")
    return {"epoch": job.epoch, "read": read}


@task(name="crash.snooze", timeout=60)
async def snoozing(args: Any, ctx: JobContext) -> Any:
    job = ctx.job
    if job.snoozes < int(args.get("snoozes", 1)):
        return sqlq.snooze(float(args.get("delay_ms", 20)) / 1000)
    return {"snoozes": job.snoozes, "attempts": job.attempts}


@task(name="crash.stubborn", timeout=60)
def stubborn(args: Any, ctx: JobContext) -> Any:
    end = time.monotonic() + int(args.get("work_ms", 500)) / 1000
    while time.monotonic() < end:
        time.sleep(0.01)  # in its thread; ``ctx.cancelled`` is not looked at, on purpose
        ctx.beat()
    return {"ignored_cancel": ctx.cancelled}


@task(name="crash.doomed", timeout=60)
async def doomed(args: Any, ctx: JobContext) -> Any:
    if ctx.job.all_attempts <= int(args.get("fail_first", 1)):
        raise RuntimeError(f"attempt {ctx.job.all_attempts} is doomed, on purpose")
    return {"attempt": ctx.job.all_attempts}


@task(name="crash.fan", timeout=60)
async def fan(args: Any, ctx: JobContext) -> Any:
    jobs = [{"kind": "sleep", "args": {"work_ms": 1}, "ref": f"{SPAWNED}{ctx.job.id}.{i}"}
            for i in range(int(args.get("n", 1)))]  # fmt: skip
    return sqlq.Spawn(jobs=jobs, result={"spawned": len(jobs)})
