"""Helpers for runtime tests: start a Service on any engine, submit, wait."""

from __future__ import annotations

from typing import Any

from common.models import Job
from common.runtime.service import Service
from common.specs import JobSpec
from tests.conftest import wait_for


async def submit(rt: Service, kind: str = "sleep", **spec: Any) -> Job:
    [job] = await rt.submit([JobSpec(kind=kind, **spec)])
    return job


async def final(rt: Service, job_id: str, within: float = 20.0) -> Job:
    """The job once it reaches a terminal state."""
    out: list[Job] = []

    async def done() -> bool:
        job = await rt.get(job_id)
        if job is not None and job.terminal:
            out.append(job)
            return True
        return False

    await wait_for(done, within, f"job {job_id} to finish")
    return out[0]
