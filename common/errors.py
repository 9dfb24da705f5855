"""The one error hierarchy of sqlq.

    SqlqError
    ├── ValidationError          bad input from a user; names the field
    ├── ForbiddenError           the caller's role (or a worker's queues) does not allow it
    ├── UnencodableError         a value (a handler's result) cannot be stored as JSON
    ├── QueueFullError           accepting the submission would pass --max-queued
    ├── JobNotFoundError         no job with that id
    ├── DuplicateJobError        a submission reused an existing id
    ├── DuplicateKeyError        a submission reused an idempotency key another job holds
    ├── IdempotencyConflictError the same key came with a different request
    ├── WorkerNameTaken          a worker name another principal's worker goes by
    ├── ApiError                 an error answer from a server (the client's; ``sqlq.calls``
    │   │                        has the rest: Invalid, Unauthorized, NotFound, Conflict, ...)
    │   └── RateLimited              429, retry after; a handler's too: an upstream's 429
    ├── ScheduleError            a schedule change that may not happen
    │   ├── StaleScheduleError       the schedule changed (or went) since it was read
    │   └── OverlapError             its previous tick's job is still live (overlap: skip)
    ├── TransitionError          a state change that may not happen
    │   ├── IllegalTransitionError   not in the transition table
    │   ├── StaleEpochError          the job was requeued since; the caller is fenced off
    │   └── JobRunningError          a cancel raced the job's claim, and the claim may win
    └── StoreError               the engine cannot do what was asked
        ├── StoreClosedError         used before open or after close
        ├── StoreFailedError         an I/O error made the engine refuse further writes
        ├── StoreLockedError         another process holds the data directory
        ├── StoreUnavailableError    a shared store's database is out of reach; it reconnects
        └── CorruptLogError          damage before the tail of a log; names file and offset

Engines translate ``OSError``, ``sqlite3.Error``, asyncpg's errors and JSON errors into these at
their boundary (``raise ... from exc``) so the runtime and HTTP layer only ever
see domain errors.
"""

from __future__ import annotations

# No error message echoes more of a client's input than this many characters.
ECHO_LIMIT = 200


def clip(text: str, limit: int = ECHO_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, marked when cut: for echoing client input."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


class SqlqError(Exception):
    """Root of every error sqlq raises on purpose."""


class ValidationError(SqlqError):
    """User input is wrong; ``field`` names what, ``message`` says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class ForbiddenError(SqlqError):
    """The caller is who it says, but its role does not allow this (HTTP 403)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnencodableError(SqlqError):
    """A change holds a value JSON cannot encode; only the caller that sent it fails."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class QueueFullError(SqlqError):
    """Accepting these jobs would pass the live-job limit; nothing was accepted."""

    def __init__(self, limit: int, retry_after_s: int = 1) -> None:
        super().__init__(f"the queue holds its limit of {limit} live jobs (--max-queued)")
        self.retry_after_s = retry_after_s


class JobNotFoundError(SqlqError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"no job with id {clip(job_id, 64)!r}")
        self.job_id = job_id


class DuplicateJobError(SqlqError):
    def __init__(self, job_id: str) -> None:
        super().__init__(f"a job with id {job_id!r} already exists")
        self.job_id = job_id


class DuplicateKeyError(SqlqError):
    """Another retained job holds this idempotency key (the store refuses a second)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"idempotency key {clip(key, 64)!r} belongs to another job")
        self.key = key


class IdempotencyConflictError(SqlqError):
    """A key came back with a different request than the one that made its job."""

    def __init__(self, key: str, job_id: str) -> None:
        super().__init__(
            f"idempotency key {clip(key, 64)!r} was used for job {job_id} with a different "
            "request; use a new key for a new job"
        )
        self.key = key
        self.job_id = job_id


class WorkerNameTaken(SqlqError):
    """A claim under a worker name that another principal's worker goes by (409
    ``worker_name_taken``, naming ``worker``): a name belongs to the principal first seen
    with it (``sqlq.runtime.seen``). The message does not say whose it is."""

    def __init__(self, worker: str) -> None:
        super().__init__(f"worker name {worker!r} is another token's worker's; give this "
                         "worker another name (sqlq worker --name)")  # fmt: skip
        self.worker = worker


class ScheduleError(SqlqError):
    """A change to a schedule that its stored state refuses; nothing of the call applies."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"schedule {name}: {message}")
        self.name = name


class StaleScheduleError(ScheduleError):
    """The schedule's version or cursor is not what the change expected (another node
    enqueued the tick, or someone replaced or deleted the schedule): read it again."""


class OverlapError(ScheduleError):
    """The schedule's previous job is still live, and its overlap policy is ``skip``."""


class TransitionError(SqlqError):
    """A state change was refused; the job is unchanged."""

    def __init__(self, job_id: str, message: str) -> None:
        super().__init__(f"job {job_id}: {message}")
        self.job_id = job_id


class IllegalTransitionError(TransitionError):
    pass


class StaleEpochError(TransitionError):
    pass


class JobRunningError(TransitionError):
    pass


class StoreError(SqlqError):
    pass


class StoreClosedError(StoreError):
    pass


class StoreFailedError(StoreError):
    """A write or sync failed; nothing in the failed batch was acknowledged.

    The engine stays failed until it is reopened: retrying an fsync after it
    failed can report success for data the kernel already dropped.
    """


class StoreLockedError(StoreError):
    pass


class StoreUnavailableError(StoreError):
    """A shared store's database could not be reached for this call.

    Unlike ``StoreFailedError`` the engine is not failed: a database server
    restarts, and the engine reconnects on its next call. Nothing of this call
    was acknowledged, though it may have been applied (the commit's answer was
    lost), which is why clients retry submissions with an idempotency key.
    """


class CorruptLogError(StoreError):
    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"{path}: corrupt record at byte offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class ApiError(SqlqError):
    """An error answer from the server (or no answer at all)."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(f"{status} {code}: {message}" + (f" ({field})" if field else ""))
        self.status, self.code, self.message, self.field = status, code, message, field


class RateLimited(ApiError):
    """No more for now (429); try again after ``retry_after`` seconds.

    The client raises it for a full queue's 429. A handler raises it for an upstream's:
    ``raise sqlq.RateLimited(30)``. Its job is then snoozed that long without spending an
    attempt (a snooze, so bounded by ``--max-snoozes``), and in a queue with a per-key rate
    its key's bucket moves on, so no job of that key starts before then either. Here, with
    the kernel's errors, so a server's workers catch it without importing the client."""

    def __init__(
        self,
        retry_after: float = 1.0,
        message: str = "rate limited",
        *,
        status: int = 429,
        code: str = "rate_limited",
        field: str | None = None,
    ) -> None:
        super().__init__(status, code, message, field)
        self.retry_after = float(retry_after)
