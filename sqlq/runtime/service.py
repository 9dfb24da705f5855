"""``Service``: what the HTTP layer calls, and the lifecycle of everything behind it.

The data flow, left to right::

    HTTP -> Service -> Claims (LocalClaims: scheduler + lanes) -> JobStore
                          ^
               WorkerPool -> Executor -> the job's kind

The service validates submissions against the kinds, commits them (durable on
return), and hands them to ``Claims``; workers take claims and report outcomes
there; the executor runs each job by its kind. Every state change goes through
the store first, and only once it is durable does anyone hear of it.

The kinds (a ``Registry``) and the CPU pool are built by the caller (the CLI)
and handed in; the service owns them from then on and shuts the pool down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any, cast

from prometheus_client.core import Metric

from sqlq.common.clock import SYSTEM_CLOCK, Clock
from sqlq.common.engine.base import collector_off
from sqlq.common.errors import (
    DuplicateKeyError,
    IdempotencyConflictError,
    IllegalTransitionError,
    JobNotFoundError,
    QueueFullError,
    StoreError,
    TransitionError,
    ValidationError,
)
from sqlq.common.models import RETRYABLE, TERMINAL, Job, State
from sqlq.common.specs import MAX_DELAY_MS, JobSpec, RetrySpec, check_args
from sqlq.common.store import MAX_PAGE, CompactionReport, JobQuery, JobStore, Recovery, SharedStore
from sqlq.runtime.claims import Claims, LocalClaims, QueueInfo
from sqlq.runtime.config import RuntimeConfig, RuntimeState
from sqlq.runtime.cpu import CpuPool
from sqlq.runtime.executor import Executor, build_registry
from sqlq.runtime.kinds import REGISTRY, Registry
from sqlq.runtime.live import LiveJobs
from sqlq.runtime.metrics import Metrics, gauge
from sqlq.runtime.shared import SharedClaims
from sqlq.runtime.workers import WorkerPool

MAX_WAIT_S = 60.0
WAIT_POLL_S = 0.1  # shared mode: how often this node looks at the jobs GET ?wait= waits on
MAX_WAIT_IDS = 1000  # job ids in one statement of that look

log = logging.getLogger(__name__)


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
        kinds: Registry | None = None,
        cpu: CpuPool | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """``kinds``: the user's handlers (default: what ``@task`` registered); the
        built-in ``sleep`` and ``cpu`` kinds are added unless a user kind takes a name."""
        self.store = store
        self.config = config = config or RuntimeConfig()
        self.clock = clock
        self.cpu = cpu or CpuPool(
            config.cpu_processes, beat_while_queued=config.cpu_beat_while_queued
        )
        rng = random.Random(config.seed)
        all_kinds = build_registry(
            kinds or REGISTRY, fault_injection=config.fault_injection, cpu=self.cpu
        )
        self.live = LiveJobs()
        self.metrics = Metrics(limit=2 * config.max_queues)
        self.claims: Claims
        if store.shared:  # the queue is the database's: claims are made there
            self.claims = SharedClaims(
                cast(SharedStore, store), self.live, config, clock=clock, rng=rng,
                metrics=self.metrics,
            )  # fmt: skip
        else:
            self.claims = LocalClaims(
                store, self.live, config, clock=clock, rng=rng, metrics=self.metrics
            )
        self.metrics.live_queues = self.claims.live_queues  # a gone queue's series go
        store.observe_batches(self.metrics.batch_written)
        self.metrics.gauges(self._gauges)
        self.executor = Executor(all_kinds, config, rng=rng, clock=clock)
        self.pool = WorkerPool(
            self.claims,
            self.executor,
            workers=config.workers,
            hb_timeout_s=config.hb_timeout_s,
            healthcheck=config.healthcheck,
            clock=clock,
        )
        self.state = RuntimeState.NEW
        self.recovery: Recovery | None = None
        self._admitting = 0  # jobs in submissions not yet durable, for --max-queued
        self._new_queues: Counter[str] = Counter()  # their new queue names, for --max-queues
        self._maintenance: asyncio.Task[None] | None = None
        self._keys: dict[str, asyncio.Future[None]] = {}  # idempotency keys being submitted
        self._waiters: dict[str, list[asyncio.Future[Job | None]]] = {}  # GET ?wait=, by job id
        self._wait_poll: asyncio.Task[None] | None = None  # shared mode: see _poll_waited
        self.last_compaction: tuple[float, CompactionReport] | None = None  # (wall time, report)
        self.live.on_finished = self._finished

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> Recovery:
        """Recover, requeue what was running, and start dispatching."""
        self.state = RuntimeState.RECOVERING
        with collector_off():  # see there: recovery allocates, and frees nothing
            recovery = await self.store.open()
            self.recovery = recovery
            await self.claims.start(recovery)
        self.pool.start()
        if self.config.compact_every_s > 0:
            self._maintenance = asyncio.create_task(self._maintain(), name="sqlq-maintenance")
        self.state = RuntimeState.READY
        totals = self.live.totals
        log.info(
            "recovery: %s; requeued %d, dead (on their last attempt) %d",
            recovery.summary(), totals["requeued_at_recovery"], totals["dead_at_recovery"],
        )  # fmt: skip
        return recovery

    async def stop(self, grace_s: float = 10.0) -> None:
        if self.state in (RuntimeState.STOPPING, RuntimeState.STOPPED):
            return
        self.state = RuntimeState.STOPPING
        if self._wait_poll is not None:
            self._wait_poll.cancel()
        if self._maintenance is not None:
            self._maintenance.cancel()
            await asyncio.gather(self._maintenance, return_exceptions=True)
        await self.claims.stop()
        await self.pool.stop(grace_s)
        await self.claims.drain()
        self.cpu.shutdown()
        self.executor.shutdown()
        await self.store.close()
        self.state = RuntimeState.STOPPED

    # -- the API the HTTP layer uses -----------------------------------------------------

    def build(self, spec: JobSpec, now: float) -> Job:
        """A new job from a client's spec; raises ``ValidationError`` naming the field."""
        check_args(spec.args)  # HTTP checked the bytes; a spec built in Python is checked here
        args = self.executor.kinds.get(spec.kind).validate(spec.args)
        if spec.delay_ms is not None and spec.run_at is not None:
            raise ValidationError("run_at", "give delay_ms or run_at, not both")
        ready_at = now
        if spec.delay_ms is not None:
            ready_at = now + spec.delay_ms / 1000
        elif spec.run_at is not None:
            if spec.run_at > now + MAX_DELAY_MS / 1000:
                raise ValidationError("run_at", "more than a year and a day from now")
            ready_at = spec.run_at
        key = spec.idempotency_key
        return Job.new(
            kind=spec.kind,
            args=args,
            now=now,
            ready_at=ready_at,
            max_attempts=spec.max_attempts or self.config.max_attempts,
            priority=spec.priority,
            queue=spec.queue,
            idempotency_key=key,
            request_hash=None if key is None else spec.request_hash(),
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
        """Validate, commit as one atomic change, then make claimable. Durable on return."""
        jobs, _ = await self.submit_idempotent(specs, batch=batch)
        return jobs

    async def submit_idempotent(
        self, specs: Sequence[JobSpec], *, batch: bool = False
    ) -> tuple[list[Job], list[bool]]:
        """Like ``submit``, honouring idempotency keys: the jobs, and which are new.

        A spec whose key a retained job already holds gets that job back (not
        new) if it asks for the same thing, and ``IdempotencyConflictError``
        otherwise. Keys are reserved in this process for the length of the
        check and the commit, so two concurrent requests with one key make one job.
        """
        self._check_accepting()
        keyed = {i: s.idempotency_key for i, s in enumerate(specs) if s.idempotency_key}
        if not keyed:
            return (jobs := await self._submit_new(specs, batch)), [True] * len(jobs)
        seen: dict[str, int] = {}
        for i, key in keyed.items():
            if key in seen:
                raise ValidationError(f"jobs[{i}].idempotency_key", "appears twice in this batch")
            seen[key] = i
        reservation = await self._reserve(list(seen))
        try:
            # Twice at most: a shared store's other nodes reserve nothing here, so a key
            # may be taken between the look-up and the insert; then look again.
            for last in (False, True):
                existing: dict[int, Job] = {}
                for i, key in keyed.items():
                    job = await self.store.find_key(key)
                    if job is not None:
                        if job.request_hash != specs[i].request_hash():
                            raise IdempotencyConflictError(key, job.id)
                        existing[i] = job
                new = [s for i, s in enumerate(specs) if i not in existing]
                try:
                    made = iter(await self._submit_new(new, batch) if new else [])
                except DuplicateKeyError as exc:
                    if last or not self.store.shared:
                        raise IdempotencyConflictError(exc.key, "?") from exc
                    continue
                jobs = [existing[i] if i in existing else next(made) for i in range(len(specs))]
                return jobs, [i not in existing for i in range(len(specs))]
            raise AssertionError("unreachable")
        finally:
            for key in seen:
                del self._keys[key]
            reservation.set_result(None)

    async def _reserve(self, keys: list[str]) -> asyncio.Future[None]:
        """Hold ``keys`` for one submission; waits while another holds any of them."""
        while busy := [self._keys[k] for k in keys if k in self._keys]:
            await asyncio.wait(busy)
        reservation: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for k in keys:
            self._keys[k] = reservation
        return reservation

    async def _submit_new(self, specs: Sequence[JobSpec], batch: bool) -> list[Job]:
        jobs = self._build_all(specs, self.clock.time(), batch)
        with self._admission(jobs, batch):
            await self.store.commit(jobs)
        self.claims.submitted(jobs)
        self.live.totals["submitted"] += len(jobs)
        for job in jobs:
            self.metrics.event("submitted", job)
        return jobs

    @contextlib.contextmanager
    def _admission(self, jobs: Sequence[Job], batch: bool) -> Iterator[None]:
        """Admit ``jobs`` as live under ``--max-queued`` and ``--max-queues``, holding their
        place (and their new queue names) until the commit that makes them live is over.
        Submissions and retries alike: both add live jobs, perhaps in new queues."""
        limit = self.config.max_queued
        if self.claims.backlog() + self._admitting + len(jobs) > limit:
            self.live.totals["refused_full"] += len(jobs)
            raise QueueFullError(limit)
        new = self._new_queues_of(jobs, batch)
        self._admitting += len(jobs)
        try:
            with self._holding(new):
                yield
        finally:
            self._admitting -= len(jobs)

    @contextlib.contextmanager
    def _holding(self, new: list[str]) -> Iterator[None]:
        """Count the queue names ``new`` as used while a commit that may add them runs."""
        self._new_queues.update(new)
        try:
            yield
        finally:
            self._new_queues.subtract(new)
            for queue in new:
                if self._new_queues[queue] <= 0:
                    del self._new_queues[queue]

    def _new_queues_of(self, jobs: Sequence[Job], batch: bool) -> list[str]:
        """The queue names ``jobs`` would add (``--max-queues``); ``ValidationError`` naming
        the field of the first job past the bound."""
        claims, pending = self.claims, self._new_queues
        new: list[str] = []
        for i, job in enumerate(jobs):
            queue = job.queue
            if queue in pending or claims.in_use(queue) or queue in new:
                continue
            self._check_new_queue(f"jobs[{i}].queue" if batch else "queue", len(new))
            new.append(queue)
        return new

    def _check_new_queue(self, field: str, more: int = 0) -> None:
        """One more queue (with ``more`` already counted in this request) must fit."""
        limit = self.config.max_queues
        if self.claims.queues_used() + len(self._new_queues) + more + 1 > limit:
            raise ValidationError(
                field, f"would be one more than --max-queues ({limit}) queues with live jobs "
                "or paused; use an existing queue, or wait for one to empty",
            )  # fmt: skip

    async def get(self, job_id: str) -> Job | None:
        job = self.live.get(job_id)
        return job if job is not None else await self.store.get(job_id)

    async def wait(self, job_id: str, timeout_s: float) -> Job | None:
        """The job once it is finished, or as it stands after ``timeout_s`` (at most 60).

        Woken by this node's own outcomes (``_finished``). In shared mode another node
        may finish the job, and nobody here is told: then one poll per node
        (``_poll_waited``) looks at every job waited on here at once.
        """
        if timeout_s <= 0:
            return await self.get(job_id)
        waiter: asyncio.Future[Job | None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(job_id, []).append(waiter)  # before the look: no wake lost
        try:
            job = await self.get(job_id)
            if job is None or job.terminal:
                return job
            if self.store.shared and (self._wait_poll is None or self._wait_poll.done()):
                self._wait_poll = asyncio.create_task(self._poll_waited(), name="sqlq-wait-poll")
            try:
                return await asyncio.wait_for(waiter, min(timeout_s, MAX_WAIT_S))
            except TimeoutError:
                pass
        finally:
            waiting = self._waiters.get(job_id)
            if waiting is not None and waiter in waiting:
                waiting.remove(waiter)
                if not waiting:
                    del self._waiters[job_id]
        return await self.get(job_id)

    async def _poll_waited(self) -> None:
        """Shared mode, while anyone here waits: every ``WAIT_POLL_S``, one statement (per
        ``MAX_WAIT_IDS``) for the jobs waited on that are finished, on whichever node;
        not one per waiting request."""
        store = cast(SharedStore, self.store)
        while self._waiters:
            await asyncio.sleep(WAIT_POLL_S)
            ids = list(self._waiters)
            for start in range(0, len(ids), MAX_WAIT_IDS):
                try:
                    finished = await store.finished(ids[start : start + MAX_WAIT_IDS])
                except StoreError as exc:
                    log.warning("could not look at the jobs waited on: %s", exc)
                    break
                except Exception:  # a bug must not leave every waiter to its timeout
                    log.exception("the poll for waited-on jobs failed; it goes on")
                    break
                for job in finished:
                    self._finished(job)

    def _finished(self, job: Job) -> None:
        for waiter in self._waiters.pop(job.id, ()):
            if not waiter.done():
                waiter.set_result(job)

    async def list_jobs(self, query: JobQuery) -> list[Job]:
        return await self.store.list_jobs(query)

    async def queues(self) -> dict[str, QueueInfo]:
        return await self.claims.queues()

    async def pause(self, queue: str, paused: bool) -> QueueInfo:
        """Pause or resume a queue, durably: running jobs finish, no new ones start."""
        self._check_accepting()
        new = [queue] if paused and not self.claims.in_use(queue) else []
        if new:  # a pause is durable: it counts too, and holds its name while it commits
            self._check_new_queue("queue")
        with self._holding(new):
            await self.claims.pause(queue, paused)
        return await self.claims.queue(queue)

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
        with self._admission([job], batch=False):
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
            if not matches:
                return 0
            try:
                with self._admission(matches, batch=False):
                    return len(await self.claims.retry(matches))
            except TransitionError:
                continue
        raise IllegalTransitionError("*", "the matching jobs kept changing; try again")

    async def cancel(self, job_id: str) -> Job:
        self._check_accepting()
        return await self.claims.cancel(job_id)

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
        if not self.pool.live:
            return False, "no healthy worker"
        abandoned, cap = self.abandoned(), self.config.max_abandoned
        if abandoned > cap:
            return False, f"{abandoned} abandoned handlers still running (cap {cap})"
        return True, "ready"

    def stats(self) -> dict[str, Any]:
        counts, totals = self.live.counts, self.live.totals
        jobs = {s.value: counts[s.value] for s in State if s not in TERMINAL}
        if self.store.shared:  # the queue's, on every node, as of the last count
            for (state, _queue), n in self.claims.census().items():
                jobs[state] += n
        jobs.update({s.value: totals[s.value] for s in TERMINAL})
        threads = self.executor.threads
        return {
            "state": self.state.value,
            "durable": self.store.durable,
            "jobs": jobs,
            "terminal_counts_are": "since this process started",
            "submitted": totals["submitted"],
            "retried": totals["retried"],
            "requeued_hung": totals["requeued_hung"],
            "requeued_at_recovery": totals["requeued_at_recovery"],
            "dead_at_recovery": totals["dead_at_recovery"],  # interrupted on their last attempt
            "fenced": totals["fenced"],
            "claim_failed": totals["claim_failed"],
            "unencodable_results": totals["unencodable"],
            "refused_queue_full": totals["refused_full"],
            "max_queued": self.config.max_queued,
            "max_queues": self.config.max_queues,
            "queues_used": self.claims.queues_used(),
            "workers": {
                **self.pool.stats(),
                "handler_threads": threads.size,
                "abandoned_threads_running": threads.abandoned,
                "abandoned_threads_total": threads.abandoned_total,
                "max_abandoned": self.config.max_abandoned,
            },
            **self.claims.stats(),
            "store": self.store.stats().to_dict(),
            "recovery": self.recovery.summary() if self.recovery else None,
            "process_cpu_s": round(time.process_time(), 3),
        }

    def _gauges(self) -> Iterator[Metric]:
        """What /metrics reads at scrape time: live jobs, workers, recovery."""
        yield gauge(
            "sqlq_jobs_live", "Scheduled and running jobs (in shared mode, on every node).",
            ["state", "queue"], {k: float(n) for k, n in self.claims.census().items()},
        )  # fmt: skip
        pool = self.pool
        yield gauge(
            "sqlq_workers", "Workers: busy, live, hung (declared), replaced, abandoned.",
            ["status"],
            {("busy",): pool.busy(), ("live",): len(pool.live), ("hung",): pool.declared_hung,
             ("replaced",): pool.replaced, ("abandoned",): self.abandoned()},
        )  # fmt: skip
        rec = self.recovery
        yield gauge("sqlq_recovery_seconds", "How long this start's recovery took.", [],
                    {(): rec.seconds if rec else 0.0})  # fmt: skip
        yield gauge("sqlq_recovery_records", "Records (walq lines, SQLite rows) recovery read.",
                    [], {(): float(rec.records) if rec else 0.0})  # fmt: skip

    async def _maintain(self) -> None:
        """Prune finished jobs past retention and compact, every ``compact_every_s``."""
        while True:
            await asyncio.sleep(self.config.compact_every_s)
            try:
                report = await self.store.compact()
            except StoreError as exc:
                log.error("periodic compaction failed: %s", exc)
                continue
            self.live.totals["compactions"] += 1
            self.last_compaction = (self.clock.time(), report)
            log.info(
                "compacted: pruned %d jobs, %d -> %d bytes",
                report.jobs_pruned,
                report.bytes_before,
                report.bytes_after,
            )
