"""Shared mode's writes out of ``running``: fenced on the lease, and safe to write again.

An outcome applies only while its node still holds an unexpired lease on the job
at the claim's epoch; a rescue only while the lease is still expired (a late
renewal wins); a cancel of a job held elsewhere is asked of the store. All are
plain functions of the store, so ``SharedClaims`` keeps only the decisions: what
an attempt became, and whom to tell.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from sqlq.common.clock import Clock
from sqlq.common.errors import (
    IllegalTransitionError,
    JobNotFoundError,
    StoreUnavailableError,
    TransitionError,
)
from sqlq.common.models import Job, State, Transition
from sqlq.common.store import Fence, SharedStore

log = logging.getLogger(__name__)

RESCUE_BATCH = 500  # expired leases requeued per round
RETRY_OUTCOME_S = 0.2  # an outcome the database did not answer is written again after this


async def write_fenced(
    store: SharedStore, clock: Clock, t: Transition, fence: Fence, give_up: Callable[[], bool],
    spawned: Sequence[Job] = (),
) -> None:  # fmt: skip
    """Write ``t`` under ``fence`` (and the jobs it ``spawned``, in its commit), again while
    the database is out of reach, until ``give_up()`` says so.

    An answer lost in a reconnect may hide a write that landed: a refusal of the
    rewrite is then checked against the row before it counts as fenced.
    """
    uncertain = False
    while True:
        try:
            await store.commit_fenced([t, *spawned] if spawned else [t], fence)
            return
        except StoreUnavailableError:
            if give_up():
                raise
            uncertain = True
            await clock.sleep(RETRY_OUTCOME_S)
        except TransitionError:
            if uncertain and await _landed(store, t):
                return
            raise


async def _landed(store: SharedStore, t: Transition) -> bool:
    now = await store.get(t.job_id)
    return now is not None and (now.state, now.epoch, now.updated_at) == (
        t.state, t.epoch, t.updated_at,
    )  # fmt: skip


async def rescue_expired(
    store: SharedStore, now: float, policy: Callable[[Job], Transition]
) -> list[tuple[Job, Transition]]:
    """Move running jobs whose lease ran out before ``now`` as ``policy`` says (requeued,
    or dead on their last attempt), each fenced on its lease still being expired; the
    moves this node made (another node may have rescued some first)."""
    expired = await store.expired(now, RESCUE_BATCH)
    if not expired:
        return []
    fence = Fence(lease_before=now)
    moves = [(job, policy(job)) for job in expired]
    outcomes = await asyncio.gather(
        *(store.commit_fenced([t], fence) for _, t in moves), return_exceptions=True
    )
    done = []
    for move, outcome in zip(moves, outcomes, strict=True):
        if outcome is None:
            done.append(move)
        elif not isinstance(outcome, TransitionError):  # another node rescued it first
            log.warning("could not rescue job %s: %s", move[0].id, outcome)
    return done


async def cancel_in_store(
    store: SharedStore, job_id: str, clock: Clock, grace_s: float | None = None
) -> tuple[Job, Transition | None]:
    """Cancel ``job_id`` if it is scheduled or waiting (a workflow's: its cone with it, in
    the same commit) (the job before, and the durable cancel), or ask
    for the cancel of it running on any node (the job as it now stands, None); ``grace_s``:
    forced, so a remote worker's lease is held to now + ``grace_s`` (``request_cancel``).
    A job that moves on meanwhile is looked at again; a finished one:
    ``IllegalTransitionError``."""
    state = "changing"
    for _ in range(3):
        job = await store.get(job_id)
        if job is None:
            raise JobNotFoundError(job_id)
        now = clock.time()
        state = job.state.value
        if job.state is State.SCHEDULED or job.state is State.WAITING:
            t = job.cancel(now)
            try:
                await store.commit([t])
            except TransitionError:
                continue  # claimed (or retried) meanwhile
            return job, t
        if job.state is not State.RUNNING:
            break
        forced_until = None if grace_s is None else now + grace_s
        asked = await store.request_cancel(job_id, now, forced_until=forced_until)
        if asked is None:
            raise JobNotFoundError(job_id)
        if asked.state is State.RUNNING:
            return asked, None
    raise IllegalTransitionError(job_id, f"a {state} job cannot be cancelled")
