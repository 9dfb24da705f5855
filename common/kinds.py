"""Job kinds by name: what a job of each kind accepts and how it runs.

A kind validates its arguments when a job is submitted (so bad input is a 422
naming the field, never a failed job later) and runs with a ``JobContext``
whose ``beat()`` is the heartbeat the health loop watches.

Built in: ``sleep`` (the fault injector of the experiments) and ``cpu`` (see
``common.cpu``). User handlers register with the ``task`` decorator from a
module that ``sqlq serve --import`` imports::

    from common.kinds import task

    @task()
    async def resize(args, ctx):   # async: runs on the event loop
        ...
        ctx.beat()                 # at least every hb_timeout while working
        return {"ok": True}        # stored as the job's result

    @task(name="crunch")
    def crunch(args):              # plain function: runs in a thread
        return sum(args["xs"])

An exception fails the attempt; its message becomes ``last_error``.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import msgspec

from common.errors import ValidationError
from common.models import JSON, Job

MAX_WORK_MS = 600_000  # ten minutes: longer sleeps are a typo, not an experiment
BEAT_EVERY_S = 0.010  # the sleep kind's heartbeat slice


class JobContext:
    """What a running handler may touch: its job, a heartbeat and an RNG."""

    __slots__ = ("job", "last_beat", "rng")

    def __init__(self, job: Job, rng: random.Random) -> None:
        self.job = job
        self.rng = rng
        self.last_beat = time.monotonic()

    def beat(self) -> None:
        """I am alive and working. Safe to call from any thread."""
        self.last_beat = time.monotonic()


class JobFailed(Exception):
    """A handler's way to fail an attempt with a message."""


Validate = Callable[[JSON], JSON]
Run = Callable[[JSON, JobContext], Awaitable[JSON]]


@dataclass(frozen=True, slots=True)
class Kind:
    name: str
    validate: Validate
    run: Run


class Registry:
    def __init__(self) -> None:
        self._kinds: dict[str, Kind] = {}

    def register(self, kind: Kind) -> None:
        if kind.name in self._kinds:
            raise ValueError(f"a job kind named {kind.name!r} is already registered")
        self._kinds[kind.name] = kind

    def get(self, name: str) -> Kind:
        kind = self._kinds.get(name)
        if kind is None:
            known = ", ".join(sorted(self._kinds))
            raise ValidationError("kind", f"unknown kind {name!r}; known kinds: {known}")
        return kind

    def names(self) -> list[str]:
        return sorted(self._kinds)


# -- argument validation through msgspec, with the field named ----------------------

_AT = re.compile(r" - at `\$(?:\.|\[)?([^`]*)`$")

S = TypeVar("S", bound=msgspec.Struct)


def convert_args(args: JSON, spec: type[S], prefix: str = "args") -> S:
    """``args`` as a ``spec``, or a ``ValidationError`` naming the offending field."""
    if not isinstance(args, dict):
        raise ValidationError(prefix, "must be a JSON object")
    try:
        return msgspec.convert(args, spec)
    except msgspec.ValidationError as exc:
        message = str(exc)
        m = _AT.search(message)
        field = prefix + ("." + m.group(1).rstrip("]") if m and m.group(1) else "")
        if not m and "missing required field" in message:
            field = prefix + "." + message.rsplit("`", 2)[-2]
        raise ValidationError(field, _AT.sub("", message)) from None


# -- sleep: the fault injector ----------------------------------------------------------

Prob = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class SleepArgs(msgspec.Struct, forbid_unknown_fields=True):
    work_ms: Annotated[int, msgspec.Meta(ge=0, le=MAX_WORK_MS)] = 0
    fail_prob: Prob = 0.0
    hang_prob: Prob = 0.0


def _validate_sleep(args: JSON) -> JSON:
    return msgspec.to_builtins(convert_args(args, SleepArgs))


async def _run_sleep(args: JSON, ctx: JobContext) -> JSON:
    """Sleep ``work_ms`` in slices of at most 10 ms with a heartbeat after each.

    Slices aim at one deadline, so timer overshoot is paid once, not per slice.
    ``hang_prob``: stop beating and never return. ``fail_prob``: raise at the end.
    """
    a = SleepArgs(**args)
    if a.hang_prob and ctx.rng.random() < a.hang_prob:
        await asyncio.Event().wait()  # hangs until cancelled, with no heartbeat
    loop = asyncio.get_running_loop()
    deadline = loop.time() + a.work_ms / 1000
    while (left := deadline - loop.time()) > 0:
        await asyncio.sleep(min(BEAT_EVERY_S, left))
        ctx.beat()
    if a.fail_prob and ctx.rng.random() < a.fail_prob:
        raise JobFailed("injected failure (fail_prob)")
    return {"slept_ms": a.work_ms}


SLEEP = Kind("sleep", _validate_sleep, _run_sleep)


# -- user handlers ------------------------------------------------------------------------

REGISTRY = Registry()
REGISTRY.register(SLEEP)

F = TypeVar("F", bound=Callable[..., Any])


def task(name: str | None = None, *, registry: Registry | None = None) -> Callable[[F], F]:
    """Register a function as a job kind (default name: the function's name).

    It is called as ``fn(args)`` or, if it takes two parameters, ``fn(args, ctx)``.
    Async functions run on the event loop; plain ones in a thread.
    """

    def decorate(fn: F) -> F:
        wants_ctx = len(inspect.signature(fn).parameters) >= 2
        if inspect.iscoroutinefunction(fn):

            async def run(args: JSON, ctx: JobContext) -> JSON:
                return await (fn(args, ctx) if wants_ctx else fn(args))

        else:

            async def run(args: JSON, ctx: JobContext) -> JSON:
                call = (lambda: fn(args, ctx)) if wants_ctx else (lambda: fn(args))
                return await asyncio.to_thread(call)

        (registry or REGISTRY).register(Kind(name or fn.__name__, _any_json, run))
        return fn

    return decorate


def _any_json(args: JSON) -> JSON:
    return args
