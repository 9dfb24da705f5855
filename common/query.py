"""Query parameters, checked like bodies: a bad one is a 422 that names it.

The listing cursor is opaque to clients: the last id of a page, base64url
encoded, so that it can change shape later without breaking anyone who only
passes it back (with the same ``order``: the next page is what comes after it in
that order).

Every check is a ``fullmatch`` of an ASCII pattern: ``str.isdigit`` also takes
``²`` and Arabic-Indic digits (which ``int`` then refuses, or accepts), and
``re.match`` with ``$`` takes a trailing newline.

The parameters come as a plain ``Mapping[str, str]`` (one value a name; a web
framework's query multi-dict is one, and so is a dict): the kernel imports no web
framework, and a caller with repeated names decides which one it passes. Each is read
through ``_param``, which holds it to the bodies' rule for names: no NUL
(``sqlq.common.specs.no_nul``).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping

from sqlq.common.errors import ValidationError, clip
from sqlq.common.fair import FAIR_KEY_PATTERN
from sqlq.common.models import State
from sqlq.common.models import is_job_id as is_job_id  # the API asks it here, with the rest
from sqlq.common.schedule import check_name
from sqlq.common.specs import (
    KEY_PATTERN,
    MAX_KIND,
    QUEUE_PATTERN,
    RESERVED_KEY_PREFIX,
    no_nul,
    whole_number,
)
from sqlq.common.store import MAX_PAGE, JobQuery
from sqlq.common.wire import MAX_WAIT_S

LIST_PARAMS = frozenset({"state", "kind", "queue", "schedule", "limit", "after", "order"})
ORDERS = ("asc", "desc")  # a listing's ``order``: oldest first (the default), newest first
_QUEUE = re.compile(QUEUE_PATTERN)
_FAIR_KEY = re.compile(FAIR_KEY_PATTERN)
_KEY = re.compile(KEY_PATTERN)


def cursor(job_id: str) -> str:
    return base64.urlsafe_b64encode(job_id.encode()).decode().rstrip("=")


def _uncursor(value: str) -> str:
    try:
        job_id = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        job_id = ""
    if not is_job_id(job_id):
        raise ValidationError("after", "not a cursor this server gave out (pass `next` back)")
    return job_id


def _param(params: Mapping[str, str], name: str) -> str | None:
    """The parameter ``name``, None if absent; a 422 naming it if it holds a NUL."""
    raw = params.get(name)
    return None if raw is None else no_nul(name, raw)


def _int(params: Mapping[str, str], name: str, low: int, high: int, default: int) -> int:
    raw = _param(params, name)
    if raw is None:
        return default
    value = whole_number(raw)
    if value is None or not low <= value <= high:
        raise ValidationError(name, f"must be a whole number from {low} to {high}")
    return value


MEMBER_PARAMS = frozenset({"limit", "after"})


def member_page(params: Mapping[str, str]) -> tuple[str | None, int]:
    """``GET /workflows/{id}``'s page: the member it follows (``after``, a cursor this
    server gave out) and how many (``limit``, 1 to ``MAX_PAGE``, all of a page by default)."""
    unknown = sorted(set(params) - MEMBER_PARAMS)
    if unknown:
        raise ValidationError(
            clip(unknown[0], 60), f"unknown parameter; use {sorted(MEMBER_PARAMS)}"
        )
    after = _param(params, "after")
    return (None if after is None else _uncursor(after)), _int(
        params, "limit", 1, MAX_PAGE, MAX_PAGE
    )


def job_query(params: Mapping[str, str]) -> JobQuery:
    unknown = sorted(set(params) - LIST_PARAMS)
    if unknown:
        raise ValidationError(clip(unknown[0], 60), f"unknown parameter; use {sorted(LIST_PARAMS)}")
    state = _param(params, "state")
    if state is not None and state not in State.__members__.values():
        raise ValidationError("state", f"one of {', '.join(s.value for s in State)}")
    kind = _param(params, "kind")
    if kind is not None and not 1 <= len(kind) <= MAX_KIND:
        raise ValidationError("kind", f"1 to {MAX_KIND} characters")
    queue = _param(params, "queue")
    if queue is not None and not _QUEUE.fullmatch(queue):
        raise ValidationError("queue", f"must match {QUEUE_PATTERN}")
    schedule = _param(params, "schedule")
    if schedule is not None:
        check_name(schedule, "schedule")
    after = _param(params, "after")
    order = _param(params, "order")
    if order is not None and order not in ORDERS:
        raise ValidationError("order", "asc (oldest first) or desc (newest first)")
    return JobQuery(
        state=None if state is None else State(state),
        kind=kind,
        queue=queue,
        schedule=schedule,
        after=None if after is None else _uncursor(after),
        limit=_int(params, "limit", 1, MAX_PAGE, 100),
        descending=order == "desc",
    )


def wait_seconds(params: Mapping[str, str]) -> float:
    raw = _param(params, "wait")
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= MAX_WAIT_S:
        raise ValidationError("wait", f"seconds from 0 to {MAX_WAIT_S:g}")
    return value


def queue_name(name: str) -> str:
    if not _QUEUE.fullmatch(name):
        raise ValidationError("queue", f"must match {QUEUE_PATTERN}")
    return name


def fair_key(name: str) -> str:
    """A fairness key in a path (``/queues/{q}/keys/{key}``), checked as a job's is."""
    if not _FAIR_KEY.fullmatch(name):
        raise ValidationError("key", f"must match {FAIR_KEY_PATTERN}")
    return name


def idempotency_key(header: str | None) -> str | None:
    if header is None:
        return None
    if header.startswith(RESERVED_KEY_PREFIX):
        raise ValidationError(
            "Idempotency-Key", f"keys that start with {RESERVED_KEY_PREFIX!r} are the schedules'"
        )
    if not _KEY.fullmatch(header):
        raise ValidationError("Idempotency-Key", "1 to 255 printable ASCII characters, no spaces")
    return header
