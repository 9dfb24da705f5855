"""What the worker-process tests share (``sqlq serve --processes``, ``sqlq worker
--processes``): one module of plain handlers that the spawned children import, and the
parent's view of the same kinds in a registry of its own, so the test process's ``@task``
registry is untouched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sqlq import JobContext, task
from sqlq.runtime.kinds import Registry

MODULE = "proc_handlers"
HANDLERS = """
import logging, os, time
from sqlq import task

@task()
def crunch(args, ctx):
    total = 0
    for i in range(args["n"]):
        total += i * i
    return {"pid": os.getpid(), "sum": total}

@task()
def broken(args, ctx):
    logging.getLogger("proc_handlers").warning("about to break in %d", os.getpid())
    return args["missing"]

@task()
def until_cancelled(args, ctx):
    ctx.checkpoint({"pid": os.getpid()})
    i = 0
    while not ctx.cancelled:
        i += 1
        ctx.progress(i % 100, f"spin {i}")
        ctx.beat()
        time.sleep(0.005)
    ctx.raise_if_cancelled()

@task(timeout=1)
def stuck(args, ctx):
    time.sleep(3600)

@task()
def gather(args, ctx):
    return {"pid": os.getpid(), "parents": {ref: p.result for ref, p in ctx.parents.items()},
            "complete": ctx.parents.complete}

@task()
def gather_all(args, ctx):
    pages = [list(p) for p in ctx.parents.pages()]
    return {"pid": os.getpid(), "first": len(ctx.parents), "pages": [len(p) for p in pages],
            "last": pages[-1][-1] if pages else None}

@task()
def fan(args, ctx):
    import sqlq
    jobs = [{"kind": "crunch", "args": {"n": n}, "ref": f"c{n}"} for n in args["ns"]]
    return sqlq.Spawn(jobs=[*jobs, {"kind": "gather", "ref": "g",
                                    "depends_on": [j["ref"] for j in jobs]}],
                      result={"pid": os.getpid()})

@task(timeout=1.5)
def nap(args, ctx):
    time.sleep(args["s"])
    return os.getpid()

@task()
def limited(args, ctx):
    import sqlq
    if ctx.job.snoozes == 0:
        raise sqlq.RateLimited(args["after_s"])
    return os.getpid()
"""
TIMEOUTS = {"crunch": 300.0, "broken": 300.0, "until_cancelled": 300.0, "stuck": 1.0,
            "nap": 1.5, "gather": 300.0, "fan": 300.0, "gather_all": 300.0,
            "limited": 300.0}  # fmt: skip


def parent_kinds() -> Registry:
    """The parent's view of ``HANDLERS``: plain functions with the same limits, so their
    jobs go to the processes (one here would be a bug: it raises)."""
    reg = Registry()
    for name, timeout in TIMEOUTS.items():

        def fn(args: Any, ctx: JobContext) -> Any:
            raise AssertionError("runs in a worker process, never here")

        fn.__name__ = name
        task(registry=reg, timeout=timeout)(fn)
    return reg


@pytest.fixture
def handlers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The handlers' module, importable by name (spawned children get this sys.path)."""
    (tmp_path / f"{MODULE}.py").write_text(HANDLERS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return MODULE
