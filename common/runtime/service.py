"""The engine-neutral runtime: recovery, submission, the job lifecycle, stats.

One ``Runtime`` owns a store, a scheduler and a worker pool. Every state change
goes through the store first; only once it is durable does the runtime update
its own view (``live``: the current version of every scheduled or running job)
and tell anyone.

A job's claim (``scheduled -> running``) is committed while the work starts,
and its outcome (completed, retried or dead) is committed after the claim is
durable, in the background while the worker takes its next job. Nobody is told
of either before it is durable. A crash before the claim is durable leaves the
job ``scheduled``; after, ``running`` and requeued at recovery: either way the
job runs again, which is the at-least-once delivery the durability contract
promises (and counts). If the claim is refused, the outcome is dropped and
counted as fenced. Waiting for the claim before working cost about 1 ms of a
20 ms job (an fdatasync round trip), measured.

A cancel and a claim of the same job can race. While a claim is in flight the
job may already be running, so a cancel then answers 409 ``running``; while a
cancel is in flight, workers skip the job (and put it back if the cancel fails).
So a job reported cancelled never starts.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

from common.backoff import RetryPolicy, retry_delay, should_retry
from common.clock import SYSTEM_CLOCK, Clock
from common.errors import (
    IllegalTransitionError,
    JobNotFoundError,
    JobRunningError,
    QueueFullError,
    StoreError,
    TransitionError,
    UnencodableError,
    ValidationError,
)
from common.models import JSON, TERMINAL, Job, State, Transition
from common.runtime.cpu import CpuPool, cpu_kind
from common.runtime.kinds import REGISTRY, HandlerThreads, JobContext, Kind, Registry, sleep_kind
from common.runtime.scheduler import Scheduler
from common.runtime.workers import WorkerPool
from common.specs import MAX_DELAY_MS, JobSpec
from common.store import JobStore, Recovery

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
    cpu_beat_while_queued: bool = True
    compact_every_s: float = 300.0  # prune past retention and compact; 0 turns it off
    fault_injection: bool = False  # accept sleep's fail_prob / hang_prob (tests, benchmarks)
    max_queued: int = 1_000_000  # live jobs; a submission past it is refused (429)
    max_abandoned: int = 100  # cut-off handlers still running; past it, /readyz is 503
    handler_threads: int | None = None  # the sync handlers' pool; default: one per worker


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
        self.cpu = CpuPool(
            self.config.cpu_processes, beat_while_queued=self.config.cpu_beat_while_queued
        )
        self.threads = HandlerThreads(
            (self.config.handler_threads or self.config.workers) + self.config.max_abandoned
        )
        self.registry = Registry()
        source = registry or REGISTRY
        for name in source.names():
            self.registry.register(source.get(name))
        for builtin in (
            sleep_kind(fault_injection=self.config.fault_injection),
            cpu_kind(self.cpu),
        ):
            if builtin.name not in self.registry:
                self.registry.register(builtin)
        # Per kind: (heartbeat timeout, timeout) in seconds, "server" resolved.
        self._limits: dict[str, tuple[float | None, float | None]] = {
            name: self._resolve_limits(self.registry.get(name)) for name in self.registry.names()
        }
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
        self._claiming: set[str] = set()  # claims committed but not yet durable
        self._cancelling: set[str] = set()  # cancels committed but not yet durable
        self._skipped: set[str] = set()  # taken by a worker while its cancel was in flight
        self._admitting = 0  # jobs in submissions not yet durable, for --max-queued
        self._maintenance: asyncio.Task[None] | None = None

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
        if self.config.compact_every_s > 0:
            self._maintenance = asyncio.create_task(self._maintain(), name="sqlq-maintenance")
        self.state = "ready"
        log.info("recovery: %s; requeued %d", recovery.summary(), len(requeue))
        return recovery

    async def stop(self, grace_s: float = 10.0) -> None:
        if self.state in ("stopping", "stopped"):
            return
        self.state = "stopping"
        if self._maintenance is not None:
            self._maintenance.cancel()
            await asyncio.gather(self._maintenance, return_exceptions=True)
        await self.scheduler.stop()
        await self.pool.stop(grace_s)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        self.cpu.shutdown()
        self.threads.shutdown()
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
            if spec.run_at > now + MAX_DELAY_MS / 1000:
                raise ValidationError("run_at", "more than a year and a day from now")
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
        limit = self.config.max_queued
        if len(self.live) + self._admitting + len(jobs) > limit:
            self.totals["refused_full"] += len(jobs)
            raise QueueFullError(limit)
        self._admitting += len(jobs)
        try:
            await self.store.commit(jobs)
        finally:
            self._admitting -= len(jobs)
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
        if job_id in self._claiming:
            raise JobRunningError(job_id, "a worker has claimed it and it may be running")
        if job_id in self._cancelling:
            raise IllegalTransitionError(job_id, "a cancel of this job is already in flight")
        t = job.cancel(self.clock.time())
        self._cancelling.add(job_id)
        try:
            await self.store.commit([t])
        except BaseException:
            if job_id in self._skipped:  # a worker passed it over meanwhile: put it back
                self.scheduler.add(job.id, job.ready_at, job.priority)
            raise
        finally:
            self._cancelling.discard(job_id)
            self._skipped.discard(job_id)
        return self._applied(job, t)

    def _check_accepting(self) -> None:
        if self.state != "ready":
            raise StoreError(f"not accepting work: the server is {self.state}")

    def liveness(self) -> tuple[bool, str]:
        """False once the store has failed: only a restart (reopen) can mend that."""
        failed = self.store.stats().failed
        if failed:
            return False, f"store failed: {failed}"
        return True, "alive"

    def abandoned(self) -> int:
        """Cut-off handlers still running: worker tasks not yet ended, and threads."""
        return len(self.pool.abandoned) + self.threads.abandoned

    def readiness(self) -> tuple[bool, str]:
        if self.state != "ready":
            return False, self.state
        alive, reason = self.liveness()
        if not alive:
            return False, reason
        if not self.pool.live:
            return False, "no healthy worker"
        abandoned, cap = self.abandoned(), self.config.max_abandoned
        if abandoned > cap:
            return False, f"{abandoned} abandoned handlers still running (cap {cap})"
        return True, "ready"

    def stats(self) -> dict[str, Any]:
        jobs = {s.value: self.counts[s.value] for s in State if s not in TERMINAL}
        jobs.update({s.value: self.totals[s.value] for s in TERMINAL})
        return {
            "state": self.state,
            "durable": self.store.durable,
            "jobs": jobs,
            "terminal_counts_are": "since this process started",
            "submitted": self.totals["submitted"],
            "retried": self.totals["retried"],
            "requeued_hung": self.totals["requeued_hung"],
            "requeued_at_recovery": self.totals["requeued_at_recovery"],
            "fenced": self.totals["fenced"],
            "unencodable_results": self.totals["unencodable"],
            "refused_queue_full": self.totals["refused_full"],
            "max_queued": self.config.max_queued,
            "workers": {
                **self.pool.stats(),
                "handler_threads": self.threads.size,
                "abandoned_threads_running": self.threads.abandoned,
                "abandoned_threads_total": self.threads.abandoned_total,
                "max_abandoned": self.config.max_abandoned,
            },
            "lanes": self.scheduler.sizes(),
            "store": self.store.stats().to_dict(),
            "recovery": self.recovery.summary() if self.recovery else None,
            "process_cpu_s": round(time.process_time(), 3),
        }

    # -- the API the workers use ------------------------------------------------------------

    def rng_for_job(self) -> random.Random:
        return self.rng

    async def take(self) -> str:
        return await self.scheduler.take()

    def claim(self, job_id: str) -> tuple[Job, asyncio.Future[bool]] | None:
        """The running job and a future for its claim's durability, or None."""
        job = self.live.get(job_id)
        if job is None or job.state is not State.SCHEDULED or job_id in self._claiming:
            return None  # cancelled (or otherwise moved on) while it waited
        if job_id in self._cancelling:
            self._skipped.add(job_id)  # the cancel decides: re-added if it fails
            return None
        t = job.start(self.clock.time())
        self._claiming.add(job_id)
        claimed = asyncio.ensure_future(self._commit_claim(job, t))
        return job.apply(t), claimed

    async def _commit_claim(self, job: Job, t: Transition) -> bool:
        try:
            await self.store.commit([t])
        except TransitionError:
            return False
        except StoreError as exc:
            log.error("could not claim job %s: %s", job.id, exc)
            return False
        finally:
            self._claiming.discard(job.id)
        self._applied(job, t)
        return True

    def _resolve_limits(self, kind: Kind) -> tuple[float | None, float | None]:
        hb = self.config.hb_timeout_s if kind.hb_timeout_s == "server" else kind.hb_timeout_s
        return hb, kind.timeout_s

    def context(self, job: Job) -> JobContext:
        """The handler's context, with the limits of its kind (unknown kind: the server's)."""
        hb, timeout = self._limits.get(job.kind, (self.config.hb_timeout_s, None))
        return JobContext(job, self.rng, threads=self.threads, hb_timeout=hb, timeout=timeout)

    def execute(self, job: Job, ctx: JobContext) -> Awaitable[JSON]:
        return self.registry.get(job.kind).run(job.args, ctx)

    def succeeded(self, job: Job, result: JSON, claimed: asyncio.Future[bool]) -> None:
        self._in_background(job, job.complete(result, self.clock.time()), claimed)

    def failed(self, job: Job, error: str, claimed: asyncio.Future[bool]) -> None:
        self._in_background(job, self._after_failure(job, error, self.clock.time()), claimed)

    def hung(self, job: Job, claimed: asyncio.Future[bool], reason: str) -> None:
        t = self._after_failure(job, reason, self.clock.time())
        self.totals["requeued_hung"] += 1
        self._in_background(job, t, claimed)

    async def _maintain(self) -> None:
        """Prune finished jobs past retention and compact, every ``compact_every_s``."""
        while True:
            await asyncio.sleep(self.config.compact_every_s)
            try:
                report = await self.store.compact()
            except StoreError as exc:
                log.error("periodic compaction failed: %s", exc)
                continue
            self.totals["compactions"] += 1
            log.info(
                "compacted: pruned %d jobs, %d -> %d bytes",
                report.jobs_pruned,
                report.bytes_before,
                report.bytes_after,
            )

    # -- internals ----------------------------------------------------------------------------

    def _after_failure(self, job: Job, error: str, now: float) -> Transition:
        if should_retry(job.attempts, job.max_attempts, self.config.retry):
            delay = retry_delay(job.attempts, self.config.retry, self.rng)
            return job.retry(error, now + delay, now)
        return job.bury(error, now)

    def _in_background(self, job: Job, t: Transition, claimed: asyncio.Future[bool]) -> None:
        task = asyncio.create_task(self._commit_outcome(job, t, claimed))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _commit_outcome(self, job: Job, t: Transition, claimed: asyncio.Future[bool]) -> None:
        if not await claimed:
            self.totals["fenced"] += 1  # the claim was refused: this run never counted
            return
        try:
            try:
                await self.store.commit([t])
            except UnencodableError as exc:
                # The handler returned something JSON cannot hold: that attempt
                # failed, like any other failure; the store is untouched.
                self.totals["unencodable"] += 1
                error = f"result is not JSON-serialisable: {exc.what}"
                t = self._after_failure(job, error, self.clock.time())
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
