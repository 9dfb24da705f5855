"""The remote-worker trials' verdict: the store's files (read offline), the submitters'
ledger and the workers' side files (``sqlq.bench.crashrecords``), held to the protocol.

The workers note both ends of every call, and every process reads one clock, so each
check below is a proof from the records, not a guess:

- **nothing acknowledged lost**: every acknowledged job ended as its clients' story allows
  (``sqlq.bench.verdict.judge``, given the releases and the deaths the job lived through);
- **every stale outcome fenced**: an outcome sent after its lease surely ran out (the
  latest any call could have renewed it to: ``Execution.lease_hi``) or after a newer
  attempt of the job was claimed was answered ``fenced`` (409), never accepted;
- **no live lease fenced or taken**: an outcome or heartbeat answered ``fenced`` before
  the lease the server surely granted ran out (``Execution.lease_lo``), and a newer
  claim of a job while an older attempt's lease surely held, each fail the trial, unless
  the operator forced a cancel of that job (which shortens the lease) or an earlier send
  of the same outcome went unanswered (it may have landed, and the retry then is stale);
- **one holder per attempt**: no two executions of a job at one epoch;
- **executed twice only through a death**: each execution a later one follows ended in an
  accepted requeue (a failure, snooze or release answered ``scheduled``), or an operator's
  retry came between, or its worker was killed, it was cut off on purpose (stalled), it
  was fenced, or a server died while it ran: the reruns, counted by cause;
- **the newer attempt stands**: a completed job's result names the execution that made it,
  the job's last one, whose outcome was not refused;
- **no lease expired early**: each expiry in the store's error history came after the
  lease the worker surely held (the server stamps it with its time);
- **every outcome answered**: a worker that lived kept each outcome until it was answered;
- **a finished job holds nothing**: no job out of ``running`` names a holder or a lease.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from sqlq.bench.crashload import Ledger
from sqlq.bench.crashrecords import Execution, Records, Report
from sqlq.bench.offline import JobFacts
from sqlq.bench.verdict import FORCE, judge

CAUSES = ("worker_killed", "server_killed", "cut_off", "fenced")
EXPIRED = re.compile(r"lease expired: worker (\S+) went silent")  # the server's own words


@dataclass(frozen=True)
class Death:
    """What the trial killed: a worker (by name) or a server (by its URL), and when."""

    what: str  # "worker" or "server"
    name: str
    t: float


def _terminal(r: Report) -> bool:
    return r.what != "checkpoint"


def _stale_why(ex: Execution, r: Report, newer: list[Execution]) -> str | None:
    """Why report ``r`` of ``ex`` was stale when it was sent, if the records prove it."""
    if r.t_send > ex.lease_hi(r.t_send):
        return "its lease had run out"
    if any(n.epoch > ex.epoch and n.t_claimed < r.t_send for n in newer):
        return "a newer attempt had been claimed"
    return None


def _excused(ex: Execution, upto: float, ledger: Ledger) -> bool:
    """A fence before ``upto`` that the records do not make wrong: the operator forced a
    cancel of the job, or an earlier send of a terminal outcome of ``ex`` went unanswered
    (it may have landed, so the job may have moved on)."""
    rec = ledger.records.get(ex.job)
    if rec is not None and FORCE in rec.events:
        return True
    return any(_terminal(r) and r.t_send < upto and not r.answered for r in ex.reports)


class Verdict:
    """The checks over one trial; ``row()`` the numbers, ``problems`` what failed."""

    def __init__(
        self, jobs: dict[str, JobFacts], ledger: Ledger, recs: Records, deaths: list[Death],
        *, clients: int, epochs_per_attempt: int = 1,
    ) -> None:  # fmt: skip
        self.jobs, self.ledger, self.recs, self.deaths = jobs, ledger, recs, deaths
        self.clients, self.epochs = clients, epochs_per_attempt
        self.problems: list[str] = []
        self.counts: Counter[str] = Counter()
        self.killed = {d.name for d in deaths if d.what == "worker"}
        self.server_deaths = [d.t for d in deaths if d.what == "server"]

    def problem(self, what: str, example: str) -> None:
        self.counts["problem:" + what] += 1
        if self.counts["problem:" + what] == 1:
            self.problems.append(f"{what}, e.g. {example}")

    # -- the fence ---------------------------------------------------------------

    def fences(self) -> None:
        for job, runs in self.recs.by_job.items():
            for ex in runs:
                newer = [n for n in runs if n is not ex]
                for r in ex.reports:
                    self._report(ex, r, newer)
                self._beats(ex)
                for n in runs:
                    if n.epoch == ex.epoch and n.run < ex.run:
                        self.problem("two executions at one epoch", f"{job} epoch {ex.epoch}")
                    elif n.epoch > ex.epoch and self._taken_live(ex, n):
                        self.problem("a job claimed again while a lease held",
                                     f"{job} epoch {ex.epoch} by {n.worker}")  # fmt: skip

    def _report(self, ex: Execution, r: Report, newer: list[Execution]) -> None:
        if r.fenced:
            self.counts["fenced_outcomes"] += 1
        if r.error is not None and not r.answered:
            self.counts["unanswered_sends"] += 1
        why = _stale_why(ex, r, newer)
        if why is not None:
            self.counts["stale_outcomes"] += 1
            if r.fenced:
                self.counts["stale_fenced"] += 1
            elif not r.answered:  # the server died or timed out first: sent again
                self.counts["stale_unanswered"] += 1
            elif r.accepted:
                self.problem("a stale outcome accepted",
                             f"{ex.job} epoch {ex.epoch} {r.what}: {why}")  # fmt: skip
            elif r.answered:
                self.problem("a stale outcome refused but not fenced",
                             f"{ex.job} {r.what}: {r.status} {r.error}")  # fmt: skip
            return
        if r.answered and not r.accepted and not r.fenced:
            self.problem("an outcome refused", f"{ex.job} {r.what}: {r.status} {r.error}")
        elif (
            r.fenced
            and r.t_recv < ex.lease_lo(r.t_send)
            and not _excused(ex, r.t_send, self.ledger)
        ):
            self.problem("an outcome fenced while its lease held",
                         f"{ex.job} epoch {ex.epoch} {r.what} answered at {r.t_recv:.3f}, "
                         f"lease until {ex.lease_lo(r.t_send):.3f}")  # fmt: skip

    def _beats(self, ex: Execution) -> None:
        first = min((r.t_send for r in ex.reports if _terminal(r)), default=math.inf)
        for b in ex.beats:
            if b.error == "fenced":
                self.counts["fenced_beats"] += 1
                if (b.t_recv < min(first, ex.lease_lo(b.t_send))
                        and not _excused(ex, b.t_send, self.ledger)):  # fmt: skip
                    self.problem("a heartbeat fenced while its lease held",
                                 f"{ex.job} epoch {ex.epoch} at {b.t_recv:.3f}")  # fmt: skip
            elif b.error is not None and b.lease_until is None and b.error not in (
                "unanswered", "timeout",
            ) and not b.error.startswith("http 5"):  # fmt: skip
                self.problem("a heartbeat refused", f"{ex.job}: {b.error}")

    def _taken_live(self, ex: Execution, n: Execution) -> bool:
        """``n`` was claimed before the lease of ``ex`` surely ran out, with nothing sent by
        ``ex`` that could have ended it first."""
        if n.t_claimed >= ex.lease_lo(n.t_claim_sent):
            return False
        if any(r.t_send < n.t_claimed for r in ex.reports if _terminal(r)):
            return False
        return not _excused(ex, n.t_claimed, self.ledger)

    def expiries(self) -> None:
        """Every expiry the store's error history holds (``lease expired: worker <name> went
        silent``, stamped with the server's time) came after the lease the worker surely
        had: none while a heartbeat's answered lease held, unless a cancel was forced."""
        for job_id, runs in self.recs.by_job.items():
            job = self.jobs.get(job_id)
            for e in job.errors if job is not None else ():
                m = EXPIRED.match(str(e.get("error", "")))
                at = e.get("at")
                if m is None or not isinstance(at, int | float):
                    continue
                self.counts["expiries"] += 1
                # the worker's claim the server had made by then (it granted lease_s from its
                # own now: so a claim sent before the expiry but made after it is not it)
                mine = [ex for ex in runs if ex.worker == m.group(1)
                        and ex.lease_until - ex.lease_s <= at]  # fmt: skip
                if not mine:  # a claim whose answer never came (the server or worker died)
                    continue
                ex = max(mine, key=lambda x: x.lease_until - x.lease_s)
                rec = self.ledger.records.get(job_id)
                forced = rec is not None and FORCE in rec.events
                if at < ex.lease_lo(at) and not forced:
                    self.problem("a lease expired before it ran out",
                                 f"{job_id} epoch {ex.epoch} at {at:.3f}, lease until "
                                 f"{ex.lease_lo(at):.3f}")  # fmt: skip

    # -- reruns and results ---------------------------------------------------------

    def cause(self, ex: Execution, until: float) -> str | None:
        """Why ``ex`` did not end its attempt by its own accepted outcome, if the trial can
        say: its worker was killed, it stalled, it was fenced, a server died meanwhile."""
        if ex.worker in self.killed and ex.final() is None:
            return "worker_killed"
        if ex.stalled is not None:
            return "cut_off"
        if any(ex.t_claim_sent <= t <= until for t in self.server_deaths):
            return "server_killed"
        if ex.fenced:
            return "fenced"
        return None

    def reruns(self) -> None:
        for job, runs in self.recs.by_job.items():
            ordered = sorted(runs, key=lambda ex: (ex.epoch, ex.t_claimed))
            rec = self.ledger.records.get(job)
            retries = rec.events.count("retry?") if rec is not None else 0
            for a, b in itertools.pairwise(ordered):
                final = a.final()
                if final is not None and final.accepted:
                    if final.state == "scheduled":
                        continue  # a failure retried, a snooze, a release: by design
                    if retries > 0:
                        retries -= 1  # the operator retried what had ended
                        continue
                    self.problem(
                        "ran again after its end was accepted",
                        f"{job}: {final.what} -> {final.state} at epoch {a.epoch}",
                    )
                    continue  # fmt: skip
                why = self.cause(a, b.t_claimed)
                if why is None:
                    self.problem("executed twice with no death", f"{job} epoch {a.epoch}")
                    self.counts["reruns_unexplained"] += 1
                else:
                    self.counts["reruns_" + why] += 1
            for ex in ordered:
                done = ex.ended is not None or ex.released
                if ex.worker not in self.killed and done and ex.final() is None:
                    self.problem("an outcome never answered", f"{job} epoch {ex.epoch}")

    def results(self) -> None:
        for job_id, job in self.jobs.items():
            if job.state != "completed" or job_id not in self.recs.by_job:
                continue
            runs = self.recs.by_job[job_id]
            run = job.result.get("run") if isinstance(job.result, dict) else None
            ex = self.recs.runs.get(str(run))
            if ex is None or ex.job != job_id:
                self.problem("a completed job's result names no execution", job_id)
                continue
            self.counts["results_checked"] += 1
            newest = max(runs, key=lambda e: (e.epoch, e.t_claimed))
            if newest is not ex and newest.started is not None:
                self.problem(
                    "an older attempt's result stood",
                    f"{job_id}: epoch {ex.epoch}'s over epoch {newest.epoch}'s",
                )
            final = ex.final()  # fmt: skip
            if final is not None and final.fenced:
                if not _excused(ex, math.inf, self.ledger):
                    self.problem("a fenced outcome's result stood", job_id)
                else:
                    self.counts["landed_then_retry_fenced"] += 1

    # -- the acknowledged jobs ---------------------------------------------------------

    def acknowledged(self) -> None:
        lost = wrong = 0
        for i in self.ledger.acked:
            job = self.jobs.get(i)
            runs = self.recs.by_job.get(i, [])
            releases = sum(1 for ex in runs if ex.released)
            finals = [ex.final() for ex in runs]
            cut = sum(1 for f in finals if f is None or not f.accepted)
            deaths = 1 + cut + len(self.deaths)
            v = judge(job, self.ledger.records[i], epochs_per_attempt=self.epochs,
                      deaths=deaths, releases=releases)  # fmt: skip
            if job is None:
                lost += 1
            elif v is not None:
                wrong += 1
                if wrong == 1:
                    self.problems.append(f"acknowledged jobs ended wrong, e.g. {i}: {v}")
        if lost:
            self.problems.append(f"{lost} acknowledged jobs missing")
        self.counts["lost"] = lost + wrong
        for i, job in self.jobs.items():
            if job.state != "running" and (job.holder is not None or job.lease_until is not None):
                self.problem("a job that left running still names a holder or lease", i)
        acked = set(self.ledger.acked)
        unknown = sum(1 for i in self.jobs if i not in acked)
        self.counts["unknown"] = unknown
        if unknown > self.clients * (1 + len(self.server_deaths)):
            self.problems.append(f"{unknown} jobs never acknowledged")

    def landed(self) -> None:
        """Outcomes first sent before a server's death and accepted after it: what the
        workers kept across the restart."""
        for ex in self.recs.runs.values():
            final = ex.final()
            if final is None or not final.accepted:
                continue
            first = min(r.t_send for r in ex.reports if r.what == final.what)
            if any(first < t < final.t_recv for t in self.server_deaths):
                self.counts["landed_after_restart"] += 1

    def row(self) -> dict[str, Any]:
        self.acknowledged()
        self.fences()
        self.expiries()
        self.reruns()
        self.results()
        self.landed()
        if self.recs.bad_lines:
            self.problems.append(f"{self.recs.bad_lines} unreadable lines in the side files")
        c = self.counts
        executions = [ex for ex in self.recs.runs.values() if ex.started is not None]
        return {
            "acknowledged": len(self.ledger.acked),
            "lost": c["lost"],
            "unknown": c["unknown"],
            "executions": len(executions),
            "releases": sum(1 for ex in self.recs.runs.values() if ex.released),
            "stalls": sum(1 for ex in executions if ex.stalled is not None),
            "stale_outcomes": c["stale_outcomes"],
            "stale_fenced": c["stale_fenced"],
            "stale_unanswered": c["stale_unanswered"],
            "fenced_outcomes": c["fenced_outcomes"],
            "fenced_beats": c["fenced_beats"],
            "expiries": c["expiries"],
            "unanswered_sends": c["unanswered_sends"],
            "landed_after_restart": c["landed_after_restart"],
            "landed_then_retry_fenced": c["landed_then_retry_fenced"],
            "results_checked": c["results_checked"],
            **{f"reruns_{k}": c[f"reruns_{k}"] for k in (*CAUSES, "unexplained")},
            "workers_killed": len(self.killed),
            "servers_killed": len(self.server_deaths),
            "ended": dict(Counter(self.jobs[i].state for i in self.ledger.acked if i in self.jobs)),
            "violations": {
                k.removeprefix("problem:"): v for k, v in c.items() if k.startswith("problem:")
            },
        }
