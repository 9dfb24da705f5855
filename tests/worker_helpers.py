"""A fake of the server's side of the pull protocol, for ``sqlq.Worker``'s tests on the
fake clock: what ``AsyncClient`` would answer (``sqlq.worker.PullClient``), with the fence's
rules (epoch, running, lease), every call recorded with the fake time it came at, and
switches for the faults (``down``: unreachable; ``fence``; ``cancel``). And
``WorkerProcess``, a real ``sqlq worker`` for the end-to-end tests.

A small model, not the server: enough to hold the worker to the protocol's semantics.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from sqlq.bench.client.server import end_process
from sqlq.calls import FencedError, Unavailable
from sqlq.common.clock import Clock, wait_event
from sqlq.common.models import State
from sqlq.common.protocol import (
    DEFAULT_LEASE_S,
    Beat,
    BeatItem,
    CheckpointIn,
    ClaimAnswer,
    CompleteIn,
    FailIn,
    Granted,
    Outcome,
    ParentsPage,
    ReleaseIn,
    Reported,
    SnoozeIn,
)
from sqlq.common.running import Progress
from sqlq.common.wire import JobView


@dataclass
class FakeJob:
    id: str
    kind: str
    args: Any
    queue: str = "default"
    state: State = State.SCHEDULED
    epoch: int = 0
    attempts: int = 0
    max_attempts: int = 3
    checkpoint: Any = None
    progress: Progress | None = None
    progress_seen: list[Progress] = field(default_factory=list)
    result: Any = None
    last_error: str | None = None
    cancel: bool = False
    lease_end: float | None = None  # monotonic, fake
    lease_s: float = DEFAULT_LEASE_S
    ready: float = 0.0  # monotonic, fake
    ends: list[str] = field(default_factory=list)  # every outcome applied, by name


@dataclass
class Call:
    name: str
    at: float  # the fake clock's monotonic time
    body: Any
    failed: bool = False


class FakeServer:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.jobs: dict[str, FakeJob] = {}
        self.calls: list[Call] = []
        self.down = False
        self._arrived = asyncio.Event()
        self._changed = asyncio.Event()
        self._n = 0

    # -- what a test does ------------------------------------------------------------------

    def submit(self, kind: str, args: Any = None, **fields: Any) -> str:
        self._n += 1
        job_id = f"{self._n:032x}"
        self.jobs[job_id] = FakeJob(job_id, kind, {} if args is None else args, **fields)
        self._arrived.set()
        return job_id

    def fence(self, job_id: str) -> None:
        """The job moves on without the worker (its lease expired, say)."""
        job = self.jobs[job_id]
        job.state, job.epoch, job.lease_end = State.SCHEDULED, job.epoch + 1, None
        job.ready = float("inf")  # (not claimed again)

    def ask_cancel(self, job_id: str) -> None:
        self.jobs[job_id].cancel = True

    def named(self, name: str, *, ok: bool = True) -> list[Call]:
        return [c for c in self.calls if c.name == name and (not ok or not c.failed)]

    async def until(self, predicate: Callable[[], bool], what: str = "") -> None:
        """Wait, on the clock (at most an hour of it), until ``predicate`` holds."""
        deadline = self.clock.monotonic() + 3600
        while not predicate():
            if self.clock.monotonic() > deadline:
                raise AssertionError(f"not within an hour of fake time: {what or predicate}")
            self._changed.clear()
            await wait_event(self.clock, self._changed, 1.0)

    def state(self, job_id: str) -> State:
        return self.jobs[job_id].state

    # -- the protocol ------------------------------------------------------------------------

    def _record(self, name: str, body: Any) -> None:
        call = Call(name, self.clock.monotonic(), body, failed=self.down)
        self.calls.append(call)
        self._changed.set()
        if self.down:
            raise Unavailable(0, "unreachable", "connection refused (fake)")

    def _token(self, job: FakeJob) -> str:
        return f"{job.id}.{job.epoch}"

    def _held(self, token: str) -> FakeJob | None:
        job_id, _, epoch = token.partition(".")
        job = self.jobs.get(job_id)
        now = self.clock.monotonic()
        if job is None or job.state is not State.RUNNING or str(job.epoch) != epoch:
            return None
        if job.lease_end is None or job.lease_end < now:
            return None
        return job

    async def claim(
        self,
        queues: Sequence[str],
        *,
        worker: str,
        kinds: Sequence[str] | None = None,
        max: int = 1,
        wait_s: float = 0.0,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> list[Granted]:
        self._record("claim", {"max": max, "wait_s": wait_s, "kinds": kinds, "worker": worker})
        deadline = self.clock.monotonic() + wait_s
        while True:
            now = self.clock.monotonic()
            due = [j for j in self.jobs.values() if j.state is State.SCHEDULED
                   and j.queue in queues and j.ready <= now
                   and (kinds is None or j.kind in kinds)][:max]  # fmt: skip
            if due or now >= deadline:
                break
            self._arrived.clear()
            await wait_event(self.clock, self._arrived, deadline - now)
        granted = []
        for j in due:
            j.state, j.epoch, j.attempts = State.RUNNING, j.epoch + 1, j.attempts + 1
            j.lease_end, j.lease_s = now + lease_s, lease_s
            granted.append(
                Granted(token=self._token(j), lease_until=j.lease_end, job=self._view(j))
            )
        self._changed.set()
        return granted

    async def report_and_claim(
        self,
        outcomes: Sequence[Outcome | msgspec.Raw],
        queues: Sequence[str],
        *,
        worker: str,
        kinds: Sequence[str] | None = None,
        max: int = 1,
        lease_s: float = DEFAULT_LEASE_S,
    ) -> ClaimAnswer:
        decoded = [i if isinstance(i, Outcome) else msgspec.json.decode(bytes(i), type=Outcome)
                   for i in outcomes]  # fmt: skip
        self._record("carried", decoded)
        reported = [self._apply(o) for o in decoded]
        granted = await self.claim(queues, worker=worker, kinds=kinds, max=max, lease_s=lease_s)
        return ClaimAnswer(claims=granted, outcomes=reported)

    def _view(self, j: FakeJob) -> JobView:
        return JobView(id=j.id, kind=j.kind, args=j.args, ready_at=0.0, created_at=0.0,
                       updated_at=0.0, state=j.state, attempts=j.attempts,
                       max_attempts=j.max_attempts, attempts_total=j.attempts, epoch=j.epoch,
                       checkpoint=j.checkpoint, cancel_requested=j.cancel,
                       cancel_requested_at=1.0 if j.cancel else None, queue=j.queue)  # fmt: skip

    async def heartbeat(self, items: Sequence[str | BeatItem]) -> list[Beat]:
        beats = [BeatItem(token=i) if isinstance(i, str) else i for i in items]
        self._record("heartbeat", beats)
        out = []
        for item in beats:
            job = self._held(item.token)
            if job is None:
                out.append(Beat(token=item.token, error="fenced"))
                continue
            job.lease_end = self.clock.monotonic() + job.lease_s
            if item.progress is not None:
                p = item.progress
                job.progress = Progress(percent=p.percent, message=p.message, at=self.clock.time())
                job.progress_seen.append(job.progress)
            out.append(Beat(token=item.token, lease_until=job.lease_end,
                            cancel_requested=job.cancel))  # fmt: skip
        return out

    async def checkpoint(self, token: str, data: Any) -> Reported:
        self._record("checkpoint", {"token": token, "data": data})
        job = self._held(token)
        if job is None:
            raise FencedError(409, "fenced", "stale token")
        job.checkpoint = data
        return Reported(token=token, state="running")

    async def parents(self, token: str, start: int = 0) -> ParentsPage:
        self._record("parents", {"token": token, "start": start})
        if self._held(token) is None:
            raise FencedError(409, "fenced", "stale token")
        return ParentsPage(parents=[], next=None, total=0)  # (its jobs are in no workflow)

    async def outcomes(self, items: Sequence[Outcome | msgspec.Raw]) -> list[Reported]:
        decoded = [i if isinstance(i, Outcome) else msgspec.json.decode(bytes(i), type=Outcome)
                   for i in items]  # fmt: skip
        self._record("outcomes", decoded)
        return [self._apply(o) for o in decoded]

    def _apply(self, o: Outcome) -> Reported:
        job = self._held(o.token)
        if job is None:
            return Reported(token=o.token, error="fenced")
        what = o.what()
        job.lease_end = None
        if isinstance(what, CompleteIn):
            job.state, job.result, job.checkpoint = State.COMPLETED, what.result, None
            job.ends.append("complete")
        elif isinstance(what, FailIn):
            job.last_error = what.error
            job.ends.append("fail")
            if job.cancel:
                job.state = State.CANCELLED
            elif what.retry and job.attempts < job.max_attempts:
                job.state, job.ready = State.SCHEDULED, self.clock.monotonic()
            else:
                job.state = State.DEAD
        elif isinstance(what, SnoozeIn):
            job.state, job.ready = State.SCHEDULED, self.clock.monotonic() + what.delay_s
            job.attempts -= 1
            job.ends.append("snooze")
        elif isinstance(what, ReleaseIn):  # no attempt; cancelled if a cancel was asked for
            job.state = State.CANCELLED if job.cancel else State.SCHEDULED
            job.ready = self.clock.monotonic()
            job.attempts -= 1
            job.ends.append("release")
        elif isinstance(what, CheckpointIn):
            job.checkpoint = what.data
            job.lease_end = self.clock.monotonic() + DEFAULT_LEASE_S
            return Reported(token=o.token, state="running")
        if job.state is State.SCHEDULED:
            job.epoch += 1
            self._arrived.set()
        return Reported(token=o.token, state=job.state.value)


class WorkerProcess:
    """A real ``sqlq worker`` subprocess (``python -m sqlq worker ...``), its output in one
    log; ``stop`` signals it and returns its exit status."""

    def __init__(
        self, url: str, *args: str, pythonpath: str, log: Path, env: dict[str, str] | None = None
    ) -> None:
        self.cmd = [sys.executable, "-m", "sqlq", "worker", "--url", url, *args]
        self.log_path = log
        self._log = open(log, "ab")
        self.proc = subprocess.Popen(
            self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": pythonpath, **(env or {})},
        )  # fmt: skip

    def started(self, within: float = 60.0) -> WorkerProcess:
        """Wait until it says it started (its signals are handled from then on)."""
        deadline = time.monotonic() + within
        while "started: queues" not in self.output:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"sqlq worker did not start: {self.cmd}\n{self.output}")
            time.sleep(0.02)
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int | None = signal.SIGTERM, within: float = 60.0) -> int:
        """Send ``sig`` (None: none, it is stopping already) and wait for the exit."""
        code = end_process(self.proc, sig, within)
        self._log.close()
        return code
