"""sqlq: a durable background-job queue.

The public surface::

    from sqlq import task, Client, AsyncClient

``task`` registers a handler (``sqlq serve --import yourmodule``); ``Client`` and
``AsyncClient`` talk to a server. Their errors: ``ApiError`` and its kinds
``Invalid``, ``Unauthorized``, ``NotFound``, ``Conflict``, ``RateLimited``,
``Unavailable``. ``Job`` is what they return. Everything under ``common`` and
``bench`` is internal.
"""

from common.models import Job, State
from common.runtime.kinds import JobContext, JobFailed, task
from sqlq.client import (
    ApiError,
    AsyncClient,
    Client,
    Conflict,
    Invalid,
    NotFound,
    RateLimited,
    Unauthorized,
    Unavailable,
)

__all__ = [
    "ApiError",
    "AsyncClient",
    "Client",
    "Conflict",
    "Invalid",
    "Job",
    "JobContext",
    "JobFailed",
    "NotFound",
    "RateLimited",
    "State",
    "Unauthorized",
    "Unavailable",
    "task",
]
