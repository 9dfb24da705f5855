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

from sqlq.common.models import JSON, Job, State, Transition
from sqlq.common.running import AttemptError, Progress

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
    *(RUNNING_COLUMNS := ("cancel_requested_at", "progress", "checkpoint", "snoozes", "errors")),
    # Who holds a running job, until when, and whether a forced cancel holds that lease
    # where it put it (PostgreSQL: the columns its claim, renewal and cancel statements own).
    *(LEASE_COLUMNS := ("holder", "lease_until", "cancel_forced")),
    # A job's fairness key and weight (``sqlq.common.fair``); never changed by a transition.
    *(FAIR_COLUMNS := ("key", "weight")),
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
    *RUNNING_COLUMNS,
    *LEASE_COLUMNS,
)
JOB_COLUMN_LIST = ", ".join(JOB_COLUMNS)  # for a statement's column list
# The rows below are the models' fields in order: say so where it can be checked once. All
# but a workflow member's ``flow``, last, which each engine keeps its own way: SQLite in
# tables of its own (sqlite/flows.py), PostgreSQL in a column and a table (postgres/flows.py).
if (*JOB_COLUMNS, "flow") != Job.__struct_encode_fields__:
    raise AssertionError(f"JOB_COLUMNS are not Job's fields: {Job.__struct_encode_fields__}")
if (*TRANSITION_COLUMNS, "flow") != Transition.__struct_encode_fields__:
    raise AssertionError("TRANSITION_COLUMNS are not Transition's fields")

STATES = {s.value: s for s in State}  # a dict lookup, not the enum's call, per row

# What a running job carries (``sqlq.common.running``) as row values: progress, checkpoint
# and errors as JSON text, NULL for none (so a job that has none costs a NULL each).
_encode = msgspec.json.encode
_progress = msgspec.json.Decoder(Progress)
_errors = msgspec.json.Decoder(tuple[AttemptError, ...])


def running_values(c: Job | Transition) -> tuple[Any, ...]:
    """The ``RUNNING_COLUMNS`` values of a job or a transition, in their order."""
    return (
        c.cancel_requested_at,
        None if c.progress is None else _encode(c.progress).decode(),
        None if c.checkpoint is None else _encode(c.checkpoint).decode(),
        c.snoozes,
        _encode(c.errors).decode() if c.errors else None,
    )


def running_fields(
    progress: str | None, checkpoint: str | None, errors: str | None
) -> tuple[Progress | None, JSON, tuple[AttemptError, ...]]:
    """Those columns' values back as the fields."""
    return (
        None if progress is None else _progress.decode(progress),
        None if checkpoint is None else msgspec.json.decode(checkpoint),
        () if errors is None else _errors.decode(errors),
    )


def job_values(job: Job) -> tuple[Any, ...]:
    """One job row, in ``JOB_COLUMNS`` order."""
    return (
        job.id,
        job.kind,
        msgspec.json.encode(job.args).decode(),
        job.state._value_,  # (not ``.value``: the enum's property is a Python call a row)
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
        *running_values(job),
        job.holder,
        job.lease_until,
        job.cancel_forced,
        job.key,
        job.weight,
    )


def transition_values(t: Transition) -> tuple[Any, ...]:
    """One transition row, in ``TRANSITION_COLUMNS`` order."""
    return (
        t.job_id,
        t.expect_epoch,
        t.state._value_,
        t.epoch,
        t.attempts,
        t.ready_at,
        t.updated_at,
        t.last_error,
        msgspec.json.encode(t.result).decode(),
        t.started_at,
        t.attempts_total,
        *running_values(t),
        t.holder,
        t.lease_until,
        t.cancel_forced,
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
        cancel_requested_at,
        progress,
        checkpoint,
        snoozes,
        errors,
        holder,
        lease_until,
        cancel_forced,
        key,
        weight,
    ) = row
    progress, checkpoint, errors = running_fields(progress, checkpoint, errors)
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
        cancel_requested_at=cancel_requested_at,
        progress=progress,
        checkpoint=checkpoint,
        snoozes=snoozes,
        errors=errors,
        holder=holder,
        lease_until=lease_until,
        cancel_forced=bool(cancel_forced),  # (SQLite's 0 or 1)
        key=key,
        weight=weight,
    ).compact()  # interns kind and queue
