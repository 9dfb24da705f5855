"""The model machine's process rules: clean restarts, and crashes (a power cut on walq).

A crash on walq is a power cut on the simulated disk (``tests/powerloss.py``):
the next process opens what the cut left, synced bytes plus a torn tail. On the
other engines it is the process abandoned without ``stop``: its files reopened
by the next one, its leases (PostgreSQL) left to run out.
"""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from sqlq.common.errors import StoreError
from sqlq.common.models import State
from sqlq.common.specs import JobSpec
from sqlq.runtime.service import Service
from sqlq.runtime.shared import SharedClaims
from tests.model_expected import (
    CLAIM_WITHIN_S,
    DEFAULT_ATTEMPTS,
    KIND,
    LEASE_S,
    MAX_JOBS,
    MAX_STARTS,
    Expected,
)
from tests.model_harness import ServiceHarness
from tests.powerloss import TAIL_MODES


class ProcessRules(ServiceHarness):
    """Restarts and crashes, with the model resolving what a crash may have lost."""

    # -- rules: the process ---------------------------------------------------------------------

    @precondition(lambda self: self.durable and self.starts < MAX_STARTS)
    @rule()
    def restart(self) -> None:
        """A clean stop, and a start on the same files."""
        self.run(self._stop(self.service))
        self._reopen()

    async def _stop(self, service: Service) -> None:
        """A clean stop must end: nothing the machine did leaves it waiting."""
        try:
            await asyncio.wait_for(asyncio.shield(task := asyncio.ensure_future(service.stop(0))),
                                   CLAIM_WITHIN_S)  # fmt: skip
        except TimeoutError:
            stuck = [
                f"{t.get_name()}: {t.get_stack(limit=3)}"
                for t in asyncio.all_tasks()
                if t is not asyncio.current_task() and not t.done()
            ]
            task.cancel()
            raise AssertionError(f"stop did not end within {CLAIM_WITHIN_S}s: {stuck}") from None

    @precondition(lambda self: self.durable and self.starts < MAX_STARTS)
    @rule(mode=st.sampled_from(TAIL_MODES), in_flight=st.none() | st.integers(0, 4))
    def crash(self, mode: str, in_flight: int | None) -> None:
        """The process dies: only what is durable is there for the next one."""
        maybe: dict[str, JobSpec] = {}
        if self.disk is not None:
            self.run(self._power_cut(mode, in_flight, maybe))
        else:
            self._abandon()
        self._reopen()
        if maybe:
            self._resolve(maybe)

    async def _power_cut(self, mode: str, in_flight: int | None, maybe: dict[str, JobSpec]) -> None:
        """The power goes at the next I/O call; or, with ``in_flight``, a submission is on
        its way and the power goes that many I/O calls later (the cut may keep it or not)."""
        assert self.disk is not None
        task = None
        cut = len(self.disk.calls)
        if in_flight is not None and len(self.jobs) < MAX_JOBS:
            spec = JobSpec(kind=KIND, args={"n": 9}, queue="mail")
            self.disk.cut_after = cut + in_flight
            task = asyncio.ensure_future(self.service.submit([spec]))
        else:
            self.disk.cut_after = cut
        old = self.service
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
            self.disk.cut_after = len(self.disk.calls)
            if not task.exception():  # acknowledged before the cut: it must be there
                [job], _ = task.result()
                self.jobs[job.id] = Expected(
                    id=job.id, queue="mail", priority=0, max_attempts=DEFAULT_ATTEMPTS,
                    key=None, request_hash=spec.request_hash(), ready_at=job.ready_at,
                )  # fmt: skip
            else:
                maybe["?"] = spec
        try:
            await old.stop(0)  # every write fails: the disk is gone
        except StoreError:
            pass
        self.disk = self.disk.after_cut(mode, self.rng)

    def _abandon(self) -> None:
        """The process is gone: no stop, no drain, no release of leases; its lock with it."""
        old = self.service
        store: Any = old.store
        for task in getattr(old.claims, "_tasks", []):
            task.cancel()
        self.run(old.claims.stop())
        if hasattr(store, "_lock"):  # SQLite: the OS closes the dead process's files
            self.run(store._release())
            store._lock.release()
        self.leftovers.append(old)

    def _resolve(self, maybe: dict[str, JobSpec]) -> None:
        """A submission in flight at the cut: there whole (as asked) or not at all."""
        extra = [j for j in self.run(self._fold()).values() if j.id not in self.jobs]
        assert len(extra) <= 1, extra
        for job in extra:
            spec = maybe["?"]
            assert (job.state, job.queue, job.args) == (State.SCHEDULED, spec.queue, spec.args)
            self.jobs[job.id] = Expected(
                id=job.id, queue=job.queue, priority=0, max_attempts=DEFAULT_ATTEMPTS,
                key=None, request_hash=spec.request_hash(), ready_at=job.ready_at,
            )  # fmt: skip

    def _reopen(self) -> None:
        """A new process on the same files: its start must never raise."""
        self.starts += 1
        self.held.clear()  # the old process's workers are gone
        self.ended.clear()
        self.service = self._service()
        self.run(self.service.start())  # the invariant "a start never raises"
        running = [e for e in self.jobs.values() if e.state is State.RUNNING]
        if self.shared:  # the old node's leases run out; this node rescues them
            self.clock.advance(LEASE_S + 1)
            claims = self.service.claims
            assert isinstance(claims, SharedClaims)
            self._shared_by_hand()
            while self.run(claims.rescue()):
                pass
        fold = self.run(self._fold())
        for e in running:  # requeued through the retry policy: an attempt counted
            self._failed(e, fold.get(e.id))
        if not self.shared:  # each interrupted attempt is counted once, for what it became
            stats = self.service.stats()
            buried = sum(1 for e in running if e.state is State.DEAD)
            withdrawn = sum(1 for e in running if e.state is State.CANCELLED)
            assert stats["dead_at_recovery"] == buried
            assert stats["cancelled_running"] == withdrawn
            assert stats["requeued_at_recovery"] == len(running) - buried - withdrawn
