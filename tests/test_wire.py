"""``JobView``, the job as the API shows it: ``job_view`` passes its fields by position,
so each is held here to the job's own, and no stored field is shown or dropped unseen."""

from __future__ import annotations

import msgspec

from sqlq.common.models import Job, State
from sqlq.common.running import AttemptError, Progress
from sqlq.common.wire import JobView, job_view

# What the view adds, and what of the store it leaves out on purpose.
ADDED = {"cancel_requested", "schedule", "tick"}
LEFT_OUT = {"request_hash"}  # idempotency's own detail


def _busy() -> Job:
    """A job with every field set to something other than its default."""
    return Job(
        id="a" * 32, kind="k", args={"x": 1}, state=State.RUNNING, attempts=2, max_attempts=7,
        ready_at=10.0, priority=3, epoch=4, created_at=1.0, updated_at=12.0, last_error="bad",
        result=[1], started_at=11.0, queue="q", idempotency_key="sched:nightly:1700000000",
        request_hash="h", attempts_total=5, cancel_requested_at=11.5,
        progress=Progress(percent=50.0, message="half", at=11.2), checkpoint={"page": 9},
        snoozes=6, errors=(AttemptError(attempt=1, error="e", at=9.0),),
    )  # fmt: skip


def test_the_view_shows_every_stored_field_but_the_request_hash() -> None:
    shown = {f.name for f in msgspec.structs.fields(JobView)}
    stored = {f.name for f in msgspec.structs.fields(Job)}
    assert shown - ADDED == stored - LEFT_OUT


def test_each_field_is_the_jobs_own() -> None:
    job = _busy()
    view = job_view(job)
    for name in {f.name for f in msgspec.structs.fields(JobView)} - ADDED - {"attempts_total"}:
        assert getattr(view, name) == getattr(job, name), name
    assert view.attempts_total == job.all_attempts == 7  # every attempt, not those before
    assert (view.cancel_requested, view.schedule, view.tick) == (True, "nightly", 1700000000)
    plain = job_view(msgspec.structs.replace(job, cancel_requested_at=None, idempotency_key="k"))
    assert (plain.cancel_requested, plain.schedule, plain.tick) == (False, None, None)


def test_its_json_reads_back_and_leaves_the_hash_out() -> None:
    body = msgspec.json.encode(job_view(_busy()))
    raw = msgspec.json.decode(body)
    assert "request_hash" not in raw
    assert raw["progress"] == {"percent": 50.0, "message": "half", "at": 11.2}
    assert raw["errors"] == [{"attempt": 1, "error": "e", "at": 9.0}]
    assert msgspec.json.decode(body, type=JobView) == job_view(_busy())
    # An older server's job (none of the new fields) still reads, with the defaults.
    old = {"id": "b" * 32, "kind": "k", "args": {}, "ready_at": 1.0, "created_at": 1.0,
           "updated_at": 1.0, "request_hash": "h"}  # fmt: skip
    read = msgspec.convert(old, JobView)
    assert (read.cancel_requested, read.progress, read.errors, read.snoozes) == (False, None, (), 0)
