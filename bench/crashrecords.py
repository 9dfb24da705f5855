"""What each remote worker of the crash trials did and was told, in a side file the verdict
reads (``sqlq.bench.crashjudge``): one JSON line per event, appended with one ``write``.

The trials kill processes, not the machine, so a line written is a line kept: the kernel
holds it whatever happens to the process after the ``write`` returns, and no fsync is
needed (a torn last line, if a kill ever lands inside a ``write``, is ignored). The
worker writes an event before it acts on it (``start`` before the handler runs, ``send``
before the request leaves), and an answer once it has it, with both times, so the
verdict can bound what the server can have done:

- ``claim``: a job granted (``epoch``: the token's, ``lease_until`` as answered, ``t0``
  when the claim was sent, ``t`` when its answer came, ``run``: this execution's id);
- ``release``: given back unstarted (its report follows as an outcome ``release``);
- ``start`` / ``end`` (``what``: the outcome the handler chose) of an execution;
- ``stall``: the worker stopped heartbeating it on purpose (``lease_hi``: the latest its
  lease can run to), and reports only after that;
- ``beat``: one heartbeat item's answer (``lease_until``, ``cancel``, or ``error``;
  ``error`` ``unanswered`` when the call failed, ``timeout`` when it may yet be applied);
- ``send``: an outcome sent (``form``: ``single`` or ``batch``);
- ``answer``: its answer (``status``, ``state`` or ``error``), or ``error``
  ``unanswered`` / ``timeout`` (then it is sent again).

Every event names the job, the epoch and the execution (``run``), and the time
(``time.time()``: one clock for every process on the machine, and the server's).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

UNANSWERED = "unanswered"  # the call failed: the server died or refused the connection
TIMEOUT = "timeout"  # no answer in time: the server may still apply it later
REQUEUES = {"fail", "snooze", "release"}  # outcomes after which the job runs again by design


class RecordFile:
    """A worker's side file, appended a line at a time."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, **event: Any) -> None:
        os.write(self.fd, (json.dumps(event, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        os.close(self.fd)


@dataclass
class Report:
    """One send of an outcome, and what came back."""

    what: str
    t_send: float
    t_recv: float = math.inf  # inf: nothing came back (the worker died first)
    status: int | None = None
    state: str | None = None  # the job's state after it, when accepted
    error: str | None = None  # fenced, invalid, ..., or UNANSWERED / TIMEOUT

    @property
    def accepted(self) -> bool:
        return self.status == 200 and self.state is not None

    @property
    def fenced(self) -> bool:
        return self.error == "fenced"

    @property
    def answered(self) -> bool:
        return self.accepted or self.error not in (None, UNANSWERED, TIMEOUT)


@dataclass
class BeatAnswer:
    t_send: float
    t_recv: float
    lease_until: float | None = None
    cancel: bool = False
    error: str | None = None


@dataclass
class Execution:
    """One claim of a job by one worker, and all that followed from it."""

    job: str
    epoch: int
    worker: str
    run: str
    attempt: int
    lease_s: float
    t_claim_sent: float
    t_claimed: float
    lease_until: float  # as the claim answered
    started: float | None = None
    ended: float | None = None
    what: str | None = None  # the outcome the handler chose
    stalled: float | None = None  # when the worker stopped heartbeating it on purpose
    released: bool = False
    beats: list[BeatAnswer] = field(default_factory=list)
    reports: list[Report] = field(default_factory=list)

    def lease_lo(self, before: float) -> float:
        """The lease the server surely granted by ``before``: the latest answered (a renewal
        never shortens it; a forced cancel does, which the verdict allows for)."""
        answered = [b.lease_until for b in self.beats if b.lease_until is not None
                    and b.t_recv <= before]  # fmt: skip
        return max([self.lease_until, *answered])

    def lease_hi(self, before: float) -> float:
        """The latest the lease can run to for a request sent at ``before``: every call that
        could have been applied by then ended by its return, so no later than that plus the
        lease; a call that timed out may be applied at any time (inf)."""
        hi = self.lease_until
        for b in self.beats:
            if b.t_send >= before:
                continue
            if b.error == TIMEOUT:
                return math.inf
            if b.error == "fenced":
                continue
            hi = max(hi, b.t_recv + self.lease_s)
        return hi

    @property
    def fenced(self) -> bool:
        return any(b.error == "fenced" for b in self.beats) or any(r.fenced for r in self.reports)

    def final(self) -> Report | None:
        """The last answered send of its outcome (None: never answered)."""
        answered = [r for r in self.reports if r.answered and r.what != "checkpoint"]
        return answered[-1] if answered else None


@dataclass
class Records:
    """Every execution of every job, from every worker's file."""

    runs: dict[str, Execution] = field(default_factory=dict)  # by run id
    by_job: dict[str, list[Execution]] = field(default_factory=dict)  # in claim order
    bad_lines: int = 0

    def add(self, ex: Execution) -> None:
        self.runs[ex.run] = ex
        self.by_job.setdefault(ex.job, []).append(ex)


def _apply(recs: Records, ev: dict[str, Any]) -> None:
    kind = ev["ev"]
    if kind == "hello":  # the worker is up
        return
    if kind == "claim":
        recs.add(Execution(
            ev["job"], ev["epoch"], ev["w"], ev["run"], ev["attempt"], ev["lease_s"],
            ev["t0"], ev["t"], ev["lease_until"],
        ))  # fmt: skip
        return
    ex = recs.runs.get(ev["run"])
    if ex is None:
        recs.bad_lines += 1
        return
    if kind == "start":
        ex.started = ev["t"]
    elif kind == "end":
        ex.ended, ex.what = ev["t"], ev["what"]
    elif kind == "release":
        ex.released, ex.what = True, "release"
    elif kind == "stall":
        ex.stalled = ev["t"]
    elif kind == "beat":
        ex.beats.append(BeatAnswer(
            ev["t0"], ev["t"], ev.get("lease_until"), ev.get("cancel", False), ev.get("error")
        ))  # fmt: skip
    elif kind == "send":
        ex.reports.append(Report(ev["what"], ev["t"]))
    elif kind == "answer":
        pending = [r for r in ex.reports if r.what == ev["what"] and r.t_send == ev["t0"]]
        if not pending:
            recs.bad_lines += 1
            return
        r = pending[-1]
        r.t_recv, r.status = ev["t"], ev.get("status")
        r.state, r.error = ev.get("state"), ev.get("error")


def read_records(folder: Path) -> Records:
    """Every ``*.rec`` file in ``folder``, folded (claims first, so that a run named before its
    claim's line, which cannot happen in one file, is counted as a bad line)."""
    recs = Records()
    events: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*.rec")):
        lines = path.read_bytes().split(b"\n")
        for n, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                event = None
                if n == len(lines) - 1:  # the torn last line (no newline after it)
                    continue
            if isinstance(event, dict) and isinstance(event.get("ev"), str):
                events.append(event)
            else:
                recs.bad_lines += 1
    for ev in sorted(events, key=lambda e: e["ev"] != "claim"):  # stable: order kept
        try:
            _apply(recs, ev)
        except (KeyError, TypeError):
            recs.bad_lines += 1
    for runs in recs.by_job.values():
        runs.sort(key=lambda ex: ex.t_claimed)
    return recs
