"""sqlq: a durable background-job queue.

The public surface::

    from sqlq import task, Client, AsyncClient

``task`` registers a handler (``sqlq serve --import yourmodule``), and with ``cron=`` or
``every_s=`` a schedule of it; ``schedule`` defines a schedule of any kind; ``Client`` and
``AsyncClient`` talk to a server (given no URL or token: ``configure``'s, else
``SQLQ_URL`` and ``SQLQ_TOKEN``); ``Worker`` runs the handlers out of the server's
process, over ``AsyncClient`` (``sqlq worker``). A handler reaches its running job
through its ``JobContext`` and speaks ``Snooze`` (or returns ``snooze(seconds)``),
``Cancelled`` (``ctx.raise_if_cancelled()``), ``AttemptFenced`` and ``JobFailed``, and
may end by returning ``spawn(...)``: jobs added to its workflow in its commit. The
client's errors: ``ApiError`` and its kinds ``Invalid``, ``Unauthorized``, ``NotFound``,
``Conflict`` (``FencedError``: a stale claim token), ``RateLimited``, ``Unavailable``.
Fair claims: ``Policy``, ``KeyPolicy`` and ``Rate`` (a queue's per-key limits), and
``RateLimited`` raised by a handler (an upstream's 429: its job snoozes, its key waits).
``Job`` is the stored job (a handler's ``ctx.job``); the clients return its API view,
``sqlq.client.Job``. Everything else is internal: ``sqlq.common`` (the kernel),
``sqlq.walq`` (the WAL engine) and ``sqlq.bench`` (the benchmarks) are the
repository's top-level folders, installed here so that
no package of a user's can shadow them.
"""

from typing import TYPE_CHECKING, Any

# The one version: pyproject reads it (``dynamic``), ``sqlq --version`` prints it, and
# the API document carries it.
__version__ = "0.2.0"

from sqlq.common.errors import ApiError, RateLimited  # (a handler raises the second)
from sqlq.common.fair import KeyPolicy, Policy, Rate
from sqlq.common.models import Job, State
from sqlq.defaults import configure
from sqlq.graph import Workflow, chain, chord, group, spawn, workflow
from sqlq.runtime.context import AttemptFenced, Cancelled, JobContext, JobFailed, Snooze, snooze
from sqlq.runtime.kinds import schedule, task
from sqlq.runtime.spawn import Spawn
from sqlq.runtime.task import JobError, Task

if TYPE_CHECKING:
    from sqlq.client import (
        AsyncClient,
        Client,
        Conflict,
        FencedError,
        Invalid,
        NotFound,
        Unauthorized,
        Unavailable,
    )
    from sqlq.worker import Worker

_CLIENT = {"AsyncClient", "Client", "Conflict", "FencedError", "Invalid", "NotFound",
           "Unauthorized", "Unavailable"}  # fmt: skip


def __getattr__(name: str) -> Any:
    """The client's names (and ``Worker``, which runs over it), imported when first asked
    for: a server never needs httpx (86 ms of every ``sqlq serve`` start)."""
    if name in _CLIENT:
        from sqlq import client

        return getattr(client, name)
    if name == "Worker":
        from sqlq.worker import Worker

        return Worker
    raise AttributeError(f"module 'sqlq' has no attribute {name!r}")


__all__ = [
    "ApiError",
    "AsyncClient",
    "AttemptFenced",
    "Cancelled",
    "Client",
    "Conflict",
    "FencedError",
    "Invalid",
    "Job",
    "JobContext",
    "JobError",
    "JobFailed",
    "KeyPolicy",
    "NotFound",
    "Policy",
    "Rate",
    "RateLimited",
    "Snooze",
    "Spawn",
    "State",
    "Task",
    "Unauthorized",
    "Unavailable",
    "Worker",
    "Workflow",
    "__version__",
    "chain",
    "chord",
    "configure",
    "group",
    "schedule",
    "snooze",
    "spawn",
    "task",
    "workflow",
]
