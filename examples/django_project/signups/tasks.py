"""The signups app's task: the welcome mail, sent by a ``sqlq worker`` through the ORM.

The view sends it (``welcome.send(signup_id=...)``); the worker runs it after importing
``mysite.worker``, which sets Django up first. Its argument is the row's id, not the row:
a job's arguments are JSON, and the worker reads the row as it is when the job runs.
"""

import logging

from django.utils import timezone
from mysite.db_jobs import closes_db_connections

from sqlq import task

from .models import Signup

log = logging.getLogger(__name__)


@task
@closes_db_connections
def welcome(signup_id: int) -> str:
    """Send the welcome mail (here: a log line) and record when; the address."""
    signup = Signup.objects.get(pk=signup_id)
    log.info("welcome mail to %s", signup.email)
    signup.welcomed_at = timezone.now()
    # Only this field: the web process writes job_id on the same row meanwhile.
    signup.save(update_fields=["welcomed_at"])
    return str(signup.email)
