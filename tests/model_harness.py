"""The model machine's harness: one ``Service`` on the injected clock, and the checks.

``ServiceHarness`` owns the event loop, the store and service plumbing, what the
model predicts (due jobs, failed attempts) and the invariant that the store's
records, the live view and the lanes equal the model after every step. The
rules that drive it are in ``tests/model_process.py`` and ``tests/model_machine.py``.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from hypothesis.stateful import RuleBasedStateMachine, invariant

from sqlq.common import models
from sqlq.common.clock import FakeClock
from sqlq.common.errors import StoreError
from sqlq.common.models import TRANSITIONS, Job, State
from sqlq.common.store import MAX_PAGE, JobQuery, JobStore
from sqlq.engines.registry import ENGINES, make_store
from sqlq.runtime.claims import Claim
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.local import LocalClaims
from sqlq.runtime.service import Service
from sqlq.runtime.shared import SharedClaims
from sqlq.walq.store import WalStore
from tests.helpers import NOW
from tests.model_expected import (
    CLAIM_WITHIN_S,
    DEFAULT_ATTEMPTS,
    LEASE_S,
    LIVE,
    QUEUES,
    RETENTION_S,
    RETRY,
    WAIVE,
    Expected,
    _empty,
    registry,
)
from tests.powerloss import SimDisk

T = TypeVar("T")


class ServiceHarness(RuleBasedStateMachine):
    """One ``Service`` and the model beside it: plumbing, predictions and the invariants
    (the rules are in ``ProcessRules`` and ``ServiceModel``)."""

    engine = "memory"
    dsn: Callable[[], str] | None = None

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        models._ID_BITS.seed(0)  # the same ids on every run of an example: hypothesis replays
        self.clock = FakeClock(NOW)
        self.dir = tempfile.mkdtemp(prefix="sqlq-model-")
        self.db = self.dsn() if self.dsn is not None else None
        if self.db is not None:  # one database for every example, emptied (a new one: 0.7 s)
            self.run(_empty(self.db))
        self.disk: SimDisk | None = SimDisk() if self.engine == "walq" else None
        self.rng = random.Random(0)
        self.durable = ENGINES[self.engine].durable
        self.shared = ENGINES[self.engine].shared
        self.jobs: dict[str, Expected] = {}
        self.keys: dict[str, str] = {}  # idempotency key -> job id
        self.paused: set[str] = set()
        self.held: dict[str, Claim] = {}  # job id -> the claim this test's "worker" holds
        self.ended: Counter[str] = Counter()  # terminal moves since this process started
        self.leftovers: list[Service] = []  # abandoned by a crash: stopped at teardown
        self.starts = 0
        self.service = self._service()
        self.run(self.service.start())

    # -- plumbing -----------------------------------------------------------------------

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def _store(self) -> JobStore:
        if self.disk is not None:  # walq on the simulated disk that can lose power
            return WalStore(
                f"{self.dir}/walq", fs=self.disk, clock=self.clock,
                retention=RETENTION_S, compact_floor_bytes=1500, compact_ratio=1.5,
            )  # fmt: skip
        # A crash here is the process's, not the power's: the OS keeps what was written.
        return make_store(
            self.engine, self.dir, sync="os", clock=self.clock, retention=RETENTION_S,
            dsn=self.db,
        )  # fmt: skip

    def _service(self) -> Service:
        config = RuntimeConfig(
            workers=0,  # the machine is the worker
            all_remote=False,  # (no remote worker: every queue is served here, by the machine)
            healthcheck=False,
            compact_every_s=0,
            seed=1,
            max_attempts=DEFAULT_ATTEMPTS,
            retry=RETRY,
            lease_s=LEASE_S,
        )
        service = Service(self._store(), config, kinds=registry(), clock=self.clock)
        service.claims.attach(_Held(self.held))  # the machine is the worker: a cancel finds it
        return service

    def _shared_by_hand(self) -> None:
        """Shared mode: the test renews leases and rescues expired ones itself, so that
        nothing changes a job behind the model's back (the claimer still runs)."""
        claims = self.service.claims
        if isinstance(claims, SharedClaims):
            claims.by_hand()

    async def _settle(self) -> None:
        """Every outcome handed to the claims is written (they write in the background)."""
        await self.service.claims.settle()

    def teardown(self) -> None:
        async def stop() -> None:
            for held in self.held.values():
                if not held.claimed.done():
                    await asyncio.gather(held.claimed, return_exceptions=True)
            errors = []
            for service in (*self.leftovers, self.service):
                try:
                    await asyncio.wait_for(service.stop(0), CLAIM_WITHIN_S)
                except StoreError:
                    pass  # a store the power cut failed
                except Exception as exc:  # stop the others, then say so
                    errors.append(exc)
            assert not errors, f"a service did not stop: {errors!r}"

        try:
            self.run(stop())
        finally:
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    # -- what the model predicts ----------------------------------------------------------

    def _due(self) -> list[Expected]:
        now = self.clock.time()
        return [
            e
            for e in self.jobs.values()
            if e.state is State.SCHEDULED and e.ready_at <= now and e.queue not in self.paused
        ]

    def _failed(self, e: Expected, actual: Job | None) -> None:
        """An attempt of ``e`` ended badly: retried with backoff, or dead on its last; or,
        once a cancel was asked for, cancelled."""
        e.epoch += 1
        if e.cancel_asked:
            e.move(State.CANCELLED)
            assert actual is None or actual.state is State.CANCELLED, (e, actual)
            self.ended[State.CANCELLED.value] += 1
        elif RETRY.retries and e.attempts < e.max_attempts:
            e.move(State.SCHEDULED)
            assert actual is not None, e
            assert actual.state is State.SCHEDULED, (e, actual)
            now = self.clock.time()
            delay = min(RETRY.cap_s, RETRY.base_s * 2 ** (e.attempts - 1))
            assert now + delay <= actual.ready_at <= now + delay * (1 + RETRY.jitter), actual
            e.ready_at = actual.ready_at
        else:
            e.move(State.DEAD)
            self.ended[State.DEAD.value] += 1

    async def _fold(self) -> dict[str, Job]:
        """Every job the store holds: all the pages of ``list_jobs``."""
        out: dict[str, Job] = {}
        after: str | None = None
        while True:
            page = await self.service.store.list_jobs(JobQuery(after=after, limit=MAX_PAGE))
            out.update((j.id, j) for j in page)
            if len(page) < MAX_PAGE:
                return out
            after = page[-1].id

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def store_equals_model(self) -> None:
        self.run(self._check())

    async def _quiet(self) -> None:
        """walq compacts on a thread of its own: let a compaction finish before the next
        step, so that each step's I/O calls (where a power cut lands) are the same on
        every run of an example. ``running`` goes false when the switch is handed to the
        I/O thread, not when it is done: wait for that thread too, or the switch's calls
        land before or after the next step's count of calls as the threads happen to run
        (a crash's submission in flight then kept on one run and lost on the next)."""
        store = self.service.store
        if isinstance(store, WalStore) and self.service.state.value == "ready":
            for _ in range(int(CLAIM_WITHIN_S / 0.001)):
                if not store.compactor.running and not store.compactor._requested:
                    await store.on_io(_nothing)  # (one I/O thread: after the switch)
                    if not store.compactor.running and not store.compactor._requested:
                        return
                await asyncio.sleep(0.001)

    async def _check(self) -> None:
        await self._quiet()
        service = self.service
        fold = await self._fold()
        missing = sorted(set(self.jobs) - set(fold))
        assert not missing, f"acknowledged jobs are gone: {missing}"
        assert set(fold) == set(self.jobs), f"jobs nobody submitted: {set(fold) - set(self.jobs)}"
        for job_id, e in self.jobs.items():
            job = fold[job_id]
            got = (job.state, job.epoch, job.attempts, job.attempts_total, job.queue)
            want = (e.state, e.epoch, e.attempts, e.attempts_total, e.queue)
            assert got == want, f"{job_id}: store has {got}, the model {want}; {e.history}"
            assert (job.priority, job.max_attempts) == (e.priority, e.max_attempts)
            if e.state is State.SCHEDULED:
                assert job.ready_at == e.ready_at, (job, e)
            for a, b in zip(e.history, e.history[1:], strict=False):
                assert b in TRANSITIONS[a], f"{job_id}: history {e.history}"
            assert job.attempts <= job.max_attempts
        queues = await service.queues()  # (shared mode: also refreshes the census)
        by: Counter[tuple[str, str]] = Counter((j.state.value, j.queue) for j in fold.values())
        stats = service.stats()["jobs"]
        for state in State:
            if state in LIVE:
                want_n = sum(n for (s, _), n in by.items() if s == state.value)
            else:
                want_n = self.ended[state.value]
            assert stats[state.value] == want_n, (
                f"/stats says {stats[state.value]} {state.value}, the records {want_n}"
            )
        for q in sorted({*QUEUES, *queues}):
            info = queues.get(q) or await service.view.queue(q)
            scheduled, running = by[State.SCHEDULED.value, q], by[State.RUNNING.value, q]
            assert info.depth == scheduled or "lanes" in WAIVE, (
                f"queue {q}: depth {info.depth}, but {scheduled} jobs are scheduled in it"
            )
            assert info.running == running, f"queue {q}: running {info.running}, not {running}"
            assert info.paused is (q in self.paused), f"queue {q}: paused is {info.paused}"
            if scheduled or running:
                assert q in queues, f"queue {q} has live jobs but is not listed"
        claims = service.claims
        if isinstance(claims, LocalClaims) and "lanes" not in WAIVE:
            self._check_lanes(claims, fold)

    def _check_lanes(self, claims: LocalClaims, fold: dict[str, Job]) -> None:
        """No lane holds a job that is not scheduled in its queue, and none holds one twice."""
        live = {j.id for j in fold.values() if j.state in LIVE}
        assert set(self.service.live.jobs) == live, "the live view differs from the records"
        for q, entries in claims.scheduler.held().items():
            ids = [job.id for job in entries]
            assert len(ids) == claims.scheduler.depth(q), f"queue {q}'s depth is not its lanes"
            stale = [i for i in ids if i not in fold or fold[i].state is not State.SCHEDULED]
            assert not stale, f"queue {q}'s lanes hold jobs that are not scheduled: {stale}"
            assert len(ids) == len(set(ids)), f"queue {q}'s lanes hold a job twice"
            assert all(fold[i].queue == q for i in ids)


class _Held:
    """The attempts the machine holds, as a cancel finds them (``reach.Attempts``)."""

    def __init__(self, held: dict[str, Claim]) -> None:
        self.held = held

    def holding(self, job_id: str) -> Claim | None:
        return self.held.get(job_id)

    def interrupt(self, job_id: str, grace_s: float | None) -> bool:
        return job_id in self.held  # (nothing runs: the machine reports the outcome)

    def lose(self, claim: Claim, reason: str) -> bool:
        return claim.job.id in self.held  # (the same: nothing runs to cut)

    def running(self, queue: str) -> list[Job]:
        return [c.job for c in self.held.values() if c.job.queue == queue]


def _nothing() -> None:
    """A call on walq's I/O thread that does nothing: what was queued before it is done."""
