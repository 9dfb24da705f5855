"""What a client may submit, decoded and type-checked by msgspec in one pass.

Errors name the offending field (``jobs[3].max_attempts``) because msgspec
reports the JSON path; kind-specific arguments are checked later by the kind.
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Any, Literal

import msgspec

from common.errors import ValidationError

MAX_BATCH = 10_000
MAX_DELAY_MS = 366 * 24 * 3600 * 1000  # a year and a day


MAX_KIND = 128
MAX_RUN_AT = 4_102_444_800.0  # 2100-01-01; the runtime also bounds it by MAX_DELAY_MS from now
QUEUE_PATTERN = r"^[A-Za-z0-9_.:-]{1,64}$"
KEY_PATTERN = r"^[\x21-\x7e]{1,255}$"  # printable ASCII, no spaces: fits a header

Queue = Annotated[str, msgspec.Meta(pattern=QUEUE_PATTERN)]
IdempotencyKey = Annotated[str, msgspec.Meta(pattern=KEY_PATTERN)]


class JobSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    kind: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_KIND)]
    args: dict[str, Any] = msgspec.field(default_factory=dict)
    delay_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_DELAY_MS)] | None = None
    run_at: Annotated[float, msgspec.Meta(ge=0, le=MAX_RUN_AT)] | None = None  # unix seconds
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=1000)] | None = None
    priority: Annotated[int, msgspec.Meta(ge=-1_000_000, le=1_000_000)] = 0  # higher first
    queue: Queue = "default"
    idempotency_key: IdempotencyKey | None = None  # in a batch; a single POST uses the header

    def request_hash(self) -> str:
        """What the client asked for, without the key: a replay hashes the same."""
        asked = (self.kind, self.args, self.delay_ms, self.run_at, self.max_attempts,
                 self.priority, self.queue)  # fmt: skip
        return hashlib.sha256(msgspec.json.encode(asked)).hexdigest()[:32]


class RetrySpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Which finished jobs ``POST /jobs/retry`` puts back: all that match."""

    state: Literal["dead", "cancelled"] = "dead"
    kind: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_KIND)] | None = None
    queue: Queue | None = None


class BatchSpec(msgspec.Struct, forbid_unknown_fields=True):
    jobs: Annotated[list[JobSpec], msgspec.Meta(min_length=1, max_length=MAX_BATCH)]


_AT = re.compile(r" - at `\$\.?([^`]*)`$")
_MISSING = re.compile(r"missing required field `([^`]*)`")


class BadJSON(ValueError):
    """The body is not JSON at all."""


def _field(message: str) -> tuple[str, str]:
    m = _AT.search(message)
    path = m.group(1) if m else ""
    missing = _MISSING.search(message)
    if missing:
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
    return (path or "body"), _AT.sub("", message)


def decode(body: bytes, spec: type[Any]) -> Any:
    try:
        return msgspec.json.decode(body, type=spec)
    except msgspec.ValidationError as exc:
        field, message = _field(str(exc))
        raise ValidationError(field, message) from None
    except msgspec.DecodeError as exc:
        raise BadJSON(f"body is not valid JSON: {exc}") from None
    except RecursionError:
        # msgspec decodes nested arrays and objects recursively; a body nested a
        # thousand levels deep is an attack or a bug, never a job.
        raise BadJSON("body is nested too deeply") from None
