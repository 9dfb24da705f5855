"""The example app's own tests (``examples/tested_app/test_tasks.py``), collected here so the
repository's ``pytest`` runs them in CI: a user's suite, through ``sqlq.testing`` alone."""

from examples.tested_app.test_tasks import *  # noqa: F403
