"""The model of a ``Service`` that ``test_model.py`` checks every engine against.

A hypothesis ``RuleBasedStateMachine`` drives one ``Service`` the way clients,
workers and operators do: submissions (single and batch; delayed, prioritised,
in several queues, with idempotency keys and 1 to 3 attempts), cancels,
retries, pauses, worker outcomes, clean restarts and crashes. The test plays
the workers itself: the pool has none, and the machine takes claims with
``claims.next()`` and reports their outcomes, so every step is deterministic.
Time is a ``FakeClock`` the machine advances; nothing sleeps.

The model is what the client was told: every acknowledged job, its state,
epoch and attempts. After every step the store's records (every page of
``list_jobs``) must equal the model, every job's history must follow
``TRANSITIONS``, and what the service reports (``stats()``, ``queues()``, the
lanes) must equal the fold of those records.

A crash on walq is a power cut on the simulated disk (``tests/powerloss.py``):
the next process opens what the cut left, synced bytes plus a torn tail. On the
other engines it is the process abandoned without ``stop``: its files reopened
by the next one, its leases (PostgreSQL) left to run out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from sqlq.common.backoff import Failure
from sqlq.common.errors import (
    IdempotencyConflictError,
    JobNotFoundError,
    TransitionError,
    ValidationError,
)
from sqlq.common.models import Job, State
from sqlq.common.specs import JobSpec, RetrySpec
from sqlq.runtime.claims import Claim, ClaimResult
from sqlq.runtime.shared import SharedClaims
from tests.model_expected import (
    CLAIM_WITHIN_S,
    DEFAULT_ATTEMPTS,
    MAX_JOBS,
    OUTCOMES,
    QUEUES,
    Expected,
    specs,
)
from tests.model_process import ProcessRules


class ServiceModel(ProcessRules):
    """Subclassed per engine by ``machine_for``: ``engine`` names it, ``dsn`` makes a
    database for it (PostgreSQL)."""

    # -- rules: clients ---------------------------------------------------------------------

    @precondition(lambda self: len(self.jobs) < MAX_JOBS)
    @rule(spec=specs)
    def submit_one(self, spec: JobSpec) -> None:
        self._submit([spec], is_batch=False)

    @precondition(lambda self: len(self.jobs) < MAX_JOBS)
    @rule(batch=st.lists(specs, min_size=1, max_size=4))
    def submit_batch(self, batch: list[JobSpec]) -> None:
        self._submit(batch, is_batch=True)

    def _submit(self, batch: list[JobSpec], *, is_batch: bool) -> None:
        keys = [s.idempotency_key for s in batch if s.idempotency_key]
        conflict = any(
            k in self.keys and self.jobs[self.keys[k]].request_hash != s.request_hash()
            for s in batch
            if (k := s.idempotency_key)
        )
        now = self.clock.time()
        try:
            jobs, new = self.run(self.service.submit(batch, batch=is_batch))
        except ValidationError:
            assert len(set(keys)) < len(keys), "only a key twice in one batch is refused"
            return
        except IdempotencyConflictError:
            assert conflict, "a key reused with the same request is a replay, not a conflict"
            return
        assert len(set(keys)) == len(keys), keys
        assert not conflict, "a key reused with another request was accepted"
        assert len(jobs) == len(batch)
        for spec, job, fresh in zip(batch, jobs, new, strict=True):
            key = spec.idempotency_key
            if not fresh:  # a replay: the job the key already named
                assert key is not None
                assert self.keys[key] == job.id
                continue
            assert key is None or key not in self.keys, f"key {key} made a second job"
            assert job.state is State.SCHEDULED
            assert job.id not in self.jobs
            ready = now + (spec.delay_ms or 0) / 1000
            assert job.ready_at == ready
            assert job.queue == spec.queue
            self.jobs[job.id] = Expected(
                id=job.id,
                queue=spec.queue,
                priority=spec.priority,
                max_attempts=spec.max_attempts or DEFAULT_ATTEMPTS,
                key=key,
                request_hash=spec.request_hash(),
                ready_at=ready,
            )
            if key is not None:
                self.keys[key] = job.id

    def _pick(self, data: st.DataObject, pool: list[str]) -> str:
        """One of ``pool`` (or an id no job has). Drawn from a fixed range: a power cut may
        keep a submission in flight or not, and the draw must not depend on which."""
        i = data.draw(st.integers(0, MAX_JOBS))
        return pool[i % len(pool)] if pool else "0" * 32

    def _operate(
        self, job_id: str, op: Callable[[str], Coroutine[Any, Any, Job]], accepts: tuple[State, ...]
    ) -> tuple[Expected, Job] | None:
        """Run an operation on one job. An unknown id must be unknown to the model, a refusal
        must come from a state the operation does not accept, and a success from one it does."""
        e = self.jobs.get(job_id)
        try:
            job = self.run(op(job_id))
        except JobNotFoundError:
            assert e is None
            return None
        except TransitionError:
            assert e is not None
            assert e.state not in accepts, f"{e} was refused"
            return None
        assert e is not None
        assert e.state in accepts, f"{op.__name__} took {e}"
        return e, job

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        done = self._operate(self._pick(data, list(self.jobs)), self.service.cancel,
                             (State.SCHEDULED, State.RUNNING))  # fmt: skip
        if done is None:
            return
        e, job = done
        if e.state is State.RUNNING:  # asked for, durably: the attempt's end decides
            assert (job.state, job.epoch) == (State.RUNNING, e.epoch), job
            assert job.cancel_requested_at is not None, job
            e.cancel_asked = True
            return
        assert job.state is State.CANCELLED
        e.move(State.CANCELLED)
        self.ended[State.CANCELLED.value] += 1

    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        now = self.clock.time()
        done = self._operate(self._pick(data, list(self.jobs)), self.service.retry,
                             (State.DEAD, State.CANCELLED))  # fmt: skip
        if done is not None:
            self._revived(*done, now)

    def _revived(self, e: Expected, job: Job, now: float) -> None:
        e.move(State.SCHEDULED)
        e.epoch += 1
        e.attempts_total += e.attempts
        e.attempts = 0
        e.ready_at = now
        e.cancel_asked = False
        assert (job.state, job.epoch, job.ready_at) == (State.SCHEDULED, e.epoch, now), job

    @rule(state=st.sampled_from((State.DEAD, State.CANCELLED)), queue=st.sampled_from(QUEUES))
    def retry_matching(self, state: State, queue: str) -> None:
        now = self.clock.time()
        matching = [e for e in self.jobs.values() if e.state is state and e.queue == queue]
        n = self.run(self.service.retry_matching(RetrySpec(state=state.value, queue=queue)))  # type: ignore[arg-type]
        assert n == len(matching), f"retried {n} of {len(matching)} {state.value} in {queue}"
        for e in matching:
            job = self.run(self.service.get(e.id))
            assert job is not None
            self._revived(e, job, now)

    @rule(queue=st.sampled_from(QUEUES), paused=st.booleans())
    def pause(self, queue: str, paused: bool) -> None:
        info = self.run(self.service.pause(queue, paused))
        assert info.paused is paused
        (self.paused.add if paused else self.paused.discard)(queue)

    @rule(seconds=st.sampled_from((0.001, 0.02, 0.3, 2.0, 61.0)))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        claims = self.service.claims
        if isinstance(claims, SharedClaims) and self.held:  # the lease loop, by hand
            self.run(claims.renew())

    # -- rules: the workers -------------------------------------------------------------------

    @rule()
    def claim(self) -> None:
        due = self._due()
        self.run(self._claim(due))

    async def _claim(self, due: list[Expected]) -> None:
        claims = self.service.claims
        statements = getattr(claims, "claims", 0)
        task = asyncio.ensure_future(claims.next())
        if due:
            await asyncio.wait({task}, timeout=CLAIM_WITHIN_S)
        elif isinstance(claims, SharedClaims):  # until one claim statement came back
            for _ in range(int(CLAIM_WITHIN_S / 0.005)):
                if claims.claims > statements or task.done():
                    break
                await asyncio.sleep(0.005)
            await asyncio.sleep(0)
        else:
            for _ in range(20):  # the lanes answer without I/O: a few turns of the loop
                await asyncio.sleep(0)
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert not due, f"no claim within {CLAIM_WITHIN_S}s though due: {due}"
            return
        claim = task.result()
        ids = {e.id: e for e in due}
        assert claim.job.id in ids, f"claimed {claim.job} though due are only {sorted(ids)}"
        top = max(e.priority for e in due)
        assert claim.job.priority == top, f"claimed priority {claim.job.priority}, not {top}"
        assert await claim.claimed is ClaimResult.CLAIMED
        e = ids[claim.job.id]
        e.move(State.RUNNING)
        e.attempts += 1
        if self.shared:
            e.epoch += 1  # a shared claim takes a new epoch
        assert (claim.job.attempts, claim.job.epoch) == (e.attempts, e.epoch), claim.job
        self.held[e.id] = claim

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES))
    def finish(self, data: st.DataObject, outcome: str) -> None:
        job_id = self._pick(data, list(self.held))
        claim = self.held.pop(job_id)
        e = self.jobs[job_id]
        self.run(self._report(claim, outcome, e.attempts))
        actual = self.run(self.service.store.get(job_id))
        if outcome == "complete":
            e.move(State.COMPLETED)
            self.ended[State.COMPLETED.value] += 1
        else:
            self._failed(e, actual)

    async def _report(self, claim: Claim, outcome: str, attempts: int) -> None:
        """What a worker tells the claims when its attempt ends; then wait until it is written."""
        claims = self.service.claims
        if outcome == "complete":
            claims.completed(claim, {"n": attempts})
        elif outcome == "fail":
            claims.failed(claim, Failure("failed on purpose"))
        elif outcome == "hang":
            claims.hung(claim, Failure("worker hung: no heartbeat for 201 ms"))
        else:  # a result JSON cannot hold: that attempt failed
            claims.completed(claim, {"bad": object()})
        await self._settle()


def machine_for(engine: str, dsn: Callable[[], str] | None = None) -> type[ServiceModel]:
    """The model on ``engine``; ``dsn`` makes a fresh database for each example."""
    attrs = {"engine": engine, "dsn": staticmethod(dsn) if dsn else None}
    return type(f"ServiceModel_{engine}", (ServiceModel,), attrs)
