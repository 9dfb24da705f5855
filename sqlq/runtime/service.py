"""``Service``: what the HTTP layer calls, and the lifecycle of everything behind it.

The data flow, left to right::

    HTTP -> Service -> Claims (LocalClaims: scheduler + lanes | SharedClaims) -> JobStore
                          ^
               WorkerPool -> Executor -> the job's kind

The service validates submissions against the kinds, commits them (durable on
return, ``Submissions``), and hands them to ``Claims``; workers take claims and
report outcomes there; the executor runs each job by its kind. Every state
change goes through the store first, and only once it is durable does anyone
hear of it (``Waiters``, the events).

The caller hands in the store and, if it likes, the claims (a ``ClaimsFactory``:
``sqlq serve`` names them through ``modes.claims_for``), the kinds (default: what
``@task`` registered) and the CPU pool; anything not handed in is built here. The
service owns all of it from then on: it shuts the pool down and closes the store.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
from collections.abc import Sequence
from typing import Any

import msgspec

from sqlq.common.clock import SYSTEM_CLOCK, Clock
from sqlq.common.engine.base import collector_off
from sqlq.common.errors import (
    IllegalTransitionError,
    JobNotFoundError,
    StoreError,
    TransitionError,
    ValidationError,
)
from sqlq.common.fair import MAX_OVERRIDES, KeyPolicy, Policy
from sqlq.common.models import RETRYABLE, Job, State, is_job_id
from sqlq.common.query import cursor
from sqlq.common.specs import CancelSpec, JobSpec, RetrySpec
from sqlq.common.store import MAX_PAGE, JobQuery, JobStore, Recovery
from sqlq.common.wire import WorkflowView, workflow_view
from sqlq.common.workflow import retried
from sqlq.runtime import report
from sqlq.runtime.claims import Claims, ClaimsView, QueueInfo
from sqlq.runtime.config import DEFAULT_GRACE_S, RuntimeConfig, RuntimeState
from sqlq.runtime.cpu import CpuPool
from sqlq.runtime.events import Event
from sqlq.runtime.executor import Executor, build_registry
from sqlq.runtime.kinds import REGISTRY, Registry
from sqlq.runtime.modes import ClaimsFactory, claims_for
from sqlq.runtime.parts import Parts
from sqlq.runtime.processes import ProcessHandlers
from sqlq.runtime.remote import Remote
from sqlq.runtime.schedules import Schedules
from sqlq.runtime.submissions import Submissions
from sqlq.runtime.ticker import Ticker
from sqlq.runtime.waiters import Waiters
from sqlq.runtime.workers import WorkerPool

log = logging.getLogger(__name__)

CANCEL_AT_ONCE = 100  # cancels in flight at once in a bulk cancel
VIEW_ON_LOOP = 2_000  # a workflow's view of more members is made on a thread


def _retried_alone(jobs: list[Job]) -> list[Job]:
    """Of the jobs a bulk retry matched, those it puts back itself: not a workflow member
    with parents. Its parent's revival revives it if it was cancelled for that parent, and
    one retried on its own may run only once its parents have settled, which the store
    checks (a refusal would fail the whole bulk commit): ``POST /jobs/{id}/retry`` it."""
    return [j for j in jobs if j.flow is None or not j.flow.parents]


def _next_page(query: JobQuery, seen: list[Job]) -> JobQuery:
    """The next page of ``query`` after the jobs ``seen`` so far."""
    return JobQuery(
        state=query.state,
        kind=query.kind,
        queue=query.queue,
        after=seen[-1].id if seen else None,
        limit=MAX_PAGE,
    )


class Service:
    def __init__(
        self,
        store: JobStore,
        config: RuntimeConfig | None = None,
        *,
        claims: ClaimsFactory | None = None,
        kinds: Registry | None = None,
        cpu: CpuPool | None = None,
        clock: Clock = SYSTEM_CLOCK,
        define_schedules: bool = False,
    ) -> None:
        """``claims``: where the queue lives (default: ``modes.claims_for(store)``);
        ``kinds``: the user's handlers (default: what ``@task`` registered); the
        built-in ``sleep`` and ``cpu`` kinds are added unless a user kind takes a name.
        ``define_schedules``: upsert the schedules ``kinds`` defines at start (``sqlq
        serve`` does; a test's service leaves the store's schedules as they are)."""
        self.store = store
        self.config = config = config or RuntimeConfig()
        self.clock = clock
        self.cpu = cpu or CpuPool(
            config.cpu_processes, beat_while_queued=config.cpu_beat_while_queued
        )
        rng = random.Random(config.seed)
        user = kinds or REGISTRY
        all_kinds = build_registry(user, fault_injection=config.fault_injection, cpu=self.cpu)
        parts = Parts.of(store, config, clock=clock, rng=rng)
        self.live, self.metrics = parts.live, parts.metrics
        self.events = parts.live.events  # the one sink of /stats' totals and /metrics' events
        home = (claims or claims_for(store))(parts)
        self.claims: Claims = home  # the verbs: claims, ends, cancels, an operator's
        self.view: ClaimsView = home  # what the reporting surface reads, beside them
        self.events.live_queues = self.view.live_queues  # a gone queue's series go
        self.events.known_kinds = frozenset(all_kinds.names())  # bounds the kind labels
        store.observe_batches(self.metrics.batch_written)
        self.metrics.gauges(lambda: report.gauges(self))
        procs = ProcessHandlers(config.processes, config.imports) if config.processes else None
        self.executor = Executor(all_kinds, config, rng=rng, clock=clock, processes=procs)
        self.pool = WorkerPool(
            self.claims,
            self.executor,
            workers=config.workers,
            hb_timeout_s=config.hb_timeout_s,
            healthcheck=config.healthcheck,
            clock=clock,
        )
        self.claims.attach(self.pool)  # a cancel reaches the attempts running here
        self.remote = Remote(self.claims.remote_side, parts)  # remote workers' side (/claims)
        self.submissions = Submissions(
            store, self.claims, self.view, config, all_kinds, self.events, clock
        )
        self._pausing = asyncio.Lock()  # pauses checked against their bound one at a time
        # A completion's spawned jobs are a submission's, made in the completion's commit.
        self.claims.spawner = self.remote.spawner = self.submissions.spawned
        self.waiters = Waiters(self.claims, self.get, clock)
        self._remote_queues = bool(config.every_queue_remote or config.remote_queues)
        self._is_remote = config.remote_test()
        self.schedules = Schedules(store, self.claims, self.submissions, all_kinds, self.events,
                                   clock, self.get)  # fmt: skip
        self.ticker = Ticker(store, self.claims, self.schedules, all_kinds, self.events, clock,
                             shared=store.shared)  # fmt: skip
        self._defined = dict(user.schedules) if define_schedules else {}
        # The code's queue policies (``@task(rate=...)``), under --queue-policy's own.
        self._policies = {**(user.policies if define_schedules else {}), **config.queue_policies}
        for name, spec in self._defined.items():  # before anything starts: a code error
            try:
                self.schedules.check(name, spec)
            except ValidationError as exc:
                raise ValueError(f"schedule {name!r}: {exc}") from None
        self.submissions.names.fix(spec.queue for spec in self._defined.values())  # (config)
        self.submissions.names.fix(self._policies)
        self.live.on_finished = self.waiters.finished
        self.state = RuntimeState.NEW
        self.recovery: Recovery | None = None
        self._maintenance: asyncio.Task[None] | None = None

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> Recovery:
        """Recover, requeue what was running, and start dispatching."""
        self.state = RuntimeState.RECOVERING
        # The worker processes first (their imports done): if they cannot start, nothing
        # else has (no store open, no task running) and the start fails whole.
        await self.executor.start()
        with collector_off():  # see there: recovery allocates, and frees nothing
            recovery = await self.store.open()
            self.recovery = recovery
            await self.claims.start(recovery)
        # --queue-policy, the code's: as told, before any worker claims (a fresh database
        # has no row yet, and a queue's first jobs must not start past its limits)
        for queue, policy in self._policies.items():
            if self.view.policies().get(queue) != policy:
                try:
                    await self.claims.set_policy(queue, policy)
                except ValidationError as exc:  # (a server always starts: a remote queue)
                    log.error("queue %s: its policy is not kept here: %s", queue, exc)
        await self.remote.start()
        self.pool.start()
        self.schedules.listed(await self.store.list_schedules())  # (their names count)
        await self.schedules.define(self._defined)
        self.ticker.start()
        if self.config.compact_every_s > 0:
            self._maintenance = asyncio.create_task(self._maintain(), name="sqlq-maintenance")
        self.state = RuntimeState.READY
        totals = self.events.totals
        log.info(
            "recovery: %s; requeued %d, dead (on their last attempt) %d", recovery.summary(),
            totals[Event.REQUEUED_AT_RECOVERY], totals[Event.DEAD_AT_RECOVERY],
        )  # fmt: skip
        return recovery

    async def stop(self, grace_s: float = DEFAULT_GRACE_S) -> None:
        if self.state in (RuntimeState.STOPPING, RuntimeState.STOPPED):
            return
        self.state = RuntimeState.STOPPING
        self.waiters.stop()
        await self.ticker.stop()
        if self._maintenance is not None:
            self._maintenance.cancel()
            await asyncio.gather(self._maintenance, return_exceptions=True)
        await self.claims.stop()  # (a waiting remote claim answers now, empty)
        await self.pool.stop(grace_s)
        await self.remote.drain()  # remote calls' writes: durable, or refused, before the close
        await self.claims.drain()  # (remotely held jobs stay running, under their leases)
        self.cpu.shutdown()
        await self.executor.close()
        await self.store.close()
        self.state = RuntimeState.STOPPED

    async def _maintain(self) -> None:
        """Prune finished jobs past retention and compact, every ``compact_every_s``."""
        while True:
            await self.clock.sleep(self.config.compact_every_s)
            try:
                report = await self.store.compact()
            except StoreError as exc:
                log.error("periodic compaction failed: %s", exc)
                continue
            self.events.record(Event.COMPACTED)
            log.info(
                "compacted: pruned %d jobs, %d -> %d bytes",
                report.jobs_pruned,
                report.bytes_before,
                report.bytes_after,
            )

    # -- the API the HTTP layer uses -----------------------------------------------------

    async def submit(
        self, specs: Sequence[JobSpec], *, batch: bool = False, workflow: bool | str = False,
        who: str | None = None,
    ) -> tuple[list[Job], list[bool]]:  # fmt: skip
        """Validate, commit as one atomic change, then make claimable: the jobs (durable
        on return), and which are new (an idempotency key may return an existing job).
        ``workflow``: the jobs are a new workflow's graph (``sqlq.common.workflow``), or,
        a workflow's id, join it. ``who``: the principal whose new queue names they add
        (``sqlq.runtime.names``: fair shares of ``--max-queues``)."""
        if self.state is not RuntimeState.READY:  # (``_check_accepting``, inline: every job)
            self._check_accepting()
        jobs, new = await self.submissions.submit(specs, batch=batch, workflow=workflow, who=who)
        if self._remote_queues:  # a kind sent to a remote queue: is it one a worker runs?
            seen, now, is_remote = self.remote.seen, self.clock.time(), self._is_remote
            for job, fresh in zip(jobs, new, strict=True):
                if fresh and is_remote(job.queue):
                    seen.waiting_kind(job.queue, job.kind, now)
        return jobs, new

    async def workflow(
        self, workflow_id: str, after: str | None = None, limit: int = MAX_PAGE
    ) -> WorkflowView | None:
        """A workflow's view (``GET /workflows/{id}``), its members listed ``limit`` at a time
        from the one after ``after``; None if none of its members is kept (a workflow's id
        has a job id's shape: anything else names none). A cursor past a member this
        workflow does not hold is a 422 naming ``after``."""
        if not 1 <= limit <= MAX_PAGE:
            raise ValidationError("limit", f"must be a whole number from 1 to {MAX_PAGE}")
        if not is_job_id(workflow_id):
            return None
        jobs = await self.store.workflow(workflow_id)
        if not jobs:
            return None
        start = 0
        if after is not None:
            start = next((i + 1 for i, j in enumerate(jobs) if j.id == after), -1)
            if start < 0:
                raise ValidationError("after", "not a member of this workflow (pass `next` back)")
        page = jobs[start : start + limit]
        more = start + limit < len(jobs)
        view = functools.partial(
            workflow_view, workflow_id, jobs, page, cursor(page[-1].id) if more else None
        )
        # Its state and counts walk every member: ~0.2 s at 100,000, on a thread (the
        # members are immutable) so the loop runs meanwhile; a small one costs less here.
        return view() if len(jobs) <= VIEW_ON_LOOP else await asyncio.to_thread(view)

    async def get(self, job_id: str) -> Job | None:
        job = self.live.get(job_id)
        return job if job is not None else await self.store.get(job_id)

    async def wait(self, job_id: str, timeout_s: float) -> Job | None:
        """The job once it is finished, or as it stands after ``timeout_s`` (at most 60)."""
        return await self.waiters.wait(job_id, timeout_s)

    async def list_jobs(self, query: JobQuery) -> list[Job]:
        return await self.store.list_jobs(query)

    async def queues(self) -> dict[str, QueueInfo]:
        return await self.view.queues()

    async def pause(self, queue: str, paused: bool) -> QueueInfo:
        """Pause or resume a queue, durably: running jobs finish, no new ones start."""
        self._check_accepting()
        if paused:  # a pause is durable: one of a name that holds nothing is bounded apart
            async with self._pausing:
                self.submissions.names.check_pause(queue)
                await self.claims.pause(queue, paused)
        else:
            await self.claims.pause(queue, paused)
        return await self.view.queue(queue)

    async def set_policy(self, queue: str, policy: Policy | None) -> QueueInfo:
        """``queue``'s policy from now on, durably (``sqlq.common.fair``; None, or ``{}``:
        none). A policy keeps its queue's name as a pause does: bounded the same way."""
        self._check_accepting()
        async with self._pausing:
            await self._set_policy(queue, policy)
        return await self.view.queue(queue)

    async def _set_policy(self, queue: str, policy: Policy | None) -> None:
        if policy is not None and not policy.plain:
            self.submissions.names.check_policy(queue, self.view.policies())
        await self.claims.set_policy(queue, policy)

    async def set_key_policy(self, queue: str, key: str, override: KeyPolicy | None) -> QueueInfo:
        """One key's override of ``queue``'s per-key limits (None: drop it); read, changed
        and written under the policies' lock, so two overrides at once both land."""
        self._check_accepting()
        async with self._pausing:
            policy = self.view.policies().get(queue) or Policy()
            keys = dict(policy.keys)
            if override is None:
                keys.pop(key, None)
            else:
                if key not in keys and len(keys) >= MAX_OVERRIDES:
                    raise ValidationError("key", f"a queue holds at most {MAX_OVERRIDES} overrides")
                keys[key] = override
            await self._set_policy(queue, msgspec.structs.replace(policy, keys=keys))
        return await self.view.queue(queue)

    def queues_used(self) -> int:
        """The queue names ``--max-queues`` counts now (``sqlq.runtime.names``)."""
        return self.submissions.names.used()

    async def retry(self, job_id: str) -> Job:
        """Put one dead or cancelled job back, due now, with a fresh attempt budget."""
        self._check_accepting()
        job = await self.get(job_id)
        if job is None:
            raise JobNotFoundError(job_id)
        if job.state not in RETRYABLE:
            raise IllegalTransitionError(
                job_id, f"only a dead or cancelled job can be retried; it is {job.state.value}"
            )
        with self.submissions.admission([job], batch=False):
            [revived] = await self.claims.retry([job])
        return revived

    async def retry_matching(self, spec: RetrySpec) -> int:
        """Put back every job that matches, in one durable commit; returns how many."""
        self._check_accepting()
        for _ in range(3):  # a match that changed meanwhile fails the commit: look again
            query = JobQuery(state=State(spec.state), kind=spec.kind, queue=spec.queue)
            matches: list[Job] = []
            while page := await self.store.list_jobs(_next_page(query, matches)):
                matches += page
                if len(page) < MAX_PAGE:
                    break
            matches = _retried_alone(matches)
            if not matches:
                return 0
            try:
                with self.submissions.admission(matches, batch=False):
                    return len(await self.claims.retry(matches))
            except TransitionError:
                continue
        raise IllegalTransitionError("*", "the matching jobs kept changing; try again")

    async def cancel(self, job_id: str, *, force: bool = False) -> Job:
        """Cancel a scheduled job (returned ``cancelled``), or ask a running one to stop
        (returned ``running`` with ``cancel_requested_at``: durable, then its handler is
        told); ``force``: also cut its attempt off after ``--cancel-grace``. A finished
        job: ``IllegalTransitionError``; unknown: ``JobNotFoundError``."""
        self._check_accepting()
        return await self.claims.cancel(job_id, force=force)

    async def cancel_matching(self, spec: CancelSpec) -> tuple[int, int]:
        """Cancel every scheduled job that matches and ask every running one to stop:
        (cancelled, requested). One that finished or moved on meanwhile counts in neither,
        nor does a running one whose cancel was asked for before. Page by page: what it
        holds at once is one page, whatever the number of matches."""
        self._check_accepting()
        states = (
            [State(spec.state)] if spec.state else [State.SCHEDULED, State.WAITING, State.RUNNING]
        )
        cancelled = requested = 0
        for state in states:  # scheduled first: one that starts meanwhile is asked next
            query = JobQuery(state=state, kind=spec.kind, queue=spec.queue)
            seen: list[Job] = []
            while page := await self.store.list_jobs(_next_page(query, seen)):
                seen = page[-1:]  # (the cursor: the last id)
                for i in range(0, len(page), CANCEL_AT_ONCE):  # at once: group-committed
                    chunk = [
                        j for j in page[i : i + CANCEL_AT_ONCE] if j.cancel_requested_at is None
                    ]
                    done, asked = await self._cancel_all(chunk)
                    cancelled, requested = cancelled + done, requested + asked
                if len(page) < MAX_PAGE:
                    break
        return cancelled, requested

    async def _cancel_all(self, jobs: Sequence[Job]) -> tuple[int, int]:
        """Cancel ``jobs`` at once (group-committed): (cancelled, asked to stop). One that
        finished or moved on meanwhile (a workflow's cone cancelled with its parent) counts
        in neither; a store's failure is raised."""
        cancelled = requested = 0
        outcomes = await asyncio.gather(
            *(self.claims.cancel(j.id) for j in jobs), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, Job):
                if outcome.state is State.CANCELLED:
                    cancelled += 1
                else:
                    requested += 1
            elif not isinstance(outcome, TransitionError | JobNotFoundError):
                raise outcome  # the store failed: the client hears of it
        return cancelled, requested

    async def cancel_workflow(self, workflow_id: str) -> tuple[int, int] | None:
        """Cancel every member of a workflow that has not started, and ask every running
        one to stop: (cancelled, requested), counting the members a cancel's cascade took
        too; None if none of its members is kept. The cancels go at once, so the group
        commit writes them together, a chunk at a time."""
        self._check_accepting()
        jobs = await self.store.workflow(workflow_id) if is_job_id(workflow_id) else []
        if not jobs:
            return None
        live = [j for j in jobs if not j.terminal and j.cancel_requested_at is None]
        requested = 0
        for i in range(0, len(live), CANCEL_AT_ONCE):
            requested += (await self._cancel_all(live[i : i + CANCEL_AT_ONCE]))[1]
        after = {j.id: j.state for j in await self.store.workflow(workflow_id)}
        unstarted = (j for j in live if j.state is not State.RUNNING)
        cancelled = sum(1 for j in unstarted if after.get(j.id) is State.CANCELLED)
        return cancelled, requested

    async def retry_workflow(self, workflow_id: str) -> int | None:
        """Revive a workflow's dead members whose parents completed, with the cones their
        deaths cancelled, in one durable commit (``sqlq.common.workflow.retried``): the
        graph then runs on as if they had never failed. How many were revived (their
        cones not counted); None if none of its members is kept."""
        self._check_accepting()
        for _ in range(3):  # a member that changed meanwhile fails the commit: look again
            jobs = await self.store.workflow(workflow_id) if is_job_id(workflow_id) else []
            if not jobs:
                return None
            states = {j.id: j.state.value for j in jobs}
            ids = set(retried(((j.id, j.state.value, j.flow) for j in jobs), states.get))
            dead = [j for j in jobs if j.id in ids]
            if not dead:
                return 0
            try:
                with self.submissions.admission(dead, batch=False):
                    return len(await self.claims.retry(dead))
            except TransitionError:
                continue
        raise IllegalTransitionError(workflow_id, "the workflow kept changing; try again")

    def _check_accepting(self) -> None:
        if self.state is not RuntimeState.READY:
            raise StoreError(f"not accepting work: the server is {self.state.value}")

    def liveness(self) -> tuple[bool, str]:
        """False once the store has failed: only a restart (reopen) can mend that."""
        failed = self.store.stats().failed
        if failed:
            return False, f"store failed: {failed}"
        return True, "alive"

    def abandoned(self) -> int:
        """Cut-off handlers still running: worker tasks not yet ended, and threads."""
        return len(self.pool.abandoned) + self.executor.threads.abandoned

    def readiness(self) -> tuple[bool, str]:
        if self.state is not RuntimeState.READY:
            return False, self.state.value
        alive, reason = self.liveness()
        if not alive:
            return False, reason
        trouble = self.view.trouble()
        if trouble is not None:
            return False, trouble
        if not self.pool.live and self.pool.size > 0:  # (none configured: all remote)
            return False, "no healthy worker"
        abandoned, cap = self.abandoned(), self.config.max_abandoned
        if abandoned > cap:
            return False, f"{abandoned} abandoned handlers still running (cap {cap})"
        return True, "ready"

    def stats(self) -> dict[str, Any]:
        return report.stats(self)
