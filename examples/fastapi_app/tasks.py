"""The app's tasks: what its routes send and its ``sqlq worker`` processes run.

Both sides import this module: the app to send the tasks (``await
send_welcome.asend(email=...)``), the worker to run them (``sqlq worker --import
tasks``). Each handler's signature is its schema, so a call with a wrong argument is
refused in the app, before anything is sent, and the worker checks the job's arguments
again before it runs one.
"""

from __future__ import annotations

import logging

from sqlq import task

log = logging.getLogger(__name__)


@task
def send_welcome(email: str) -> str:
    """Send the welcome mail (here: a log line). A plain function: the worker runs it in
    a thread, so blocking I/O (SMTP, an HTTP API) is fine."""
    log.info("welcome mail to %s", email)
    return f"welcome sent to {email}"


@task
async def quote(prices_cents: list[int], discount_percent: int = 0) -> int:
    """A price, for a route that waits for it. An async handler: the worker runs it on its
    event loop."""
    total = sum(prices_cents)
    return total - total * discount_percent // 100
