"""What a client may submit, decoded and type-checked by msgspec in one pass.

Errors name the offending field (``jobs[3].max_attempts``) because msgspec
reports the JSON path; kind-specific arguments are checked later by the kind.
A job's args are also held to ``sqlq.common.shape`` (depth and items) here, so no
stored job is one that a deeper stack cannot read back.

A batch is decoded in two steps: its jobs with their args left as raw JSON
(``msgspec.Raw``, no objects made), then each job's args on its own, counted
against ``MAX_BATCH_ITEMS`` as they come. A batch of small containers is then
refused after at most that many items are made, not after the whole body is
(a 15 MiB batch of them was 337 MB of objects and 2 s of the event loop).

**No NUL in a name.** Every string field of every body (a kind, a queue, a worker's
name, a token, a key, a schedule's cron or zone ...) and every query parameter
(``sqlq.common.query``) is refused with a 422 naming it if it holds a NUL: PostgreSQL's
text cannot hold one, and a name that one engine takes and another cannot is no name.
``decode`` holds every body to it, so no route can forget it. Two kinds of string are
not names and keep theirs: JSON values (a job's args, a result, a checkpoint: every
engine stores them as JSON text, where a NUL is the escape ``\u0000``), and free text a
worker reports (a failure's error, a progress message), marked ``CLEANED`` and cleaned
instead (``sqlq.common.running.clean_error``: a handler's exception text is never a
reason to refuse the report of its failure). A body with no ``\u0000`` in its bytes (a
raw NUL is no JSON) holds no NUL, so the rule costs the others one scan of the bytes.
"""

from __future__ import annotations

import hashlib
import re
from typing import Annotated, Any, Literal

import msgspec
import msgspec.inspect as mi

from sqlq.common.errors import ValidationError
from sqlq.common.fair import FairKey, Weight
from sqlq.common.models import DEFAULT_QUEUE, JOB_ID_LENGTH
from sqlq.common.shape import MAX_DEPTH, MAX_ITEMS, ShapeError, bound, measure, surely_within
from sqlq.common.workflow import MAX_PARENTS, MAX_REF, OnParentFailure, RunIf

MAX_BATCH = 10_000
MAX_JOB_BYTES = 1 << 20  # one job's JSON: the body of POST /jobs, the args of a batch's job
# Items (see sqlq.common.shape) in all of a batch's args together: a batch of typical jobs
# (a few to a few dozen items each) fits; decoding and checking this many costs the
# event loop ~30 ms at most (measured: ~150 ns an item for msgspec and the walk).
MAX_BATCH_ITEMS = 4 * MAX_ITEMS
MAX_DELAY_MS = 366 * 24 * 3600 * 1000  # a year and a day


MAX_KIND = 128
MAX_RUN_AT = 4_102_444_800.0  # 2100-01-01; the runtime also bounds it by MAX_DELAY_MS from now
# Anchored at both ends of the whole string. msgspec checks a pattern with ``re.search``,
# and in Python ``$`` also matches before a final newline (``default\n`` would be a
# queue apart from ``default`` that prints the same); ``(?!\n)`` refuses that. The same
# text is a valid ECMA-262 pattern, where ``$`` is already the end, for /openapi.json.
QUEUE_PATTERN = r"^[A-Za-z0-9_.:-]{1,64}$(?!\n)"
# Keys that start with this are the schedules' own (``sched:<name>:<tick>``): a client's
# may not, or a submission could take a tick's key before the tick does and pass for the
# schedule's job. It is ``sqlq.common.schedule.KEY_PREFIX``; that module imports this one,
# so it is spelled here too, and tests/test_schedules_http.py keeps the two equal.
RESERVED_KEY_PREFIX = "sched:"
# Printable ASCII, no spaces (fits a header), and not a schedule's key.
KEY_PATTERN = rf"^(?!{RESERVED_KEY_PREFIX})[\x21-\x7e]{{1,255}}$(?!\n)"

# A string field's ``Meta(extra=...)`` key: free text cleaned, not refused, for a NUL
# (the module's docstring).
CLEANED = "cleaned"
NUL = "\x00"
_NUL_ESCAPE = b"\\u0000"  # how a JSON body spells a NUL

Queue = Annotated[str, msgspec.Meta(pattern=QUEUE_PATTERN)]
IdempotencyKey = Annotated[str, msgspec.Meta(pattern=KEY_PATTERN)]
Ref = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_REF)]


class JobSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    kind: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_KIND)]
    args: dict[str, Any] = msgspec.field(default_factory=dict)
    delay_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_DELAY_MS)] | None = None
    run_at: Annotated[float, msgspec.Meta(ge=0, le=MAX_RUN_AT)] | None = None  # unix seconds
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=1000)] | None = None
    priority: Annotated[int, msgspec.Meta(ge=-1_000_000, le=1_000_000)] = 0  # higher first
    queue: Queue = DEFAULT_QUEUE
    idempotency_key: IdempotencyKey | None = None  # in a batch; a single POST uses the header
    key: FairKey | None = None  # a fairness key: a tenant (``sqlq.common.fair``)
    weight: Weight = 1  # its share among its queue's keys

    def request_hash(self) -> str:
        """What the client asked for, without the key: a replay hashes the same."""
        return hashlib.sha256(msgspec.json.encode(self._asked())).hexdigest()[:32]

    def _asked(self) -> tuple[Any, ...]:
        asked = (self.kind, self.args, self.delay_ms, self.run_at, self.max_attempts,
                 self.priority, self.queue)  # fmt: skip
        if self.key is None and self.weight == 1:  # a job with neither hashes as it always did
            return asked
        return (*asked, self.key, self.weight)


class MemberSpec(JobSpec, kw_only=True):
    """A job of a batch, which may be a workflow's member (a batch with ``workflow``;
    ``sqlq.common.workflow``): its name in the batch, the refs of its parents there, and
    its two policies. Its own struct, so a single POST's ``JobSpec`` neither decodes nor
    checks four fields it cannot use (one that names them is refused as unknown)."""

    ref: Ref | None = None
    depends_on: Annotated[tuple[Ref, ...], msgspec.Meta(max_length=MAX_PARENTS)] = ()
    on_parent_failure: OnParentFailure = OnParentFailure.CANCEL
    run_if: RunIf = RunIf.ALL_COMPLETED

    def in_graph(self) -> str | None:
        """The first field it sets that only a workflow's member may (None: none)."""
        if self.ref is not None:
            return "ref"
        if self.depends_on:
            return "depends_on"
        if self.on_parent_failure is not OnParentFailure.CANCEL:
            return "on_parent_failure"
        return None if self.run_if is RunIf.ALL_COMPLETED else "run_if"

    def _asked(self) -> tuple[Any, ...]:
        asked = super()._asked()
        if self.in_graph() is None:  # a plain job hashes as it always did
            return asked
        return (*asked, self.ref, self.depends_on, self.on_parent_failure, self.run_if)


class RetrySpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Which finished jobs ``POST /jobs/retry`` puts back: all that match."""

    state: Literal["dead", "cancelled"] = "dead"
    kind: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_KIND)] | None = None
    queue: Queue | None = None


class CancelSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Which live jobs ``POST /jobs/cancel`` cancels: every match. A scheduled one is
    cancelled; for a running one a cancel is asked for (its attempt decides how it ends).
    No state: both."""

    state: Literal["scheduled", "running", "waiting"] | None = None
    kind: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_KIND)] | None = None
    queue: Queue | None = None


# A workflow's id, as a batch names one to append to: a job id's shape.
WorkflowId = Annotated[str, msgspec.Meta(pattern=f"^[0-9a-f]{{{JOB_ID_LENGTH}}}$")]


class BatchSpec(msgspec.Struct, forbid_unknown_fields=True):
    jobs: Annotated[list[MemberSpec], msgspec.Meta(min_length=1, max_length=MAX_BATCH)]
    # True: the jobs are a new workflow, a graph by their ``ref`` and ``depends_on``; a
    # workflow's id: they join it, each ``depends_on`` naming refs of this batch or the ids
    # of its members.
    workflow: bool | WorkflowId = False


# The same fields, args left raw: what a batch is decoded into first (see the docstring).
_RawJob = msgspec.defstruct(
    "_RawJob",
    [
        (f.name, msgspec.Raw, msgspec.Raw(b"{}"))
        if f.name == "args"
        else (f.name, f.type)
        if f.required
        else (f.name, f.type, f.default)
        for f in msgspec.structs.fields(MemberSpec)
    ],
    kw_only=True,
    forbid_unknown_fields=True,
)
_RawBatch = msgspec.defstruct(
    "_RawBatch",
    [
        ("jobs", Annotated[list[_RawJob], msgspec.Meta(min_length=1, max_length=MAX_BATCH)]),  # type: ignore[valid-type]
        ("workflow", bool | WorkflowId, False),
    ],
    forbid_unknown_fields=True,
)
_FIELDS = tuple(f.name for f in msgspec.structs.fields(MemberSpec) if f.name != "args")


_DIGITS = re.compile("[0-9]{1,18}")  # ASCII only; 18 digits cannot overflow an int64


def whole_number(raw: str) -> int | None:
    """``raw`` as a non-negative int if it is 1 to 18 ASCII digits, else None.

    Not ``str.isdigit``: that also takes ``²`` (which ``int`` refuses) and any
    number of digits (``int`` refuses past 4,300, and a huge one is no count).
    """
    return int(raw) if _DIGITS.fullmatch(raw) else None


_AT = re.compile(r" - at `\$\.?([^`]*)`$")
_MISSING = re.compile(r"missing required field `([^`]*)`")


class BadJSON(ValueError):
    """The body is not JSON at all."""


def error_field(message: str, within: str = "") -> tuple[str, str]:
    """The JSON path a msgspec message names (``body`` for the root) and the message
    without it; ``within`` is where the decoded value sits (``jobs[3].args``).

    The one parser of msgspec's error paths: the HTTP decoders and every kind's
    ``convert_args`` name a field the same way."""
    m = _AT.search(message)
    path = m.group(1) if m else ""
    missing = _MISSING.search(message)
    if missing:
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
    if within:
        path = within + (path if path.startswith("[") or not path else "." + path)
    return (path or "body"), _AT.sub("", message)


def check_args(args: Any, field: str = "args") -> int:
    """The number of items in ``args``; a ``ValidationError`` naming ``field`` past a bound."""
    try:
        return measure(args)
    except ShapeError as exc:
        raise ValidationError(field, str(exc)) from None


_ARGS = msgspec.json.Decoder(dict[str, Any])  # one decoder: a type per call is re-analysed


def _args(raw: msgspec.Raw, field: str) -> dict[str, Any]:
    try:
        args: dict[str, Any] = _ARGS.decode(raw)
    except msgspec.ValidationError as exc:
        raise ValidationError(*error_field(str(exc), field)) from None
    except RecursionError:  # deeper than the stack allows is far past MAX_DEPTH
        raise ValidationError(field, "nested deeper than the limit") from None
    return args


def decode_job(body: bytes) -> JobSpec:
    """One job: ``JobSpec`` with its args held to ``sqlq.common.shape`` (walked only when the
    whole body's bracket and comma counts do not already keep them within)."""
    spec: JobSpec = decode(body, JobSpec)
    if not surely_within(body):
        check_args(spec.args)
    return spec


def decode_batch(body: bytes) -> BatchSpec:
    """A batch, its args decoded one job at a time (see the module's docstring)."""
    raw = decode(body, _RawBatch)
    jobs: list[MemberSpec] = []
    total = 0
    exact = False  # counting by the walk; until then by ``bound``, which may overcount
    for i, job in enumerate(raw.jobs):
        field = f"jobs[{i}].args"
        if len(job.args) > MAX_JOB_BYTES:  # else one job of a 16 MiB batch: 1.7 s, 450 MB
            raise ValidationError(field, f"larger than {MAX_JOB_BYTES} bytes, a job's limit")
        args = _args(job.args, field)
        depth, items = bound(bytes(job.args))
        if exact or depth > MAX_DEPTH or items > MAX_ITEMS:
            items = check_args(args, field)
        total += items
        if total > MAX_BATCH_ITEMS and not exact:  # perhaps only the bounds: count exactly
            exact = True
            total = items + sum(check_args(j.args, f"jobs[{k}].args") for k, j in enumerate(jobs))
        if total > MAX_BATCH_ITEMS:
            raise ValidationError(
                "jobs", f"the jobs' args hold more than {MAX_BATCH_ITEMS} values in all; "
                "submit fewer jobs at a time"
            )  # fmt: skip
        jobs.append(_spec(job, args))
    return BatchSpec(jobs, raw.workflow)


def _spec(job: Any, args: dict[str, Any]) -> MemberSpec:
    """The ``MemberSpec`` of a ``_RawJob``: named one by one, ~2x as fast as ``**`` a dict
    (a tenth of a 10,000-job batch); the assertion below keeps the names complete."""
    return MemberSpec(
        kind=job.kind, args=args, delay_ms=job.delay_ms, run_at=job.run_at,
        max_attempts=job.max_attempts, priority=job.priority, queue=job.queue,
        idempotency_key=job.idempotency_key, key=job.key, weight=job.weight, ref=job.ref,
        depends_on=job.depends_on, on_parent_failure=job.on_parent_failure, run_if=job.run_if,
    )  # fmt: skip


assert _FIELDS == ("kind", "delay_ms", "run_at", "max_attempts", "priority", "queue",
                   "idempotency_key", "key", "weight", "ref", "depends_on", "on_parent_failure",
                   "run_if"), "a JobSpec field _spec does not copy"  # fmt: skip


def no_nul(field: str, value: str) -> str:
    """``value``, if it holds no NUL; a ``ValidationError`` naming ``field`` if it does."""
    if NUL in value:
        raise ValidationError(field, "must not contain NUL (\\u0000)")
    return value


_SHAPES: dict[Any, mi.Type] = {}  # each body type as msgspec describes it, made once


def _shape(spec: type[Any]) -> mi.Type:
    shape = _SHAPES.get(spec)
    if shape is None:
        shape = _SHAPES[spec] = mi.type_info(spec)
    return shape


def _names(value: Any, t: mi.Type, path: str) -> None:
    """Hold every string field of ``value`` (decoded as ``t``, found at ``path``) to
    ``no_nul``; JSON values (``Any``, a dict, raw) and ``CLEANED`` text are passed over.

    Recursive over the type, not the value: a body nests only as deep as its structs."""
    if isinstance(t, mi.Metadata):
        if t.extra and t.extra.get(CLEANED):
            return
        t = t.type
    if isinstance(t, mi.UnionType):
        for member in t.types:
            inner = member.type if isinstance(member, mi.Metadata) else member
            if (
                (isinstance(inner, mi.StrType) and isinstance(value, str))
                or (isinstance(inner, mi.ListType) and isinstance(value, list))
                or (isinstance(inner, mi.StructType) and type(value) is inner.cls)
            ):
                _names(value, member, path)
                return
    elif isinstance(t, mi.StrType):
        no_nul(path or "body", value)
    elif isinstance(t, mi.ListType):
        for i, item in enumerate(value):
            _names(item, t.item_type, f"{path}[{i}]")
    elif isinstance(t, mi.StructType):
        for f in t.fields:
            _names(
                getattr(value, f.name), f.type, f"{path}.{f.encode_name}" if path else f.encode_name
            )


def decode(body: bytes, spec: type[Any]) -> Any:
    """``body`` as ``spec``: a ``ValidationError`` naming the field (a value of the wrong
    type or out of bounds, a name holding NUL), or ``BadJSON``."""
    try:
        value = msgspec.json.decode(body, type=spec)
    except msgspec.ValidationError as exc:
        field, message = error_field(str(exc))
        raise ValidationError(field, message) from None
    except msgspec.DecodeError as exc:
        raise BadJSON(f"body is not valid JSON: {exc}") from None
    except RecursionError:
        # msgspec decodes nested arrays and objects recursively; a body nested a
        # thousand levels deep is an attack or a bug, never a job.
        raise BadJSON("body is nested too deeply") from None
    if _NUL_ESCAPE in body:  # else no string in it holds one (the module's docstring)
        _names(value, _shape(spec), "")
    return value
