"""Who a request comes from: a principal with a role, and for a worker its queues.

``--token`` is the admin's token; ``--token-file`` adds lines of
``ROLE NAME SECRET [QUEUE ...]``. The HTTP guard finds the principal a bearer token
names (``sqlq.http.guard``) and which routes a role may use; the runtime holds a
worker to its queues (``sqlq.runtime.remote``). A principal's name appears in logs and
in ``GET /workers``; its secret never leaves the guard.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Role(StrEnum):
    ADMIN = "admin"  # everything
    SUBMIT = "submit"  # submit jobs, and read the jobs it submitted
    WORKER = "worker"  # /claims/* only, for its queues
    READ = "read"  # GET only


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    role: Role
    queues: frozenset[str] | None = None  # a worker's queues; None: every queue

    def serves(self, queue: str) -> bool:
        """Whether this principal may claim and report jobs of ``queue``."""
        return self.queues is None or queue in self.queues


# Who a request is when no token is configured (loopback only), or with --token.
ADMIN = Principal("admin", Role.ADMIN)
