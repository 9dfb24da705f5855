"""Which claims a store takes: the runtime's one decision about where the queue lives.

A store declares, once, on its class, whether other processes share its jobs
(``JobStore.shared``; the engine registry reads the same attribute). A shared
store's queue is the database's, so claims are made there (``SharedClaims``);
any other store's queue is this process's lanes (``LocalClaims``). The
composition root (``sqlq serve``) asks here and hands the choice to ``Service``,
which never looks at the store for it; so does ``Service`` when given none, the
convenience that tests and benchmarks use.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlq.common.store import JobStore
from sqlq.runtime.claims import QueueHome
from sqlq.runtime.local import LocalClaims
from sqlq.runtime.parts import Parts
from sqlq.runtime.shared import SharedClaims

ClaimsFactory = Callable[[Parts], QueueHome]  # where a service's queue lives, from its parts


def claims_for(store: JobStore) -> ClaimsFactory:
    return SharedClaims if store.shared else LocalClaims
