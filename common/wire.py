"""The response bodies that the server writes and the client reads.

Both sides decode and encode these same msgspec structs, so a field is named
once; ``sqlq.http.openapi`` publishes their JSON Schema, and the client reads
responses with them, so neither imports the other.
"""

from __future__ import annotations

import msgspec

from sqlq.common.models import Job, State
from sqlq.common.schedule import ScheduleSpec

MAX_WAIT_S = 60  # seconds: the longest GET /jobs/{id}?wait= the server holds a request for


class ErrorBody(msgspec.Struct):
    error: str  # a stable code: invalid, bad_json, not_found, conflict, running, ...
    message: str  # for people; never more than ~200 characters of the request
    field: str | None = None  # what was wrong: a JSON path, a parameter, a header


class JobView(Job, frozen=True, kw_only=True):
    """A job as the API shows it: the stored ``Job``, and for a job a schedule made, which
    schedule and which tick (``sqlq.common.schedule.schedule_of`` its key; ``tick`` None
    for a triggered one). They are read from the key, never stored twice."""

    schedule: str | None = None
    tick: int | None = None


class JobPage(msgspec.Struct):
    jobs: list[JobView]
    next: str | None  # pass back as ?after= for the next page; null on the last one


class BatchResult(msgspec.Struct):
    ids: list[str]
    created: list[bool]  # false: an idempotency key returned an existing job


class Retried(msgspec.Struct):
    retried: int


class QueueView(msgspec.Struct):
    name: str
    depth: int
    running: int
    limit: int | None
    paused: bool


class QueueList(msgspec.Struct):
    queues: list[QueueView]


class Health(msgspec.Struct):
    status: str
    reason: str


class Ready(msgspec.Struct):
    ready: bool
    reason: str


class JobRef(msgspec.Struct):
    id: str
    state: State | None  # None: pruned past retention


class ScheduleView(msgspec.Struct):
    """A schedule as ``GET /schedules/{name}`` shows it."""

    name: str
    spec: ScheduleSpec
    next_at: float | None  # when its next tick falls (unix seconds); None while paused
    last_tick: int | None  # the newest tick a job was enqueued for; None: none yet
    last_job: JobRef | None  # that tick's job


class ScheduleList(msgspec.Struct):
    schedules: list[ScheduleView]
