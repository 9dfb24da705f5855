"""``GET /openapi.json``: the API described by the same msgspec types that validate it.

Requests are the structs the handlers decode (``JobSpec``, ``BatchSpec``,
``RetrySpec``, ``CancelSpec``, ``ScheduleSpec``, and the pull protocol's
``ClaimRequest``, ``HeartbeatRequest``, the single outcomes' ``*Body`` and
``OutcomesRequest`` from ``common.protocol``); responses are the wire types of
``common.wire`` and ``common.protocol`` (a job is ``JobView``: what is stored of it,
less the request hash, with every attempt it made, its cancel, progress, errors,
schedule, tick, holder and lease). msgspec writes their JSON Schema (2020-12, what
OpenAPI 3.1 uses); this module only lays out the operations. Nothing about a field is
written twice; each operation's description names the roles that may call it, read
from ``sqlq.http.access.RULES``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from sqlq.common.fair import FAIR_KEY_PATTERN, KeyPolicy, Policy
from sqlq.common.protocol import (
    CheckpointBody,
    ClaimAnswer,
    ClaimRequest,
    CompleteBody,
    FailBody,
    HeartbeatAnswer,
    HeartbeatRequest,
    OutcomesAnswer,
    OutcomesRequest,
    ParentsBody,
    ParentsPage,
    ReleaseBody,
    Reported,
    SnoozeBody,
    WorkerList,
)
from sqlq.common.query import ORDERS
from sqlq.common.roles import Role
from sqlq.common.schedule import NAME_PATTERN, ScheduleSpec
from sqlq.common.specs import (
    KEY_PATTERN,
    QUEUE_PATTERN,
    BatchSpec,
    CancelSpec,
    JobSpec,
    RetrySpec,
)
from sqlq.common.store import MAX_PAGE
from sqlq.common.wire import (
    MAX_WAIT_S,
    BatchResult,
    CancelCounts,
    ErrorBody,
    Health,
    JobPage,
    JobView,
    QueueList,
    QueueView,
    Ready,
    Retried,
    ScheduleList,
    ScheduleView,
    WorkflowView,
)
from sqlq.http.access import OPEN, RULES

ERRORS = (400, 401, 403, 404, 409, 413, 415, 421, 422, 429, 503)


@dataclass(frozen=True)
class Param:
    name: str
    where: str  # "query", "path", "header"
    schema: dict[str, Any]
    description: str = ""
    required: bool = False


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    summary: str
    ok: dict[int, type | None]  # success statuses and their body (None: free-form JSON)
    body: type | None = None
    params: tuple[Param, ...] = ()
    errors: tuple[int, ...] = ERRORS
    text: bool = False  # the success body is text/plain (metrics)
    tags: tuple[str, ...] = field(default=())


JOB_ID = Param("job_id", "path", {"type": "string"}, "a job id", True)
SCHEDULE = Param("name", "path", {"type": "string", "pattern": NAME_PATTERN}, "a schedule", True)
QUEUE = Param("queue", "path", {"type": "string", "pattern": QUEUE_PATTERN}, "a queue", True)
WORKFLOW_ID = Param("workflow_id", "path", {"type": "string"}, "a workflow's id", True)
FAIR_KEY = Param("key", "path", {"type": "string", "pattern": FAIR_KEY_PATTERN}, "a key", True)
STATES = ["scheduled", "running", "completed", "dead", "cancelled", "waiting"]
OPS = (
    Operation(
        "post",
        "/jobs",
        "Submit one job; 201 when made, 200 when a key returned it",
        {201: JobView, 200: JobView},
        JobSpec,
        (
            Param(
                "Idempotency-Key",
                "header",
                {"type": "string", "pattern": KEY_PATTERN},
                "the same key and request return the original job",
            ),
        ),
    ),
    Operation(
        "get",
        "/jobs",
        "List jobs in id order (oldest or newest first), a page at a time",
        {200: JobPage},
        params=(
            Param("state", "query", {"type": "string", "enum": STATES}),
            Param("kind", "query", {"type": "string", "minLength": 1, "maxLength": 128}),
            Param("queue", "query", {"type": "string", "pattern": QUEUE_PATTERN}),
            Param(
                "schedule",
                "query",
                {"type": "string", "pattern": NAME_PATTERN},
                "the jobs this schedule made",
            ),
            Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE}),
            Param("after", "query", {"type": "string"}, "the `next` of the previous page"),
            Param(
                "order",
                "query",
                {"type": "string", "enum": list(ORDERS), "default": "asc"},
                "asc: oldest first; desc: newest first (pass the same with `after`)",
            ),
        ),
    ),
    Operation(
        "post",
        "/jobs/batch",
        "Submit many jobs in one atomic, durable commit",
        {201: BatchResult, 200: BatchResult},
        BatchSpec,
    ),
    Operation(
        "post",
        "/jobs/retry",
        "Retry every dead (or cancelled) job that matches",
        {200: Retried},
        RetrySpec,
    ),
    Operation(
        "post",
        "/jobs/cancel",
        "Cancel every live job that matches ({} is all): scheduled ones are cancelled, "
        "running ones asked to stop",
        {200: CancelCounts},
        CancelSpec,
    ),
    Operation(
        "get",
        "/jobs/{job_id}",
        "A job; with ?wait=S, once it finishes or S seconds pass",
        {200: JobView},
        params=(
            JOB_ID,
            Param("wait", "query", {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S}),
        ),
    ),
    Operation(
        "delete",
        "/jobs/{job_id}",
        "Cancel a job: 200 cancelled before it ran; 202 running, its cancel asked for "
        "(force: cut off after the server's --cancel-grace); 409 finished",
        {200: JobView, 202: JobView},
        params=(
            JOB_ID,
            Param(
                "force",
                "query",
                {"type": "string", "enum": ["1", "true", "0", "false"]},
                "a running job: also cut its attempt off after the grace, as a timeout does",
            ),
        ),
    ),
    Operation(
        "post",
        "/jobs/{job_id}/retry",
        "Retry a dead or cancelled job",
        {200: JobView},
        params=(JOB_ID,),
    ),
    Operation(
        "get", "/queues", "Each queue's depth, running count, cap and pause", {200: QueueList}
    ),
    Operation(
        "get",
        "/workflows/{workflow_id}",
        "A workflow: its state (running, completed, failed, cancelled or stuck) and its "
        "members' counts by state, over every member; and a page of its members in the order "
        "they were stored, each with its parents and what blocks it",
        {200: WorkflowView},
        params=(
            WORKFLOW_ID,
            Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE}),
            Param("after", "query", {"type": "string"}, "the `next` of the previous page"),
        ),
    ),
    Operation(
        "post",
        "/workflows/{workflow_id}/cancel",
        "Cancel every member of a workflow that has not started (their cones with them) and "
        "ask every running one to stop",
        {200: CancelCounts},
        params=(WORKFLOW_ID,),
    ),
    Operation(
        "post",
        "/workflows/{workflow_id}/retry",
        "Revive every dead member of a workflow whose parents completed, with the members "
        "its death cancelled, in one commit; a member a user cancelled stays cancelled",
        {200: Retried},
        params=(WORKFLOW_ID,),
    ),
    Operation(
        "put",
        "/queues/{queue}",
        "Set a queue's policy, whole (durable): per-key concurrency and rate, a queue-wide "
        "rate, fair claims between keys, per-key overrides; {} for none",
        {200: QueueView},
        Policy,
        (QUEUE,),
    ),
    Operation(
        "put",
        "/queues/{queue}/keys/{key}",
        "Set one key's override of its queue's per-key limits (durable)",
        {200: QueueView},
        KeyPolicy,
        (QUEUE, FAIR_KEY),
    ),
    Operation(
        "delete",
        "/queues/{queue}/keys/{key}",
        "Drop one key's override",
        {200: QueueView},
        params=(QUEUE, FAIR_KEY),
    ),
    Operation(
        "post",
        "/queues/{queue}/pause",
        "Stop starting jobs of a queue (durable)",
        {200: QueueView},
        params=(QUEUE,),
    ),
    Operation(
        "post",
        "/queues/{queue}/resume",
        "Start jobs of a queue again",
        {200: QueueView},
        params=(QUEUE,),
    ),
    Operation("get", "/schedules", "Every schedule, in name order", {200: ScheduleList}),
    Operation(
        "put",
        "/schedules/{name}",
        "Create (201) or replace (200) a schedule",
        {201: ScheduleView, 200: ScheduleView},
        ScheduleSpec,
        (SCHEDULE,),
    ),
    Operation(
        "get",
        "/schedules/{name}",
        "A schedule: its spec, next tick and newest tick's job",
        {200: ScheduleView},
        params=(SCHEDULE,),
    ),
    Operation(
        "delete",
        "/schedules/{name}",
        "Delete a schedule (its jobs stay); answers it as it was",
        {200: ScheduleView},
        params=(SCHEDULE,),
    ),
    Operation(
        "post",
        "/schedules/{name}/pause",
        "Enqueue no ticks of a schedule until it is resumed (durable)",
        {200: ScheduleView},
        params=(SCHEDULE,),
    ),
    Operation(
        "post",
        "/schedules/{name}/resume",
        "Enqueue a schedule's ticks again, from now",
        {200: ScheduleView},
        params=(SCHEDULE,),
    ),
    Operation(
        "post",
        "/schedules/{name}/trigger",
        "Enqueue one job of a schedule now, outside its ticks",
        {201: JobView},
        params=(SCHEDULE,),
    ),
    Operation(
        "post",
        "/claims",
        "Claim up to `max` due jobs of remote queues, each with a token and a lease; "
        "long-polls up to `wait_s` for the first (an empty list if none came); 409 "
        "`worker_name_taken`: another token's worker goes by `worker`",
        {200: ClaimAnswer},
        ClaimRequest,
    ),
    Operation(
        "post",
        "/claims/heartbeat",
        "Renew every lease a worker holds, with progress; each item answers its new lease "
        "and whether a cancel was asked for, or `fenced` (the job is no longer yours); "
        "each token at most once a call (422 naming the second)",
        {200: HeartbeatAnswer},
        HeartbeatRequest,
    ),
    Operation(
        "post",
        "/claims/complete",
        "A claimed job's result (409 `fenced`: stale token, never a silent success)",
        {200: Reported},
        CompleteBody,
    ),
    Operation(
        "post",
        "/claims/fail",
        "A claimed job's failed attempt: through the retry policy (`retry_in_s` instead of "
        "the backoff), or dead at once with `retry: false` (409 `fenced`: stale token)",
        {200: Reported},
        FailBody,
    ),
    Operation(
        "post",
        "/claims/snooze",
        "Put a claimed job back for `delay_s` without counting an attempt (409 `fenced`)",
        {200: Reported},
        SnoozeBody,
    ),
    Operation(
        "post",
        "/claims/checkpoint",
        "Save a claimed job's checkpoint durably; it keeps running (409 `fenced`)",
        {200: Reported},
        CheckpointBody,
    ),
    Operation(
        "post",
        "/claims/release",
        "Give a claimed job back unstarted: due now, no attempt counted (409 `fenced`)",
        {200: Reported},
        ReleaseBody,
    ),
    Operation(
        "post",
        "/claims/outcomes",
        "Many outcomes in one group commit: one answer per item, in order, each the "
        "single form's (`state`, or `error`: fenced, invalid, forbidden)",
        {200: OutcomesAnswer},
        OutcomesRequest,
    ),
    Operation(
        "post",
        "/claims/parents",
        "A page of a claimed workflow job's parents from `start`: each one's state, and "
        "its result or error; `next` is where the next page starts (409 `fenced`)",
        {200: ParentsPage},
        ParentsBody,
    ),
    Operation(
        "get",
        "/workers",
        "The remote workers seen lately: name, principal, role, last seen, jobs held, queues",
        {200: WorkerList},
    ),
    Operation(
        "get",
        "/healthz",
        "Liveness: 503 once the store has failed",
        {200: Health},
        errors=(421, 503),
    ),
    Operation(
        "get",
        "/readyz",
        "Readiness: 503 while recovering, failed, or overloaded",
        {200: Ready},
        errors=(421, 503),
    ),
    Operation("get", "/stats", "Counters, workers, lanes, store and recovery", {200: None}),
    Operation("get", "/metrics", "Prometheus text format", {200: None}, text=True),
    Operation("get", "/openapi.json", "This document", {200: None}),
)


def _body(schema: dict[str, Any], text: bool = False) -> dict[str, Any]:
    media = "text/plain" if text else "application/json"
    return {"content": {media: {"schema": schema}}}


def _who(op: Operation) -> str:
    """Which roles may call ``op`` (``sqlq.http.access.RULES``)."""
    roles = RULES[(op.method.upper(), op.path)]
    if roles is OPEN:
        return "Needs no token."
    return "Roles: " + ", ".join(r.value for r in Role if r in roles) + "."


def document(version: str) -> dict[str, Any]:
    types = sorted(
        {t for op in OPS for t in (op.body, *op.ok.values()) if t is not None} | {ErrorBody},
        key=lambda t: t.__name__,
    )
    refs, components = msgspec.json.schema_components(
        types, ref_template="#/components/schemas/{name}"
    )
    ref = dict(zip(types, refs, strict=True))
    error = _body(ref[ErrorBody])
    paths: dict[str, dict[str, Any]] = {}
    for op in OPS:
        responses: dict[str, Any] = {}
        for status, body in op.ok.items():
            schema = (
                ref[body]
                if body is not None
                else ({"type": "string"} if op.text else {"type": "object"})
            )
            responses[str(status)] = {"description": "OK", **_body(schema, op.text)}
        for status in op.errors:
            responses[str(status)] = {"description": "an error, as JSON", **error}
        spec: dict[str, Any] = {
            "summary": op.summary,
            "description": _who(op),
            "responses": responses,
        }
        if op.params:
            spec["parameters"] = [
                {
                    "name": p.name,
                    "in": p.where,
                    "required": p.required or p.where == "path",
                    "schema": p.schema,
                    **({"description": p.description} if p.description else {}),
                }
                for p in op.params
            ]
        if op.body is not None:
            spec["requestBody"] = {"required": op.body is not RetrySpec, **_body(ref[op.body])}
        paths.setdefault(op.path, {})[op.method] = spec
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sqlq",
            "version": version,
            "description": "A durable background-job queue. Bodies are JSON; errors "
            "are JSON bodies naming the field. No string of a body and no query parameter "
            "may hold NUL (`\\u0000`, 422), but for JSON values (args, a result, a "
            "checkpoint) and a worker's own words (an error, a progress message). With "
            "tokens set (--token, the admin's, and --token-file's, each with a role), "
            "every operation but the probes needs `Authorization: Bearer <token>`: 401 "
            "for an unknown one, 403 for a role that may not call it. Remote workers "
            "claim, renew and report jobs under /claims, each claim carrying a token that "
            "fences stale reports (409 fenced).",
        },
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"bearer": []}],  # a token when the server has one
    }
