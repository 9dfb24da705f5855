"""The engine-neutral runtime: recovery, submission, the job lifecycle, stats.

One ``Runtime`` owns a store, a scheduler and a worker pool. Every state change
goes through the store first; only once it is durable does the runtime update
its own view (``live``: the current version of every scheduled or running job)
and tell anyone.

A job's claim (``scheduled -> running``) is awaited before the work starts.
Its outcome (completed, retried or dead) is committed in the background while
the worker takes its next job: nobody is told of the outcome before it is
durable, and a crash in between only means the job runs again (at-least-once,
as the durability contract says, and counted at recovery).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

from common.backoff import RetryPolicy, retry_delay, should_retry
from common.clock import SYSTEM_CLOCK, Clock
from common.cpu import CpuPool, cpu_kind
from common.errors import (
    IllegalTransitionError,
    JobNotFoundError,
    StoreError,
    TransitionError,
    ValidationError,
)
from common.kinds import REGISTRY, JobContext, Kind, Registry
from common.models import JSON, TERMINAL, Job, State, Transition
from common.scheduler import Scheduler
from common.specs import JobSpec
from common.store import JobStore, Recovery
from common.workers import WorkerPool

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    workers: int = 16
    max_attempts: int = 5
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    hb_timeout_s: float = 0.200
    healthcheck: bool = True
    seed: int | None = None
    cpu_processes: int | None = None


class Runtime:
    def __init__(
        self,
        store: JobStore,
        config: RuntimeConfig | None = None,
        *,
        registry: Registry | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.config = config or RuntimeConfig()
        self.clock = clock
        self.cpu = CpuPool(self.config.cpu_processes)
        self.registry = Registry()
        for name in (registry or REGISTRY).names():
            self.registry.register((registry or REGISTRY).get(name))
        if "cpu" not in self.registry.names():
            self.registry.register(cpu_kind(self.cpu))
        self.scheduler = Scheduler(clock, channel_size=self.config.workers)
        self.pool = WorkerPool(
            self,
            workers=self.config.workers,
            hb_timeout_s=self.config.hb_timeout_s,
            healthcheck=self.config.healthcheck,
        )
        self.rng = random.Random(self.config.seed)
        self.live: dict[str, Job] = {}
        self.state = "new"  # new -> recovering -> ready -> stopping -> stopped
        self.recovery: Recovery | None = None
        self.counts: Counter[str] = Counter()  # live jobs by state
        self.totals: Counter[str] = Counter()  # events since this process started
        self._background: set[asyncio.Task[None]] = set()

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> Recovery:
        """Recover, requeue what was running, and start dispatching."""
        self.state = "recovering"
        recovery = await self.store.open()
        self.recovery = recovery
        for job in recovery.jobs:
            self._publish(job)
        now = self.clock.time()
        requeue: list[Transition] = []
        for job_id in recovery.running:
            job = self.live[job_id]
            requeue.append(self._after_failure(job, "interrupted: the server stopped", now))
        if requeue:
            await self.store.commit(requeue)
            for t in requeue:
                self._applied(self.live[t.job_id], t)
            self.totals["requeued_at_recovery"] += len(requeue)
        for job in self.live.values():
            if job.state is State.SCHEDULED:
                self.scheduler.add(job.id, job.ready_at, job.priority)
        self.scheduler.start()
        self.pool.start()
        self.state = "ready"
        log.info("recovery: %s; requeued %d", recovery.summary(), len(requeue))
        return recovery

    async def stop(self, grace_s: float = 10.0) -> None:
        if self.state in ("stopping", "stopped"):
            return
        self.state = "stopping"
        await self.scheduler.stop()
        await self.pool.stop(grace_s)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        self.cpu.shutdown()
        await self.store.close()
        self.state = "stopped"

    # -- the API the HTTP layer uses -----------------------------------------------------

    def build(self, spec: JobSpec, now: float) -> Job:
        """A new job from a client's spec; raises ``ValidationError`` naming the field."""
        kind: Kind = self.registry.get(spec.kind)
        args = kind.validate(spec.args)
        if spec.delay_ms is not None and spec.run_at is not None:
            raise ValidationError("run_at", "give delay_ms or run_at, not both")
        ready_at = now
        if spec.delay_ms is not None:
            ready_at = now + spec.delay_ms / 1000
        elif spec.run_at is not None:
            ready_at = spec.run_at
        return Job.new(
            kind=spec.kind,
            args=args,
            now=now,
            ready_at=ready_at,
            max_attempts=spec.max_attempts or self.config.max_attempts,
            priority=spec.priority,
        )

    def _build_all(self, specs: Sequence[JobSpec], now: float, batch: bool) -> list[Job]:
        jobs = []
        for i, spec in enumerate(specs):
            try:
                jobs.append(self.build(spec, now))
            except ValidationError as exc:
                if not batch:
                    raise
                raise ValidationError(f"jobs[{i}].{exc.field}", exc.message) from None
        return jobs

    async def submit(self, specs: Sequence[JobSpec], *, batch: bool = False) -> list[Job]:
        """Validate, commit as one atomic change, then schedule. Durable on return."""
        self._check_accepting()
        now = self.clock.time()
        jobs = self._build_all(specs, now, batch)
        await self.store.commit(jobs)
        for job in jobs:
            self._publish(job)
            self.scheduler.add(job.id, job.ready_at, job.priority)
        self.totals["submitted"] += len(jobs)
        return jobs

    async def get(self, job_id: str) -> Job | None:
        job = self.live.get(job_id)
        return job if job is not None else await self.store.get(job_id)

    async def cancel(self, job_id: str) -> Job:
        self._check_accepting()
        job = self.live.get(job_id)
        if job is None:
            if await self.store.get(job_id) is None:
                raise JobNotFoundError(job_id)
            raise IllegalTransitionError(job_id, "only a scheduled job can be cancelled")
        if job.state is not State.SCHEDULED:
            raise IllegalTransitionError(job_id, f"a {job.state.value} job cannot be cancelled")
        t = job.cancel(self.clock.time())
        await self.store.commit([t])
        return self._applied(job, t)

    def _check_accepting(self) -> None:
        if self.state != "ready":
            raise StoreError(f"not accepting work: the server is {self.state}")

    def readiness(self) -> tuple[bool, str]:
        if self.state != "ready":
            return False, self.state
        failed = self.store.stats().get("failed")
        if failed:
            return False, f"store failed: {failed}"
        if not self.pool.live:
            return False, "no healthy worker"
        return True, "ready"

    def stats(self) -> dict[str, Any]:
        jobs = {s.value: self.counts[s.value] for s in State if s not in TERMINAL}
        jobs.update({s.value: self.totals[s.value] for s in TERMINAL})
        return {
            "state": self.state,
            "jobs": jobs,
            "terminal_counts_are": "since this process started",
            "submitted": self.totals["submitted"],
            "retried": self.totals["retried"],
            "requeued_hung": self.totals["requeued_hung"],
            "requeued_at_recovery": self.totals["requeued_at_recovery"],
            "fenced": self.totals["fenced"],
            "workers": self.pool.stats(),
            "lanes": self.scheduler.sizes(),
            "store": self.store.stats(),
            "recovery": self.recovery.summary() if self.recovery else None,
        }

    # -- the API the workers use ------------------------------------------------------------

    def rng_for_job(self) -> random.Random:
        return self.rng

    async def take(self) -> str:
        return await self.scheduler.take()

    async def claim(self, job_id: str) -> Job | None:
        job = self.live.get(job_id)
        if job is None or job.state is not State.SCHEDULED:
            return None  # cancelled (or otherwise moved on) while it waited
        t = job.start(self.clock.time())
        try:
            await self.store.commit([t])
        except TransitionError:
            return None
        return self._applied(job, t)

    def execute(self, job: Job, ctx: JobContext) -> Awaitable[JSON]:
        return self.registry.get(job.kind).run(job.args, ctx)

    def succeeded(self, job: Job, result: JSON) -> None:
        self._in_background(job, job.complete(result, self.clock.time()))

    def failed(self, job: Job, error: str) -> None:
        self._in_background(job, self._after_failure(job, error, self.clock.time()))

    def hung(self, job: Job) -> None:
        t = self._after_failure(job, "worker hung: no heartbeat", self.clock.time())
        self.totals["requeued_hung"] += 1
        self._in_background(job, t)

    # -- internals ----------------------------------------------------------------------------

    def _after_failure(self, job: Job, error: str, now: float) -> Transition:
        if should_retry(job.attempts, job.max_attempts, self.config.retry):
            delay = retry_delay(job.attempts, self.config.retry, self.rng)
            return job.retry(error, now + delay, now)
        return job.bury(error, now)

    def _in_background(self, job: Job, t: Transition) -> None:
        task = asyncio.create_task(self._commit_outcome(job, t))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _commit_outcome(self, job: Job, t: Transition) -> None:
        try:
            await self.store.commit([t])
        except TransitionError:
            self.totals["fenced"] += 1  # a stale worker: the job was requeued meanwhile
            return
        except StoreError as exc:
            log.error("could not record the outcome of job %s: %s", job.id, exc)
            return
        self._applied(job, t)
        if t.state is State.SCHEDULED:
            self.totals["retried"] += 1
            self.scheduler.add(job.id, t.ready_at, job.priority)

    def _applied(self, job: Job, t: Transition) -> Job:
        new = job.apply(t)
        self._publish(new, job)
        return new

    def _publish(self, new: Job, old: Job | None = None) -> None:
        if old is not None:
            self.counts[old.state.value] -= 1
        if new.state in TERMINAL:
            self.live.pop(new.id, None)
            self.totals[new.state.value] += 1
        else:
            self.live[new.id] = new
            self.counts[new.state.value] += 1
