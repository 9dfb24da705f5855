"""A fresh PostgreSQL database per test, from a pool this test process keeps.

CREATE DATABASE took 0.3 s per PostgreSQL test (it copies the template, and the
cluster runs with fsync on), a fifth of the fast tier's wall time; emptying a
database a finished test gave back takes a tenth of that (``Cluster.recycle``).
"""

from __future__ import annotations

import pytest

from sqlq.bench.pgcluster import Cluster

# This process's databases that finished tests gave back (each xdist worker has its own
# cluster, so no two processes share one).
_SPARE: list[str] = []


def fresh_database(request: pytest.FixtureRequest, *, migrated: bool = True) -> str:
    """The DSN of a database of the session's cluster that no other test is using, empty
    (and migrated to the latest schema); given back when the test ends."""
    cluster: Cluster = request.getfixturevalue("pg_cluster")
    name = _SPARE.pop() if _SPARE else cluster.create_database().rsplit("/", 1)[1]
    request.addfinalizer(lambda: _SPARE.append(name))
    return cluster.recycle(name, migrated=migrated)
