"""Job kinds by name: what a job of each kind accepts and how it runs.

A kind validates its arguments when a job is submitted (so bad input is a 422
naming the field, never a failed job later) and runs with a ``JobContext``
whose ``beat()`` is the heartbeat the health loop watches, and whose ``clock`` is
the server's (a handler that waits a while waits on it, as ``sleep`` does, so a
test on a fake clock runs it at once).

Built in: ``sleep`` (the fault injector of the experiments) and ``cpu`` (see
``sqlq.runtime.cpu``). User handlers register with the ``task`` decorator from a
module that ``sqlq serve --import`` (or ``sqlq worker --import``) imports; the handler's
signature is its arguments' schema (``sqlq.runtime.task``)::

    from sqlq import JobContext, task

    @task(timeout=60, max_attempts=3, backoff=30)
    async def resize(ctx: JobContext, url: str, width: int = 640) -> dict[str, bool]:
        ...                        # async: runs on the event loop
        return {"ok": True}        # stored as the job's result

    @task(name="crunch")
    def crunch(xs: list[int]) -> int:   # plain function: runs in the handler thread pool
        return sum(xs)

A handler whose first parameter is named ``args`` is the older form: it takes the whole
arguments dict (``fn(args)`` or ``fn(args, ctx)``), unchecked.

Limits: an attempt that runs past ``timeout`` (default 300 s) is cut off, and
with ``hb_timeout`` set, so is one silent for longer than that between
``ctx.beat()`` calls. A handler that never beats is judged by ``timeout``
alone. A cut-off async handler is cancelled; a thread cannot be, so it is
abandoned (its eventual result is dropped) and counted in ``/stats``. Either
way the attempt fails and the job retries or dead-letters like any other
failure. The built-in kinds beat every 10 ms and are judged by the server's
``--hb-timeout``.

An exception fails the attempt; its message becomes ``last_error``, and it and its
traceback one entry of the job's ``errors`` (the last ten failures). The task's own
rules (``max_attempts``, ``backoff``, ``retry_on``, ``no_retry_on``) decide whether and
when it runs again, else the server's (``--max-attempts``, ``--retry-base-ms``: 15 s,
doubling to 6 h).

Reaching the running job, through ``ctx`` (``sqlq.runtime.context``)::

    @task
    def export(ctx: JobContext, n: int) -> dict[str, int]:
        done = ctx.checkpoint_data or 0       # what an earlier attempt saved, or None
        for i in range(done, n):
            ctx.raise_if_cancelled()          # or test ctx.cancelled and clean up
            ...
            ctx.progress(100 * i / n, f"row {i}")   # never blocks
            ctx.checkpoint(i + 1)             # durable when it returns (in a thread)
        if not ready():
            raise sqlq.Snooze(60)             # or: return sqlq.snooze(60)
        return {"rows": n}

- ``ctx.progress(percent=None, message=None)``: only the latest counts; it is written
  at most once a second (``progress_every_s``) and always with the outcome, and shows
  on the job (``GET /jobs/{id}``). A bad value raises ``ValueError`` in the handler.
- ``ctx.checkpoint(data)``: a small JSON value (64 KiB at most) the next attempt of the
  same job reads as ``ctx.checkpoint_data``; kept across retries, cleared when the job
  completes. A plain handler blocks until it is durable; an async one awaits what it
  returns (``await ctx.checkpoint(data)``). An attempt that no longer holds its job
  (cut off, its lease gone) gets ``AttemptFenced``.
- A cancel of a running job (``DELETE /jobs/{id}``): an async handler has its task
  cancelled (it may catch ``CancelledError`` to clean up; if it then returns, the job
  completes); a plain one reads ``ctx.cancelled`` or calls ``ctx.raise_if_cancelled()``
  (``sqlq.Cancelled``). Any failure after a cancel was asked for ends the job
  ``cancelled``, never retried. ``?force=1`` also cuts the attempt off after
  ``--cancel-grace`` seconds, as a timeout does. ``sleep`` and ``cpu`` stop at once.
- ``sqlq.Snooze(seconds)``: the job runs again after ``seconds`` and this attempt is not
  counted; past ``--max-snoozes`` snoozes it is dead-lettered.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
import typing
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any, Concatenate, Literal, ParamSpec, Protocol, TypeVar, overload

import msgspec

from sqlq.common.backoff import NO_RULES, RetryPolicy, TaskRetry
from sqlq.common.errors import ValidationError, clip
from sqlq.common.fair import FAIR_KEY_PATTERN, Policy, Rate
from sqlq.common.models import JSON, NO_ARGS
from sqlq.common.schedule import ScheduleSpec, check_name, check_spec
from sqlq.common.specs import QUEUE_PATTERN, error_field
from sqlq.runtime.context import AttemptFenced as AttemptFenced  # (re-exported, as below)
from sqlq.runtime.context import Cancelled as Cancelled
from sqlq.runtime.context import JobContext as JobContext
from sqlq.runtime.context import JobFailed as JobFailed
from sqlq.runtime.context import Snooze as Snooze
from sqlq.runtime.context import snooze as snooze
from sqlq.runtime.task import Signature, Task, legacy

MAX_WORK_MS = 600_000  # ten minutes: longer sleeps are a typo, not an experiment
BEAT_EVERY_S = 0.010  # the sleep kind's heartbeat slice
MAX_KIND_LENGTH = 128
DEFAULT_TASK_TIMEOUT_S = 300.0

# A kind's heartbeat timeout: seconds, None (never judged by heartbeat), or
# "server": the server's --hb-timeout, for kinds that beat every 10 ms.
HbTimeout = float | Literal["server"] | None
Exceptions = type[BaseException] | tuple[type[BaseException], ...]
MAX_ATTEMPTS = 1000  # as a submission's max_attempts (``sqlq.common.specs``)
MAX_BACKOFF_S = 86_400.0  # a first retry a day later is the most a backoff may ask


Validate = Callable[[JSON], JSON]
Run = Callable[[JSON, JobContext], Awaitable[JSON]]


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    validate: Validate
    run: Run
    timeout_s: float | None = None  # an attempt running longer is cut off
    hb_timeout_s: HbTimeout = "server"  # an attempt silent longer is cut off
    interruptible: bool = True  # a cancel cancels its task (False: a thread, told by a flag)
    rules: TaskRetry = NO_RULES  # the task's own retry rules (``@task(max_attempts=...)``)


class Registry:
    def __init__(self) -> None:
        self._kinds: dict[str, Kind] = {}
        # The code-defined schedules (``@task(cron=...)``, ``schedule``): a server upserts
        # them at start; they name their kind, which need not be registered yet.
        self.schedules: dict[str, ScheduleSpec] = {}
        # The code-defined queue policies (``@task(queue=..., rate=..., key_concurrency=...)``):
        # a server sets them at start, as ``--queue-policy`` (which wins over them).
        self.policies: dict[str, Policy] = {}

    def define_policy(self, queue: str, policy: Policy, by: str) -> None:
        """``by`` (a task) gives ``queue`` ``policy``; ``ValueError`` if another task gave
        it a different one: a queue has one policy."""
        if self.policies.get(queue, policy) != policy:
            raise ValueError(
                f"task {by!r}: queue {queue!r} has another policy already, from another task; "
                "give the two one policy, or each its own queue"
            )
        self.policies[queue] = policy

    def register(self, kind: Kind) -> None:
        if not kind.name or len(kind.name) > MAX_KIND_LENGTH:
            raise ValueError(f"a job kind's name has 1 to {MAX_KIND_LENGTH} characters")
        if kind.name in self._kinds:
            raise ValueError(f"a job kind named {kind.name!r} is already registered")
        self._kinds[kind.name] = kind

    def get(self, name: str) -> Kind:
        kind = self._kinds.get(name)
        if kind is None:
            if len(name) > MAX_KIND_LENGTH:
                raise ValidationError("kind", f"longer than {MAX_KIND_LENGTH} characters")
            known = clip(", ".join(sorted(self._kinds)))
            raise ValidationError("kind", f"unknown kind {clip(name, 60)!r}; known kinds: {known}")
        return kind

    def __contains__(self, name: str) -> bool:
        return name in self._kinds

    def names(self) -> list[str]:
        return sorted(self._kinds)


# -- argument validation through msgspec, with the field named ----------------------

S = TypeVar("S", bound=msgspec.Struct)


def convert_args(args: JSON, spec: type[S], prefix: str = "args") -> S:
    """``args`` as a ``spec``, or a ``ValidationError`` naming the offending field."""
    if not isinstance(args, dict):
        raise ValidationError(prefix, "must be a JSON object")
    try:
        return msgspec.convert(args, spec)
    except msgspec.ValidationError as exc:
        raise ValidationError(*error_field(str(exc), prefix)) from None


# -- sleep: the fault injector ----------------------------------------------------------

Prob = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class SleepArgs(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Stored without its defaults: a no-op job's arguments are the one empty ``NO_ARGS``, not
    a 184-byte dict of three zeros a job (a million queued ones held 120 MB of them)."""

    work_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_WORK_MS)] = 0
    fail_prob: Prob = 0.0
    hang_prob: Prob = 0.0


FAULT_FLAG = "--fault-injection"


def sleep_kind(*, fault_injection: bool) -> Kind:
    """The ``sleep`` kind; its fault arguments only where the server allows them.

    ``fail_prob`` and ``hang_prob`` exist for the experiments and the tests. In
    production they would let any client make jobs fail or hang on purpose, so
    they are refused unless the server runs with ``--fault-injection``.
    """

    def validate(args: JSON) -> JSON:
        a = convert_args(args, SleepArgs)
        if not fault_injection:
            for name in ("fail_prob", "hang_prob"):
                if getattr(a, name):
                    raise ValidationError(
                        f"args.{name}",
                        f"fault injection is off; start the server with {FAULT_FLAG} to use it",
                    )
        return msgspec.to_builtins(a) or NO_ARGS

    return Kind("sleep", validate, _run_sleep)


async def _run_sleep(args: JSON, ctx: JobContext) -> JSON:
    """Sleep ``work_ms`` in slices of at most 10 ms with a heartbeat after each.

    Slices aim at one deadline, so timer overshoot is paid once, not per slice.
    ``hang_prob``: stop beating and never return. ``fail_prob``: raise at the end.
    """
    a = SleepArgs(**args)
    if a.hang_prob and ctx.rng.random() < a.hang_prob:
        await asyncio.Event().wait()  # hangs until cancelled, with no heartbeat
    clock = ctx.clock  # the injected one: on a fake clock a long sleep job takes no real time
    deadline = clock.monotonic() + a.work_ms / 1000
    while (left := deadline - clock.monotonic()) > 0:
        await clock.sleep(min(BEAT_EVERY_S, left))
        ctx.beat()
    if a.fail_prob and ctx.rng.random() < a.fail_prob:
        raise JobFailed("injected failure (fail_prob)")
    return {"slept_ms": a.work_ms}


SLEEP = sleep_kind(fault_injection=False)


# -- user handlers ------------------------------------------------------------------------

REGISTRY = Registry()  # what @task registers into; the runtime adds the built-in kinds
P = ParamSpec("P")
R = TypeVar("R")


class _Decorate(Protocol):
    """What ``@task(...)`` returns: it makes the ``Task`` (typed as ``task`` is)."""

    @overload
    def __call__(
        self, fn: Callable[Concatenate[JobContext, P], Coroutine[Any, Any, R]], /
    ) -> Task[P, R]: ...
    @overload
    def __call__(self, fn: Callable[Concatenate[JobContext, P], R], /) -> Task[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Task[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...


@overload
def task(fn: Callable[Concatenate[JobContext, P], Coroutine[Any, Any, R]], /) -> Task[P, R]: ...
@overload
def task(fn: Callable[Concatenate[JobContext, P], R], /) -> Task[P, R]: ...
@overload
def task(fn: Callable[P, Coroutine[Any, Any, R]], /) -> Task[P, R]: ...
@overload
def task(fn: Callable[P, R], /) -> Task[P, R]: ...
@overload
def task(
    fn: str | None = None,
    /,
    *,
    name: str | None = None,
    timeout: float | None = DEFAULT_TASK_TIMEOUT_S,
    hb_timeout: float | None = None,
    registry: Registry | None = None,
    cron: str | None = None,
    every_s: int | None = None,
    tz: str = "UTC",
    args: JSON = None,
    max_attempts: int | None = None,
    backoff: float | RetryPolicy | None = None,
    retry_on: Exceptions = (),
    no_retry_on: Exceptions = (),
    queue: str | None = None,
    key: str | Callable[[Any], str | None] | None = None,
    rate: float | Rate | None = None,
    key_concurrency: int | None = None,
) -> _Decorate: ...


def task(
    fn: Callable[..., Any] | str | None = None,
    /,
    *,
    name: str | None = None,
    timeout: float | None = DEFAULT_TASK_TIMEOUT_S,
    hb_timeout: float | None = None,
    registry: Registry | None = None,
    cron: str | None = None,
    every_s: int | None = None,
    tz: str = "UTC",
    args: JSON = None,
    max_attempts: int | None = None,
    backoff: float | RetryPolicy | None = None,
    retry_on: Exceptions = (),
    no_retry_on: Exceptions = (),
    queue: str | None = None,
    key: str | Callable[[Any], str | None] | None = None,
    rate: float | Rate | None = None,
    key_concurrency: int | None = None,
) -> Any:
    """Register a function as a job kind (default name: the function's name), as a
    ``Task`` (``sqlq.runtime.task``: its signature is its schema; ``.send`` makes a job).
    ``@task`` or ``@task(name=..., timeout=...)``.

    It is called with the job's arguments by name, and its context as the parameter
    annotated ``JobContext`` (or named ``ctx``); the older form, a first parameter named
    ``args``, as ``fn(args)`` or ``fn(args, ctx)``. Async functions run on the event
    loop; plain ones in the handler thread pool.
    ``timeout``: seconds an attempt may run (None: no limit). ``hb_timeout``:
    seconds it may go without ``ctx.beat()`` (None: not judged by heartbeat).

    ``cron`` (5 fields, read in ``tz``) or ``every_s``: also a schedule of the same name
    that makes a job of this kind with ``args`` at each tick (``schedule`` takes the
    other options); ``sqlq serve`` upserts it at start.

    Retries, the task's own (else the server's ``--max-attempts`` and ``--retry-*``):
    ``max_attempts``, the attempts a job of it gets (``send`` asks for them, a server that
    imports the task gives them to a job submitted without, and the worker that runs it
    stops at them); ``backoff``, seconds before the second attempt, doubling up to 6 h,
    or a ``RetryPolicy``; ``retry_on``, the exception types that are retried (others are
    final), and ``no_retry_on``, those that are final at once (a job dead at its first
    such failure). Arguments that can never be its arguments are final too.

    Fair claims (``sqlq.common.fair``): ``queue``, the queue its jobs go to (``.options``
    may send one elsewhere); ``key``, each job's fairness key: a string, or a function of
    the job's arguments (a dict) that returns one; ``rate`` (starts a second per key, or a
    ``Rate`` with its burst) and ``key_concurrency``, the policy of ``queue`` (required
    with them), which ``sqlq serve`` sets at start as ``--queue-policy`` would.
    """
    for label, value in (("timeout", timeout), ("hb_timeout", hb_timeout)):
        if value is not None and not value > 0:
            raise ValueError(f"{label} must be a positive number of seconds or None")
    timing = cron is not None or every_s is not None
    rules = _rules(max_attempts, backoff, retry_on, no_retry_on)
    policy = _policy(queue, key, rate, key_concurrency)

    def decorate(fn: Callable[..., Any]) -> Task[Any, Any]:
        kind_name = name or fn.__name__
        signature = None if legacy(fn) else Signature(fn)
        is_async = inspect.iscoroutinefunction(fn)
        if signature is None:  # the older form: fn(args) or fn(args, ctx)
            wants_ctx = len(inspect.signature(fn).parameters) >= 2

            def call(args: JSON, ctx: JobContext) -> Any:
                return fn(args, ctx) if wants_ctx else fn(args)

            validate: Validate = _any_json
        else:
            call = functools.partial(signature.call, fn)
            validate = signature.validate
        if is_async:

            async def run(args: JSON, ctx: JobContext) -> JSON:
                return typing.cast(JSON, await call(args, ctx))

        else:

            async def run(args: JSON, ctx: JobContext) -> JSON:
                if ctx.threads is None:
                    return typing.cast(JSON, await asyncio.to_thread(call, args, ctx))
                return typing.cast(JSON, await ctx.threads.run(lambda: call(args, ctx)))

        kind = Kind(kind_name, validate, run, timeout, hb_timeout, interruptible=is_async,
                    rules=rules)  # fmt: skip
        if timing:  # checked first: a bad schedule registers neither
            spec = _spec(kind.name, kind.name, {"cron": cron, "every_s": every_s, "tz": tz,
                                                "args": {} if args is None else args})  # fmt: skip
        if policy is not None and queue is not None:  # (checked first, as a schedule)
            (registry or REGISTRY).define_policy(queue, policy, kind.name)
        (registry or REGISTRY).register(kind)
        if timing:
            (registry or REGISTRY).schedules[kind.name] = spec
        return Task(fn, kind.name, signature,
                    {"max_attempts": max_attempts, "queue": queue, "key": key})  # fmt: skip

    if isinstance(fn, str):  # @task("name", ...): the older spelling of name=
        name, fn = fn, None
    if fn is not None:  # @task, bare
        return decorate(fn)
    return decorate


def schedule(name: str, kind: str, *, registry: Registry | None = None, **spec: Any) -> None:
    """Define the schedule ``name``, making jobs of ``kind``: ``spec`` is what
    ``PUT /schedules/{name}`` takes (``cron`` or ``every_s``, ``tz``, ``args``, ``queue``,
    ``catch_up``, ``overlap``, ...). ``sqlq serve`` creates it at start if it is missing
    and replaces it if it differs; a server whose code lacks it never deletes it.
    ``ValueError`` now if it is not valid (the kind is checked when the server starts)."""
    target = registry or REGISTRY
    if name in target.schedules:
        raise ValueError(f"a schedule named {name!r} is already defined")
    target.schedules[name] = _spec(name, kind, spec)


def _spec(name: str, kind: str, fields: dict[str, Any]) -> ScheduleSpec:
    """A code-defined schedule's spec, checked as a ``PUT`` body is; ``ValueError`` if bad."""
    given = {k: v for k, v in fields.items() if v is not None}
    try:
        check_name(name)
        return check_spec(msgspec.convert({"kind": kind, **given}, ScheduleSpec))
    except msgspec.ValidationError as exc:
        field, message = error_field(str(exc))
        raise ValueError(f"schedule {name!r}: {field}: {message}") from None
    except ValidationError as exc:
        raise ValueError(f"schedule {name!r}: {exc}") from None


def _rules(
    max_attempts: int | None,
    backoff: float | RetryPolicy | None,
    retry_on: Exceptions,
    no_retry_on: Exceptions,
) -> TaskRetry:
    """A task's retry rules from ``@task``'s arguments; ``ValueError`` naming a bad one."""
    if max_attempts is not None and not (
        isinstance(max_attempts, int) and not isinstance(max_attempts, bool)
        and 1 <= max_attempts <= MAX_ATTEMPTS
    ):  # fmt: skip
        raise ValueError(f"max_attempts must be an int from 1 to {MAX_ATTEMPTS}")
    if isinstance(backoff, int | float) and not isinstance(backoff, bool):
        if not 0 <= backoff <= MAX_BACKOFF_S:
            raise ValueError(f"backoff must be from 0 to {MAX_BACKOFF_S:g} seconds")
        backoff = RetryPolicy(base_s=float(backoff))
    elif backoff is not None and not isinstance(backoff, RetryPolicy):
        raise ValueError("backoff must be seconds (the first retry's) or a RetryPolicy")
    types_ = []
    for label, given in (("retry_on", retry_on), ("no_retry_on", no_retry_on)):
        given = given if isinstance(given, tuple | list) else (given,)
        if not all(isinstance(t, type) and issubclass(t, BaseException) for t in given):
            raise ValueError(f"{label} must be exception types")
        types_.append(tuple(given))
    if max_attempts is None and backoff is None and not any(types_):
        return NO_RULES
    return TaskRetry(max_attempts=max_attempts, backoff=backoff, retry_on=types_[0],
                     no_retry_on=types_[1])  # fmt: skip


def _policy(
    queue: str | None,
    key: str | Callable[[Any], str | None] | None,
    rate: float | Rate | None,
    key_concurrency: int | None,
) -> Policy | None:
    """A task's queue policy from ``@task``'s arguments (None: it sets none); ``ValueError``
    naming a bad one."""
    if queue is not None and not re.fullmatch(QUEUE_PATTERN, queue):
        raise ValueError(f"queue must match {QUEUE_PATTERN}")
    if key is not None and not callable(key) and not re.fullmatch(FAIR_KEY_PATTERN, key):
        raise ValueError(f"key must be a function of the arguments or match {FAIR_KEY_PATTERN}")
    if rate is None and key_concurrency is None:
        return None
    if queue is None:
        raise ValueError("rate and key_concurrency are a queue's policy: give queue= too")
    fields: dict[str, Any] = {"key_concurrency": key_concurrency}
    if isinstance(rate, Rate):
        fields["rate"] = msgspec.to_builtins(rate)
    elif rate is not None:
        fields["rate"] = {"per_s": rate}
    try:
        return msgspec.convert({k: v for k, v in fields.items() if v is not None}, Policy)
    except msgspec.ValidationError as exc:
        field, message = error_field(str(exc))
        raise ValueError(f"{field}: {message}") from None


def _any_json(args: JSON) -> JSON:
    return args
