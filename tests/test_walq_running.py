"""walq keeps what a running job carries (issue 22) in every record it writes.

walq names no job field by hand: a put, a set and a snapshot record are the msgspec
encoding of ``Job`` and ``Transition``, and recovery decodes them into the same types
(the typed fast path, or ``op_change``/``snapshot_change`` for any other line). These
tests hold it to that, field by field, from the structs' own field lists, so a field
added later is covered too: through change records, a compaction's snapshot, a torn
tail cut at open, and ``repair``; and at the bounds, a 64 KiB checkpoint and the full
ten errors.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.models import Job, State, Transition
from sqlq.common.running import (
    MAX_CHECKPOINT_BYTES,
    MAX_ERRORS,
    MAX_HISTORY_ERROR_BYTES,
    AttemptError,
    Progress,
    check_checkpoint,
)
from sqlq.common.workflow import CancelReason, Flow, FlowChange, OnParentFailure, RunIf
from sqlq.walq import log, records
from sqlq.walq.repair import repair
from sqlq.walq.store import WalStore
from tests.walq_helpers import NOW, NoSyncFiles, log_path

BIG = {"blob": "x" * (MAX_CHECKPOINT_BYTES - len(b'{"blob":""}'))}  # exactly 64 KiB of JSON


def full_job(job_id: str = "f" * 32) -> Job:
    """A job with every field away from its default (asserted: a new field must be set here)."""
    errors = tuple(
        AttemptError(attempt=i + 1, error=f"boom {i} " + "e" * 900, at=NOW + i)
        for i in range(MAX_ERRORS)
    )
    job = Job(
        id=job_id, kind="crunch", args={"n": [1, 2, {"deep": True}]}, state=State.RUNNING,
        attempts=11, max_attempts=20, ready_at=NOW + 1, priority=7, epoch=13,
        created_at=NOW - 10, updated_at=NOW + 2, last_error="boom 9", result={"partial": 1},
        started_at=NOW + 1.5, queue="mail", idempotency_key="key-1", request_hash="hash-1",
        attempts_total=4, cancel_requested_at=NOW + 3,
        progress=Progress(percent=62.5, message="62 of 100", at=NOW + 2.5),
        checkpoint=check_checkpoint(BIG), snoozes=3, errors=errors,
        holder="worker:w-1", lease_until=NOW + 30, cancel_forced=True, key="tenant-7", weight=3,
        flow=Flow(
            workflow_id="c" * 32, ref="crunch-1", parents=("d" * 32,), deps_pending=1,
            failed=1, on_parent_failure=OnParentFailure.RUN, run_if=RunIf.ANY_FAILED,
            cancel_reason=CancelReason.USER,
        ),
    )  # fmt: skip
    plain = Job(id="0" * 32, kind="k", args=None, ready_at=0.0, created_at=0.0, updated_at=0.0)
    for name in msgspec.structs.fields(Job):
        assert getattr(job, name.name) != getattr(plain, name.name), name.name
    return job


def full_transition(job: Job) -> Transition:
    """A running -> running change with every field of ``Transition`` set (asserted)."""
    t = Transition(
        job_id=job.id, expect_epoch=job.epoch, state=State.RUNNING, epoch=job.epoch,
        attempts=job.attempts, ready_at=job.ready_at + 1, updated_at=NOW + 5,
        last_error="boom 10", result={"partial": 2}, started_at=NOW + 4, attempts_total=5,
        cancel_requested_at=NOW + 6, progress=Progress(percent=99.0, message=None, at=NOW + 5),
        checkpoint={"page": 99}, snoozes=4, errors=job.errors[1:],
        holder="worker:w-2", lease_until=NOW + 60, cancel_forced=True,
        flow=FlowChange(deps_pending=2, failed=1, cancel_reason=CancelReason.UPSTREAM_DEAD),
    )  # fmt: skip
    for name in msgspec.structs.fields(Transition):
        value = getattr(t, name.name)
        assert value is not None, name.name
        assert value != name.default, name.name
    return t


async def reopened(d: Path, *ids: str) -> dict[str, Job | None]:
    store = WalStore(d, clock=FakeClock(NOW + 100), fs=NoSyncFiles())
    await store.open()
    try:
        return {i: await store.get(i) for i in ids}
    finally:
        await store.close()


def test_every_field_survives_encoding_as_every_record_recovery_reads() -> None:
    job = full_job()
    t = full_transition(job)
    change = log.unframe(records.change_record(1, records.encode_ops([job, t])).rstrip(b"\n"))
    put, set_ = (records.op_change(op) for op in change["ops"])  # the generic path
    assert (put, set_) == (job, t)
    typed = log.scan(log.header(1, NOW) + records.change_record(1, records.encode_ops([job, t])))
    [(_, rec)] = typed.changes
    assert [op.change() for op in rec.ops] == [job, t]  # type: ignore[union-attr]
    snap = log.frame(b'{"snap":%s}' % msgspec.json.encode(job))
    assert records.snapshot_change(log.unframe(snap.rstrip(b"\n"))["snap"]) == job
    assert log.scan(log.header(2, NOW) + snap).snapshot == [job]  # typed


async def test_every_new_field_survives_reopen_and_compaction_at_its_bounds(
    tmp_path: Path,
) -> None:
    """A 64 KiB checkpoint and ten 1 KiB errors made by the real constructors, through
    change records, then a compaction's snapshot records, then a reopen of that."""
    store = WalStore(tmp_path, clock=FakeClock(NOW), fs=NoSyncFiles())
    await store.open()
    job = Job.new(kind="sleep", args={}, now=NOW, max_attempts=20, job_id="a" * 32)
    await store.commit([job])
    for i in range(MAX_ERRORS + 2):  # twelve failures: the first two fall off
        t = job.start(NOW + i)
        job = job.apply(t)
        await store.commit([t])
        if i == 0:
            t = job.touch(NOW + i, checkpoint=check_checkpoint(BIG))
        else:
            t = job.touch(NOW + i, progress=Progress(percent=float(i), message=f"at {i}", at=NOW))
        job = job.apply(t)
        await store.commit([t])
        t = job.retry(f"failure {i}: " + "z" * 2000, NOW + i + 1, NOW + i)
        job = job.apply(t)
        await store.commit([t])
    t = job.start(NOW + 50)
    job = job.apply(t)
    await store.commit([t])
    t = job.request_cancel(NOW + 51)
    job = job.apply(t)
    await store.commit([t])
    t = job.snooze(NOW + 60, NOW + 52)  # after a request the runtime withdraws; walq just stores
    job = job.apply(t)
    await store.commit([t])
    await store.close()
    assert len(job.errors) == MAX_ERRORS
    assert [e.attempt for e in job.errors] == list(range(3, 13))
    assert all(len(e.error.encode()) <= MAX_HISTORY_ERROR_BYTES for e in job.errors)
    assert len(msgspec.json.encode(job.checkpoint)) == MAX_CHECKPOINT_BYTES
    assert (job.snoozes, job.cancel_requested_at, job.attempts) == (1, NOW + 51, 12)
    assert await reopened(tmp_path, job.id) == {job.id: job}

    store = WalStore(tmp_path, clock=FakeClock(NOW + 100), fs=NoSyncFiles())
    await store.open()
    await store.compact()
    await store.close()
    lines = [log.unframe(x) for x in log_path(tmp_path).read_bytes().splitlines()]
    assert [next(iter(r)) for r in lines[1:]] == ["snap"]  # the snapshot alone holds it now
    assert records.snapshot_change(lines[1]["snap"]) == job
    assert await reopened(tmp_path, job.id) == {job.id: job}


async def test_a_torn_tail_and_repair_keep_the_new_fields_of_the_prefix(tmp_path: Path) -> None:
    whole, torn = full_job("b" * 32), full_job("c" * 32)
    store = WalStore(tmp_path, clock=FakeClock(NOW), fs=NoSyncFiles())
    await store.open()
    await store.commit([whole])
    await store.close()
    path = log_path(tmp_path)
    good = path.read_bytes()
    tail = records.change_record(2, records.encode_ops([torn]))
    path.write_bytes(good + tail[: len(tail) // 2])  # a torn write, in the 64 KiB checkpoint
    assert await reopened(tmp_path, whole.id, torn.id) == {whole.id: whole, torn.id: None}
    assert path.read_bytes() == good

    # Damage mid-log: open refuses, repair keeps the prefix (the whole job) and moves the rest.
    later = records.change_record(3, records.encode_ops([full_job("d" * 32)]))
    path.write_bytes(good + b"garbage\n" + later)
    report = repair(tmp_path, NoSyncFiles())
    assert (report.kept_bytes, report.moved_to is not None) == (len(good), True)
    got: dict[str, Any] = await reopened(tmp_path, whole.id)
    assert got == {whole.id: whole}


def ops_of(path: Path) -> list[str]:
    """The op names of every change record in the log, in order."""
    names: list[str] = []
    for line in path.read_bytes().splitlines()[1:]:
        record = log.unframe(line)
        names.extend(next(iter(op)) for op in record.get("ops", ()))
    return names


async def test_a_progress_write_is_a_patch_of_what_changed_not_the_checkpoint_again(
    tmp_path: Path,
) -> None:
    """A running job holding a 64 KiB checkpoint reports progress, then is asked to cancel:
    each is a patch of a few hundred bytes, and the job read back after a reopen, and after
    a compaction, is the job the full transitions make."""
    store = WalStore(tmp_path, clock=FakeClock(NOW), fs=NoSyncFiles())
    await store.open()
    job = Job.new(kind="sleep", args={}, now=NOW, job_id="e" * 32)
    await store.commit([job])
    steps: list[Callable[[Job], Transition]] = [
        lambda j: j.start(NOW + 1),
        lambda j: j.touch(NOW + 2, checkpoint=check_checkpoint(BIG)),
        lambda j: j.touch(NOW + 3, progress=Progress(percent=10.0, message="10", at=NOW + 3)),
        lambda j: j.touch(NOW + 4, progress=Progress(percent=20.0, message=None, at=NOW + 4)),
        lambda j: j.request_cancel(NOW + 5),
    ]
    sizes: list[int] = []
    for step in steps:
        t = step(job)
        job = job.apply(t)
        before = store.log_bytes()
        await store.commit([t])
        sizes.append(store.log_bytes() - before)
        assert await store.get(job.id) == job
    await store.close()
    assert ops_of(log_path(tmp_path)) == ["put", "set", "set", "patch", "patch", "patch"]
    assert sizes[1] > MAX_CHECKPOINT_BYTES  # the checkpoint, once
    assert max(sizes[2:]) < 400  # then only what changed
    assert (job.progress, job.cancel_requested_at) == (
        Progress(percent=20.0, message=None, at=NOW + 4), NOW + 5,
    )  # fmt: skip
    assert await reopened(tmp_path, job.id) == {job.id: job}

    store = WalStore(tmp_path, clock=FakeClock(NOW + 100), fs=NoSyncFiles())
    await store.open()
    await store.compact()
    await store.close()
    assert ops_of(log_path(tmp_path)) == []  # the snapshot holds it
    assert await reopened(tmp_path, job.id) == {job.id: job}


async def test_a_patch_made_stale_in_its_batch_is_written_whole(tmp_path: Path) -> None:
    """Two calls in one batch: a new checkpoint, then a progress change built from the job
    before it (a writer that did not wait). Against the committed job the second is a
    patch; against the job as staged before it, it would put the old checkpoint back, so it
    is written whole: what recovery folds is what the store served."""
    store = WalStore(tmp_path, clock=FakeClock(NOW), fs=NoSyncFiles())
    await store.open()
    job = Job.new(kind="sleep", args={}, now=NOW, job_id="d" * 32)
    t = job.start(NOW + 1)
    job = job.apply(t)
    await store.commit([job])
    await store.commit([t])
    saved = job.touch(NOW + 2, checkpoint={"page": 2})
    stale = job.touch(NOW + 3, progress=Progress(percent=50.0, message=None, at=NOW + 3))
    first, second = store.commit([saved]), store.commit([stale])  # one batch
    await first
    await second
    served = await store.get(job.id)
    assert served == job.apply(saved).apply(stale)
    assert served is not None
    assert served.checkpoint is None  # the whole transition's
    await store.close()
    assert ops_of(log_path(tmp_path))[-2:] == ["set", "set"]
    assert await reopened(tmp_path, job.id) == {job.id: served}


def test_a_patch_is_refused_at_recovery_on_a_job_that_does_not_run() -> None:
    """A patch never starts an attempt: on a scheduled job it does not fold."""
    job = Job.new(kind="sleep", args={}, now=NOW, job_id="c" * 32)
    patch = log.Patch(job_id=job.id, expect_epoch=0, updated_at=NOW)
    with pytest.raises(ValueError, match="scheduled"):
        patch.transition(job)
