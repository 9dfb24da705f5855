"""A job as SQL row values, and back: one column order for both SQL engines.

``JOB_COLUMNS`` names the columns once, in the order of every row here; the
engines' statements list them from it (PostgreSQL's ``{job_columns}``) or in that
order (SQLite's ``queries.sql``), and the order is the job model's field order.
args and result travel as JSON text, exactly as msgspec encodes them, so a job
comes back bit for bit as it went in.
"""

from __future__ import annotations

from typing import Any

import msgspec

from sqlq.common.models import Job, State, Transition

# A job row's columns, in order. Every statement that reads a job selects exactly these.
JOB_COLUMNS = (
    "id",
    "kind",
    "args",
    "state",
    "attempts",
    "max_attempts",
    "ready_at",
    "priority",
    "epoch",
    "created_at",
    "updated_at",
    "last_error",
    "result",
    "started_at",
    "queue",
    "idempotency_key",
    "request_hash",
    "attempts_total",
)
# A transition row's columns, in order: the job's id, the epoch it must be at, then
# what the job becomes (a NULL attempts_total leaves the column as it is).
TRANSITION_COLUMNS = (
    "id",
    "expect_epoch",
    "state",
    "epoch",
    "attempts",
    "ready_at",
    "updated_at",
    "last_error",
    "result",
    "started_at",
    "attempts_total",
)
JOB_COLUMN_LIST = ", ".join(JOB_COLUMNS)  # for a statement's column list
# The rows below are the models' fields in order: say so where it can be checked once.
if JOB_COLUMNS != Job.__struct_encode_fields__:
    raise AssertionError(f"JOB_COLUMNS are not Job's fields: {Job.__struct_encode_fields__}")
if TRANSITION_COLUMNS != Transition.__struct_encode_fields__:
    raise AssertionError("TRANSITION_COLUMNS are not Transition's fields")

STATES = {s.value: s for s in State}  # a dict lookup, not the enum's call, per row


def job_values(job: Job) -> tuple[Any, ...]:
    """One job row, in ``JOB_COLUMNS`` order."""
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
    """One transition row, in ``TRANSITION_COLUMNS`` order."""
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
    """The job of a row of exactly ``JOB_COLUMNS``, unpacked by name in their order
    (as fast as indexing, and a row of any other width fails here, not later)."""
    (
        job_id,
        kind,
        args,
        state,
        attempts,
        max_attempts,
        ready_at,
        priority,
        epoch,
        created_at,
        updated_at,
        last_error,
        result,
        started_at,
        queue,
        idempotency_key,
        request_hash,
        attempts_total,
    ) = row
    return Job(
        id=job_id,
        kind=kind,
        args=msgspec.json.decode(args),
        state=STATES[state],
        attempts=attempts,
        max_attempts=max_attempts,
        ready_at=ready_at,
        priority=priority,
        epoch=epoch,
        created_at=created_at,
        updated_at=updated_at,
        last_error=last_error,
        result=None if result is None else msgspec.json.decode(result),
        started_at=started_at,
        queue=queue,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
        attempts_total=attempts_total,
    ).compact()  # interns kind and queue
