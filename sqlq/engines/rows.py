"""A job as SQL row values, and back: one column order for both SQL engines.

The order is ``{job_columns}`` in each engine's ``queries.sql``. args and result
travel as JSON text, exactly as msgspec encodes them, so a job comes back bit
for bit as it went in.
"""

from __future__ import annotations

from typing import Any

import msgspec

from sqlq.common.models import Job, State, Transition

STATES = {s.value: s for s in State}  # a dict lookup, not the enum's call, per row


def job_values(job: Job) -> tuple[Any, ...]:
    """One ``insert_jobs`` row, in column order."""
    return (
        job.id,
        job.kind,
        msgspec.json.encode(job.args).decode(),
        job.state.value,
        job.attempts,
        job.max_attempts,
        job.ready_at,
        job.priority,
        job.epoch,
        job.created_at,
        job.updated_at,
        job.last_error,
        msgspec.json.encode(job.result).decode(),
        job.started_at,
        job.queue,
        job.idempotency_key,
        job.request_hash,
        job.attempts_total,
    )


def transition_values(t: Transition) -> tuple[Any, ...]:
    """One ``apply_transitions`` row."""
    return (
        t.job_id,
        t.expect_epoch,
        t.state.value,
        t.epoch,
        t.attempts,
        t.ready_at,
        t.updated_at,
        t.last_error,
        msgspec.json.encode(t.result).decode(),
        t.started_at,
        t.attempts_total,
    )


def row_job(row: Any) -> Job:
    return Job(
        id=row[0],
        kind=row[1],
        args=msgspec.json.decode(row[2]),
        state=STATES[row[3]],
        attempts=row[4],
        max_attempts=row[5],
        ready_at=row[6],
        priority=row[7],
        epoch=row[8],
        created_at=row[9],
        updated_at=row[10],
        last_error=row[11],
        result=None if row[12] is None else msgspec.json.decode(row[12]),
        started_at=row[13],
        queue=row[14],
        idempotency_key=row[15],
        request_hash=row[16],
        attempts_total=row[17],
    ).compact()  # interns kind and queue
