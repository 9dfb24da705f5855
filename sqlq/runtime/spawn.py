"""``sqlq.spawn``: jobs a handler makes, committed with its own completion.

A handler returns ``sqlq.spawn(...)`` (``sqlq.graph``) to add jobs to its workflow as it
ends: dynamic fan-out. The jobs it names are stored in the very commit that moves the
spawning job ``running -> completed``, on every engine and through every holder (in
process, a worker process, a remote ``sqlq worker``):

- fenced with it: a completion refused as stale (its lease lost, its attempt cut off)
  stores none of them, and a completion stores them once;
- counted against it as completed: a spawned job that names no parent in the spawn
  gets the spawning job as its parent (``ctx.parents`` holds its result), so it is due
  at once, and the graph shows where it came from; the others wait on their parents in
  the spawn, released by their commits like any member's;
- in the spawning job's workflow, or in a new one if it is in none.

A spawn is checked as a batch is (``POST /jobs/batch``), its fields named ``spawn[i]``:
a spawn the server refuses (an unknown kind, a cycle, a ref its workflow has, a full
queue) fails the attempt with the reason, as a handler's error would (a bad value fails
one attempt). To wait for the spawned jobs, spawn the job that waits too (a chord).

The runtime's half lives here: ``Spawn``, what the handler returns and every holder
carries (as JSON over a pipe or HTTP); ``Spawner``, the server's verb that builds the
jobs and writes them with the completion (``Submissions.spawned``); ``SpawnRefused``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import msgspec

from sqlq.common.errors import ValidationError
from sqlq.common.models import JSON, Job, Transition
from sqlq.common.specs import BadJSON, MemberSpec, decode_batch

R = TypeVar("R")


class Spawn(msgspec.Struct, frozen=True, kw_only=True):
    """A handler's end that adds ``jobs`` (each what ``POST /jobs/batch`` takes in its
    ``jobs``) to its workflow in its completion's commit; ``result`` is its own result.
    ``TypeError`` at once, in the handler, if ``jobs`` is not a list of objects."""

    jobs: list[dict[str, Any]]
    result: Any = None

    def __post_init__(self) -> None:
        # (msgspec checks types when it decodes, not when a handler builds one)
        if type(self.jobs) is not list or not all(type(j) is dict for j in self.jobs):
            raise TypeError("Spawn(jobs=...) takes a list of jobs, each a dict")


class SpawnRefused(Exception):
    """A spawn the server cannot store (its text names the field): the attempt fails with
    it, like a handler's error. ``final``: the same spawn can never pass (a bad field, a
    cycle), so it is not retried; else (a full queue, parents that kept moving) it is,
    by the retry policy."""

    def __init__(self, message: str, *, final: bool = True) -> None:
        super().__init__(message)
        self.final = final


# A spawn's jobs in bytes, at most, as a batch's body is (``POST /jobs/batch``).
MAX_SPAWN_BYTES = 16 << 20


class Spawner(Protocol):
    """Build the jobs ``spawn`` names for ``job``, whose completion is ``t``, and store
    them with it: ``write(jobs)`` is the completion's own write, given the jobs to store
    in its commit; what it returns is returned. ``SpawnRefused`` if they cannot be; a
    refusal of ``t`` itself (``TransitionError``: fenced) is raised as it is. ``who``: the
    principal whose report it is (a remote worker's token), whose share of new queue names
    its new ones take (``sqlq.runtime.names``); None for this process's own workers."""

    async def __call__(
        self,
        job: Job,
        t: Transition,
        spawn: Sequence[JSON],
        write: Callable[[list[Job]], Awaitable[R]],
        who: str | None = None,
    ) -> R: ...


def specs_of(spawn: Sequence[JSON]) -> list[MemberSpec]:
    """The jobs ``spawn`` names, checked as a batch's are (the one decoder of a batch, so
    every bound and every field's rule is the same), fields named ``spawn[i]``;
    ``SpawnRefused`` naming the first that is not a job."""
    try:
        body = msgspec.json.encode({"jobs": spawn})
        if len(body) > MAX_SPAWN_BYTES:
            raise SpawnRefused(f"spawn refused: spawn: larger than {MAX_SPAWN_BYTES} bytes")
        return decode_batch(body).jobs
    except ValidationError as exc:
        raise refused(exc) from None
    except (BadJSON, TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise SpawnRefused(f"spawn refused: not JSON: {exc}") from None


def refused(exc: ValidationError) -> SpawnRefused:
    """A batch's refusal (``jobs[i].field``) as the spawn's (``spawn[i].field``)."""
    field = exc.field
    if field.startswith("jobs"):
        field = "spawn" + field.removeprefix("jobs")
    return SpawnRefused(f"spawn refused: {field}: {exc.message}")
