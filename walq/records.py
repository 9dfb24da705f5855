"""A change record's ops: how one commit call's changes become log bytes and back.

The writer encodes each commit call's ops on the caller's turn
(``encode_ops``) and frames a batch's calls as change records
(``change_record``); recovery decodes a record's ops into the changes they
encode (``op_change``). ``walq.log`` owns the framing and the record types;
``walq.store`` drives both directions.

A running job's change of only what its attempt reports (progress, a cancel asked for, a
remote lease) is a ``patch`` op (``log.Patch``), not the whole transition: the writer
makes one only where it is exactly that transition on the job it applies to
(``patch_of``), checked on the caller's turn against the committed job and again in the
batch against the job as staged before it; otherwise the call is encoded whole.

A schedule change is an op of its own kind (``sput``, ``sdrop``, ``sadv``) in
the same record as the rest of its call, so a tick (its cursor's advance and its
job) is one CRC-framed line: a torn tail drops both or neither. A compaction
stores each schedule as a ``{"sched":<schedule>}`` snapshot record, folded back
as a put that expects no schedule of that name (``snapshot_change``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from sqlq.common.engine.index import Staged
from sqlq.common.models import Job, State, Transition
from sqlq.common.schedule import AdvanceSchedule, DropSchedule, PutSchedule, Schedule
from sqlq.common.store import Change
from sqlq.walq import log

# Schedule changes by op name; a job's ops (``put``, ``set``) never go through these.
_SCHEDULE_OPS: dict[str, type[PutSchedule | DropSchedule | AdvanceSchedule]] = {
    "sput": PutSchedule,
    "sdrop": DropSchedule,
    "sadv": AdvanceSchedule,
}
_SCHEDULE_TAGS = {kind: b'{"%s":%%s}' % name.encode() for name, kind in _SCHEDULE_OPS.items()}
_PUT = msgspec.json.Decoder(PutSchedule)


class ScheduleOps(bytes):
    """The encoded ops of a call that holds a schedule change: the writer tells them from a
    call of only jobs by this type (one check per call), so a batch without schedules pays
    nothing per job for them."""

    __slots__ = ()


def _schedule_op(change: PutSchedule | DropSchedule | AdvanceSchedule) -> bytes:
    """A schedule change's op. A put is decoded back here, as recovery will decode it, so a
    spec recovery would refuse (a field out of its bounds: a ``Struct`` built in code is not
    checked) fails its caller now (``UnencodableError``, from the ``ValueError``) instead of
    the next open: recovery never refuses what the engine wrote."""
    body = msgspec.json.encode(change)
    if isinstance(change, PutSchedule):
        _PUT.decode(body)
    return _SCHEDULE_TAGS[type(change)] % body


def encode_ops(changes: Sequence[Change]) -> bytes:
    """One commit call's ops, encoded on the caller's turn (see ``GroupCommitter``); a
    ``ScheduleOps`` if any of them changes a schedule. A job and a transition take the
    checks they took before schedules existed: a job one ``isinstance``, a transition two."""
    encode = msgspec.json.encode
    if len(changes) == 1:
        change = changes[0]
        if isinstance(change, Job):
            return b'{"put":%s}' % encode(change)
        if isinstance(change, Transition):
            return b'{"set":%s}' % encode(change)
        return ScheduleOps(_schedule_op(change))
    ops: list[bytes] = []
    scheduled = False
    for change in changes:
        if isinstance(change, Job):
            ops.append(b'{"put":%s}' % encode(change))
        elif isinstance(change, Transition):
            ops.append(b'{"set":%s}' % encode(change))
        else:
            ops.append(_schedule_op(change))
            scheduled = True
    return ScheduleOps(b",".join(ops)) if scheduled else b",".join(ops)


class PatchOps(bytes):
    """The encoded op of a call that is one ``patch``: the writer checks it again against
    the job as staged before it in the batch (``patch_of``), and encodes the call whole if
    another change came between."""

    __slots__ = ()


def _same(a: object, b: object) -> bool:
    """Whether a transition's field leaves the job's as it is: the very value (what
    ``Job._to`` copies), or an equal one of the same type (never 1 for True)."""
    return a is b or (type(a) is type(b) and a == b)


def patch_of(job: Job, t: Transition) -> log.Patch | None:
    """``t`` as a patch, if on ``job`` (as it is before ``t``) it changes nothing but what
    a patch carries; else None. The checkpoint, result and errors must be the job's own
    values (the very objects; the runtime's transitions carry them so), not equal copies:
    comparing two 64 KiB values would cost what the patch saves."""
    if not (
        t.state is State.RUNNING
        and job.state is State.RUNNING
        and t.expect_epoch == t.epoch == job.epoch
        and t.checkpoint is job.checkpoint
        and t.result is job.result
        and t.errors is job.errors
        and t.attempts == job.attempts
        and t.snoozes == job.snoozes
        and t.attempts_total in (None, job.attempts_total)
        and _same(t.ready_at, job.ready_at)
        and _same(t.started_at, job.started_at)
        and _same(t.last_error, job.last_error)
        and _same(t.holder, job.holder)
    ):
        return None
    return log.Patch(
        job_id=t.job_id, expect_epoch=t.expect_epoch, updated_at=t.updated_at,
        progress=t.progress, cancel_requested_at=t.cancel_requested_at,
        lease_until=t.lease_until, cancel_forced=t.cancel_forced,
    )  # fmt: skip


def encode_patch(patch: log.Patch) -> PatchOps:
    """A patch's op."""
    return PatchOps(b'{"patch":%s}' % msgspec.json.encode(patch))


def jobs_of(staged: Staged) -> dict[str, Job]:
    """The jobs of a staged batch that changed a schedule (the rest of it are schedules, and
    None for a dropped one)."""
    return {k: j for k, j in staged.items() if isinstance(j, Job)}


def change_record(seq: int, ops: bytes) -> bytes:
    """One framed line holding one commit call's encoded ops."""
    return log.frame(b'{"seq":%d,"ops":[%s]}' % (seq, ops))


def compacted(change: Change | log.Patch) -> Change | log.Patch:
    return change.compact() if isinstance(change, Job) else change


def op_change(op: dict[str, Any]) -> Change | log.Patch:
    """One op of a change record as the change it encodes (a patch as itself: it becomes a
    transition on the job as it then is, ``log.Patch.transition``)."""
    if "put" in op:
        return Job.from_dict(op["put"])
    if "set" in op:
        return Transition.from_dict(op["set"])
    if "patch" in op:
        if len(op) != 1:
            raise ValueError(f"an op holds exactly one change, not {sorted(op)}")
        return msgspec.convert(op["patch"], log.Patch)
    if len(op) != 1:
        raise ValueError(f"an op holds exactly one change, not {sorted(op)}")
    ((name, body),) = op.items()
    kind = _SCHEDULE_OPS.get(name)
    if kind is None:
        raise ValueError(f"unknown op {name!r}")
    return msgspec.convert(body, kind)


def schedule_record(schedule: Schedule) -> bytes:
    """A schedule's snapshot record, framed."""
    return log.frame(b'{"sched":%s}' % msgspec.json.encode(schedule))


def snapshot_change(record: dict[str, Any]) -> Job | PutSchedule:
    """A snapshot record ``log.scan`` did not decode typed, as the change recovery folds:
    a job's, as read; a schedule's (the whole record), as a put that expects no schedule of
    its name (a snapshot holds each schedule once). No job's record is that one field."""
    if len(record) == 1 and "sched" in record:
        return PutSchedule(schedule=msgspec.convert(record["sched"], Schedule), expect_version=0)
    return Job.from_dict(record).compact()
