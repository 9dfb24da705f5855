"""sqlq: a durable background-job queue.

The public surface for handler authors::

    from sqlq import task, JobContext, JobFailed

``sqlq.store.SQLiteStore`` is the SQLite engine; the command line is ``sqlq.cli``.
"""

from common.runtime.kinds import JobContext, JobFailed, task
from sqlq.sqlite import SQLiteStore

__all__ = ["JobContext", "JobFailed", "SQLiteStore", "task"]
