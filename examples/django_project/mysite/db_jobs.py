"""Django's database connections closed around each job, as Django closes them around
each request.

Django opens a connection per thread on first use and closes it only at the end of a
request (``close_old_connections`` on ``request_started`` and ``request_finished``). A
``sqlq worker`` is no request: it runs plain handlers on a pool of threads it keeps, so
without this a thread would hold its connection from job to job, past ``CONN_MAX_AGE``,
and a connection the database dropped in between (a restart, an idle timeout) would fail
the next job. Celery's Django fixup does the same before and after each task.

sqlq's ``Worker`` has no hook around each job, so this is a decorator, placed under
``@task``; it keeps the handler's signature, which is the task's schema.
"""

from collections.abc import Callable
from functools import wraps
from typing import ParamSpec, TypeVar

from django.db import close_old_connections

P = ParamSpec("P")
R = TypeVar("R")


def closes_db_connections(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` with Django's stale connections closed before it runs and after it ends. For
    plain (sync) handlers: a connection belongs to the thread that runs the handler."""

    @wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return run
