"""What the clients say to a server, apart from the saying: the errors an answer can be,
``Call`` (one request, and the type its answer is read as) and ``Requests``, every
request method of ``Client`` and ``AsyncClient`` written once, as a plan: the jobs,
queues and schedules of an operator or a submitter, and the pull protocol a remote
worker speaks (``claim``, ``heartbeat``, the outcomes; ``sqlq.common.protocol``).

A plan is a generator that yields each ``Call`` it makes and is sent back its answer,
and returns what the method returns. It does no I/O of its own, so one plan serves
both clients: ``sqlq.client`` runs it with blocking sends or with awaited ones.
"""

from __future__ import annotations

import builtins
import email.utils
import time
import uuid
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
import msgspec

from sqlq.common.errors import ApiError as ApiError  # (re-exported: the client's errors)
from sqlq.common.errors import RateLimited as RateLimited
from sqlq.common.fair import KeyPolicy, Policy
from sqlq.common.models import TERMINAL
from sqlq.common.protocol import (
    DEFAULT_LEASE_S,
    FENCED,
    Beat,
    BeatItem,
    CheckpointBody,
    ClaimAnswer,
    ClaimRequest,
    CompleteBody,
    FailBody,
    Granted,
    HeartbeatAnswer,
    HeartbeatRequest,
    Outcome,
    OutcomesAnswer,
    ParentsBody,
    ParentsPage,
    ReleaseBody,
    Reported,
    SnoozeBody,
    WorkerList,
    WorkerView,
)
from sqlq.common.wire import (
    MAX_WAIT_S,
    BatchResult,
    CancelCounts,
    JobPage,
    QueueList,
    QueueView,
    Retried,
    ScheduleList,
    ScheduleView,
    WorkflowView,
)
from sqlq.common.wire import JobView as Job  # the client's job: as the API shows it

T = TypeVar("T")


class Invalid(ApiError):
    """The request was wrong (400, 413, 415, 422); ``field`` names what."""


class Unauthorized(ApiError):
    """No token, a wrong one, or a request the server refuses on principle (401, 403, 421)."""


class NotFound(ApiError):
    """No such job or schedule (404)."""


class Conflict(ApiError):
    """The job is not in a state that allows it, or a key was reused (409)."""


class FencedError(Conflict):
    """A heartbeat's or an outcome's token is stale (409 ``fenced``): the job's epoch moved
    on, its lease ran out, or it was cancelled or finished. The attempt it named is no
    longer this worker's: whatever it did is not recorded, and it should stop."""


class Unavailable(ApiError):
    """The server is not ready, its store failed (503), or it could not be reached."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: Invalid,
    413: Invalid,
    415: Invalid,
    422: Invalid,
    401: Unauthorized,
    403: Unauthorized,
    421: Unauthorized,
    404: NotFound,
    409: Conflict,
    429: RateLimited,
}


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    """One request, and the type its answer is read as."""

    method: str
    path: str
    into: type[T]
    json: Any = None
    params: Mapping[str, Any] | None = None
    headers: Mapping[str, str] | None = None
    retry: bool = False  # safe to send again after a lost reply (reads, keyed submits)
    content: bytes | None = None  # a body encoded already (msgspec: the protocol's structs)
    # how long the server may hold the answer on purpose (a long poll): the clients add it
    # to their read timeout, so a timeout shorter than the wait asked for never cuts it
    wait_s: float = 0.0

    def __iter__(self) -> Generator[Call[T], T, T]:
        """``answer = yield from call`` in a plan: the client sends it and hands back
        the answer, typed."""
        return (yield self)

    def sent(self) -> dict[str, Any]:
        """What httpx sends: the body as JSON, or as the bytes the plan encoded."""
        if self.content is None:
            return {"json": self.json, "params": self.params, "headers": self.headers}
        return {"content": self.content, "params": self.params,
                "headers": {**(self.headers or {}), **_JSON}}  # fmt: skip

    def answer(self, response: httpx.Response) -> T:
        """The response read as ``into``, or the server's error as an exception."""
        return self.read(response.status_code, response.content, response.headers.get)

    def read(self, status: int, content: bytes, header: Callable[[str], str | None]) -> T:
        """An answer (its status, its body, its headers by lowercase name) read as
        ``into``, or the server's error as an exception."""
        if status < 400:
            return msgspec.json.decode(content, type=self.into)
        try:
            body = msgspec.json.decode(content)
        except msgspec.DecodeError:
            body = None
        if not isinstance(body, dict):
            body = {"error": "http", "message": content[:800].decode(errors="replace")[:200]}
        cls = _BY_STATUS.get(status, Unavailable)
        if cls is Conflict and body.get("error") == FENCED:
            cls = FencedError
        code, message, field = body.get("error", "?"), body.get("message", ""), body.get("field")
        if cls is RateLimited:
            raise RateLimited(retry_after_s(header("retry-after")), message, status=status,
                              code=code, field=field)  # fmt: skip
        raise cls(status, code, message, field)


def retry_after_s(value: str | None) -> float:
    """A Retry-After header in seconds: sqlq sends a number, but a proxy in between may
    send an HTTP date (RFC 9110), or nothing; either is read, never raised on."""
    if value is None:
        return 1.0
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return 1.0
    if seconds != seconds:  # NaN
        return 1.0
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


Plan = Generator[Call[Any], Any, T]
MAX_RETRY_AFTER_S = 3600.0  # the longest wait a Retry-After is taken at
_JSON = {"Content-Type": "application/json"}
_encode = msgspec.json.Encoder().encode


def _key() -> str:
    return uuid.uuid4().hex


def _get(job_id: str, wait: float = 0.0) -> Call[Job]:
    params = {"wait": f"{wait:.3f}"} if wait > 0 else None
    return Call("GET", f"/jobs/{job_id}", Job, params=params, retry=True, wait_s=wait)


class Requests:
    """Every request method of both clients, once, as a ``Plan``."""

    @staticmethod
    def submit(
        kind: str,
        args: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> Plan[Job]:
        """Submit one job; ``options``: delay_ms, run_at, max_attempts, priority, queue."""
        body: dict[str, Any] = {"kind": kind, "args": dict(args or {})}
        body.update({k: v for k, v in options.items() if v is not None})
        headers = {"Idempotency-Key": idempotency_key or _key()}
        return (yield from Call("POST", "/jobs", Job, body, headers=headers, retry=True))

    @staticmethod
    def submit_many(jobs: builtins.list[Mapping[str, Any]]) -> Plan[builtins.list[str]]:
        """Submit many jobs (dicts shaped like ``POST /jobs`` bodies) atomically; their ids."""
        keyed = [{**job, "idempotency_key": job.get("idempotency_key") or _key()} for job in jobs]
        done = yield from Call("POST", "/jobs/batch", BatchResult, {"jobs": keyed}, retry=True)
        return done.ids

    @staticmethod
    def get(job_id: str) -> Plan[Job]:
        return (yield from _get(job_id))

    @staticmethod
    def wait(job_id: str, within: float = 60.0) -> Plan[Job]:
        """The job once finished, or as it stands after ``within`` seconds."""
        deadline = time.monotonic() + within
        while True:
            left = deadline - time.monotonic()
            job = yield from _get(job_id, min(MAX_WAIT_S, max(0.0, left)))  # the server's bound
            if job.state in TERMINAL or left <= 0:
                return job

    @staticmethod
    def list(
        *,
        state: str | None = None,
        kind: str | None = None,
        queue: str | None = None,
        schedule: str | None = None,
        limit: int = 100,
        after: str | None = None,
        order: str | None = None,
    ) -> Plan[JobPage]:
        """One page of jobs in id order; pass ``page.next`` as ``after`` for the next.
        ``schedule``: only the jobs that schedule made. ``order``: ``"asc"`` (oldest first,
        the server's default) or ``"desc"`` (newest first)."""
        params = {"state": state, "kind": kind, "queue": queue, "schedule": schedule,
                  "limit": limit, "after": after, "order": order}  # fmt: skip
        query = {k: v for k, v in params.items() if v is not None}
        return (yield from Call("GET", "/jobs", JobPage, params=query, retry=True))

    @staticmethod
    def cancel(job_id: str, force: bool = False) -> Plan[Job]:
        """Cancel a job. One that had not started comes back ``cancelled``; a running one
        comes back ``running`` with ``cancel_requested`` set: its handler is told, and the
        job ends cancelled when it stops (completed, if it finishes first). ``force``: the
        server also cuts the attempt off after its ``--cancel-grace``. A finished job is
        ``Conflict``."""
        params = {"force": "1"} if force else None
        return (yield from Call("DELETE", f"/jobs/{job_id}", Job, params=params))

    @staticmethod
    def cancel_matching(
        *, state: str | None = None, kind: str | None = None, queue: str | None = None
    ) -> Plan[tuple[int, int]]:
        """Cancel every live job that matches (no filter: every live one); ``state``:
        scheduled or running. Returns (cancelled, requested): how many were cancelled
        before they ran, and how many running ones were asked to stop."""
        filters = {"state": state, "kind": kind, "queue": queue}
        body = {k: v for k, v in filters.items() if v is not None}  # "" is refused, not "any"
        done = yield from Call("POST", "/jobs/cancel", CancelCounts, body)
        return done.cancelled, done.requested

    @staticmethod
    def retry(job_id: str) -> Plan[Job]:
        """Put a dead or cancelled job back, with a fresh attempt budget."""
        return (yield from Call("POST", f"/jobs/{job_id}/retry", Job))

    @staticmethod
    def retry_all(
        *, state: str = "dead", kind: str | None = None, queue: str | None = None
    ) -> Plan[int]:
        body = {k: v for k, v in {"state": state, "kind": kind, "queue": queue}.items() if v}
        return (yield from Call("POST", "/jobs/retry", Retried, body)).retried

    @staticmethod
    def submit_workflow(
        jobs: Sequence[Mapping[str, Any]], workflow: str | None = None
    ) -> Plan[BatchResult]:
        """Submit a new workflow: ``jobs`` shaped like ``POST /jobs/batch``'s, with their
        ``ref``, ``depends_on`` and policies, in one atomic batch; or, given a
        ``workflow``'s id, add them to it (``depends_on`` naming its members' ids too).
        Not retried: a workflow's jobs take no idempotency key yet, so a second try could
        make them twice."""
        return (yield from Call("POST", "/jobs/batch", BatchResult,
                                {"workflow": True if workflow is None else workflow,
                                 "jobs": list(jobs)}))  # fmt: skip

    @staticmethod
    def workflow(
        workflow_id: str, *, after: str | None = None, limit: int | None = None
    ) -> Plan[WorkflowView]:
        """A workflow: its state and its members' counts by state, and a page of its members
        (up to ``limit``, after the page whose ``next`` is ``after``)."""
        query = {k: v for k, v in (("after", after), ("limit", limit)) if v is not None}
        return (yield from Call("GET", f"/workflows/{workflow_id}", WorkflowView,
                                params=query or None, retry=True))  # fmt: skip

    @staticmethod
    def cancel_workflow(workflow_id: str) -> Plan[CancelCounts]:
        """Cancel a workflow's members that have not started; ask its running ones to stop."""
        return (yield from Call("POST", f"/workflows/{workflow_id}/cancel", CancelCounts,
                                retry=True))  # fmt: skip

    @staticmethod
    def retry_workflow(workflow_id: str) -> Plan[int]:
        """Revive a workflow's dead members (with what their deaths cancelled): how many."""
        done = yield from Call("POST", f"/workflows/{workflow_id}/retry", Retried)
        return done.retried

    @staticmethod
    def queues() -> Plan[builtins.list[QueueView]]:
        return (yield from Call("GET", "/queues", QueueList, retry=True)).queues

    @staticmethod
    def pause(queue: str, paused: bool = True) -> Plan[QueueView]:
        action = "pause" if paused else "resume"
        return (yield from Call("POST", f"/queues/{queue}/{action}", QueueView, retry=True))

    @staticmethod
    def set_policy(queue: str, policy: Policy | Mapping[str, Any] | None) -> Plan[QueueView]:
        """``queue``'s policy, whole (``sqlq.common.fair``: a ``Policy``, or the dict ``PUT
        /queues/{queue}`` takes; None: none)."""
        body = {} if policy is None else msgspec.to_builtins(policy)
        return (yield from Call("PUT", f"/queues/{queue}", QueueView, body, retry=True))

    @staticmethod
    def set_key_policy(
        queue: str, key: str, override: KeyPolicy | Mapping[str, Any] | None
    ) -> Plan[QueueView]:
        """One key's override of ``queue``'s per-key limits (None: drop it)."""
        path = f"/queues/{queue}/keys/{quote(key, safe='')}"
        if override is None:
            return (yield from Call("DELETE", path, QueueView, retry=True))
        body = msgspec.to_builtins(override)
        return (yield from Call("PUT", path, QueueView, body, retry=True))

    @staticmethod
    def stats() -> Plan[dict[str, Any]]:
        return (yield from Call("GET", "/stats", dict, retry=True))

    # -- schedules --------------------------------------------------------------------

    @staticmethod
    def put_schedule(
        name: str,
        kind: str,
        args: Mapping[str, Any] | None = None,
        *,
        cron: str | None = None,
        every_s: int | None = None,
        **options: Any,
    ) -> Plan[ScheduleView]:
        """Create or replace the schedule ``name``: one job of ``kind`` per tick of ``cron``
        (5 fields) or every ``every_s`` seconds; ``options``: tz, queue, priority,
        max_attempts, catch_up, catch_up_window_s, max_catch_up, overlap, paused."""
        body: dict[str, Any] = {"kind": kind, "args": dict(args or {}), "cron": cron,
                                "every_s": every_s, **options}  # fmt: skip
        body = {k: v for k, v in body.items() if v is not None}
        return (yield from Call("PUT", _schedule(name), ScheduleView, body, retry=True))

    @staticmethod
    def schedules() -> Plan[builtins.list[ScheduleView]]:
        """Every schedule, in name order."""
        return (yield from Call("GET", "/schedules", ScheduleList, retry=True)).schedules

    @staticmethod
    def schedule(name: str) -> Plan[ScheduleView]:
        """One schedule (``NotFound`` if there is none)."""
        return (yield from Call("GET", _schedule(name), ScheduleView, retry=True))

    @staticmethod
    def delete_schedule(name: str) -> Plan[ScheduleView]:
        """Delete a schedule (its jobs stay); what it was."""
        return (yield from Call("DELETE", _schedule(name), ScheduleView))

    @staticmethod
    def pause_schedule(name: str, paused: bool = True) -> Plan[ScheduleView]:
        """Pause a schedule (or, ``paused=False``, resume it): durable, on every node."""
        action = "pause" if paused else "resume"
        return (yield from Call("POST", f"{_schedule(name)}/{action}", ScheduleView, retry=True))

    @staticmethod
    def trigger(name: str) -> Plan[Job]:
        """Enqueue one job of the schedule now, outside its ticks (not retried: each call
        makes a job)."""
        return (yield from Call("POST", f"{_schedule(name)}/trigger", Job))

    # -- the pull protocol: a remote worker's requests ----------------------------------

    @staticmethod
    def claim(
        queues: Sequence[str],
        *,
        worker: str,
        kinds: Sequence[str] | None = None,
        max: int = 1,
        wait_s: float = 0.0,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> Plan[builtins.list[Granted]]:
        """Claim up to ``max`` (1 to 100) due jobs of ``queues`` (remote ones), of ``kinds``
        if named, each held by ``worker`` for ``lease_s`` seconds unless renewed; waits up
        to ``wait_s`` (at most 30) for the first. Empty if none came. Never sent twice: the
        claims of a lost reply are held until their lease runs out."""
        body = ClaimRequest(queues=builtins.list(queues), worker=worker,
                            kinds=None if kinds is None else builtins.list(kinds), max=max,
                            wait_s=wait_s, lease_s=lease_s)  # fmt: skip
        claimed = yield from Call("POST", "/claims", ClaimAnswer, content=_encode(body),
                                  wait_s=wait_s)  # fmt: skip
        return claimed.claims

    @staticmethod
    def report_and_claim(
        outcomes: Sequence[Outcome | msgspec.Raw],
        queues: Sequence[str],
        *,
        worker: str,
        kinds: Sequence[str] | None = None,
        max: int = 1,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> Plan[ClaimAnswer]:
        """``outcomes`` (as ``outcomes`` takes them) and a claim of up to ``max`` more jobs,
        in one call: the outcomes are written beside the claim and answered in
        ``.outcomes``, in order (``unavailable``: report it again); the claim does not
        wait (``.claims`` may be empty). Never sent twice, as a
        claim: after a lost reply, send the outcomes again (a landed one is fenced)."""
        body = ClaimRequest(queues=builtins.list(queues), worker=worker,
                            kinds=None if kinds is None else builtins.list(kinds), max=max,
                            lease_s=lease_s)  # fmt: skip
        fields = {**msgspec.structs.asdict(body), "outcomes": builtins.list(outcomes)}
        return (yield from Call("POST", "/claims", ClaimAnswer, content=_encode(fields)))

    @staticmethod
    def heartbeat(items: Sequence[str | BeatItem]) -> Plan[builtins.list[Beat]]:
        """Renew the lease of every token (or ``BeatItem``, with progress) in one call; one
        ``Beat`` each, in order: ``lease_until`` and ``cancel_requested``, or ``error``
        ``fenced`` (that attempt is no longer the caller's: stop it)."""
        beats = [BeatItem(token=i) if isinstance(i, str) else i for i in items]
        body = _encode(HeartbeatRequest(items=beats))
        done = yield from Call("POST", "/claims/heartbeat", HeartbeatAnswer, content=body,
                               retry=True)  # fmt: skip
        return done.items

    @staticmethod
    def complete(
        token: str, result: Any = None, spawn: Sequence[Any] | None = None
    ) -> Plan[Reported]:
        """The claimed attempt succeeded with ``result`` (and ``spawn``: with these jobs
        added to its workflow in its commit, ``sqlq.spawn``). ``FencedError`` (409) if the
        token is stale; sent again after a lost reply, when a stale answer may mean it
        landed."""
        body = CompleteBody(token=token, result=result, spawn=None if spawn is None else [*spawn])
        return (yield from _report("complete", body))

    @staticmethod
    def fail(
        token: str, error: str = "failed", *, retry: bool = True, retry_in_s: float | None = None
    ) -> Plan[Reported]:
        """The claimed attempt failed with ``error``: retried by the server's policy (after
        ``retry_in_s`` instead of its backoff, if given), or dead at once with
        ``retry=False``. ``FencedError`` if the token is stale."""
        body = FailBody(token=token, error=error, retry=retry, retry_in_s=retry_in_s)
        return (yield from _report("fail", body))

    @staticmethod
    def snooze(token: str, delay_s: float) -> Plan[Reported]:
        """Run the claimed job again after ``delay_s``, this attempt not counted."""
        return (yield from _report("snooze", SnoozeBody(token=token, delay_s=delay_s)))

    @staticmethod
    def checkpoint(token: str, data: Any) -> Plan[Reported]:
        """Save ``data`` durably for the claimed job's next attempt; it stays running."""
        return (yield from _report("checkpoint", CheckpointBody(token=token, data=data)))

    @staticmethod
    def parents(token: str, start: int = 0) -> Plan[ParentsPage]:
        """A page of the claimed job's parents from the ``start``-th: their states, results
        and errors (a workflow member's ``ctx.parents``). ``FencedError`` if the token is
        stale."""
        body = _encode(ParentsBody(token=token, start=start))
        return (yield from Call("POST", "/claims/parents", ParentsPage, content=body,
                                retry=True))  # fmt: skip

    @staticmethod
    def release(token: str) -> Plan[Reported]:
        """Give the claimed job back unstarted: due now, no attempt counted."""
        return (yield from _report("release", ReleaseBody(token=token)))

    @staticmethod
    def outcomes(items: Sequence[Outcome | msgspec.Raw]) -> Plan[builtins.list[Reported]]:
        """Report many outcomes in one call (``Outcome``s, or items encoded already as
        ``msgspec.Raw``): one ``Reported`` each, in order, a stale one with ``error``
        ``fenced`` (a value, not an exception: the others stand)."""
        body = _encode({"outcomes": items})
        done = yield from Call("POST", "/claims/outcomes", OutcomesAnswer, content=body,
                               retry=True)  # fmt: skip
        return done.outcomes

    @staticmethod
    def workers() -> Plan[builtins.list[WorkerView]]:
        """The remote workers the server has seen lately."""
        return (yield from Call("GET", "/workers", WorkerList, retry=True)).workers


def _report(what: str, body: msgspec.Struct) -> Plan[Reported]:
    """A single outcome: 200 ``Reported``, or 409 ``FencedError``. Sent again after a lost
    reply (the fence makes a second landing impossible)."""
    return (yield from Call("POST", f"/claims/{what}", Reported, content=_encode(body),
                            retry=True))  # fmt: skip


def _schedule(name: str) -> str:
    return "/schedules/" + quote(name, safe="")  # a name with a slash is refused, not routed


def pages(filters: Mapping[str, Any], page: JobPage | None = None) -> Plan[JobPage] | None:
    """What ``jobs`` asks for after ``page`` (at first, ``None``); ``None`` after the last."""
    if page is not None and page.next is None:
        return None
    return Requests.list(after=None if page is None else page.next, limit=1000, **filters)
