"""Experiment R's step as a sqlq task, ``flow.step`` (``sqlq serve --import
sqlq.bench.flowstep``): ``sqlq.bench.flowmarks.step``, its marks around its work. A module
of its own, so that ``python -m sqlq.bench.flowmarks`` registers no task twice."""

from __future__ import annotations

from typing import Any

from sqlq import task
from sqlq.bench.flowmarks import STEP_MS, step


@task(name="flow.step")
def flow_step(args: dict[str, Any]) -> None:
    step(str(args["key"]), int(args.get("ms", STEP_MS)))
