"""Reading a store's files without the engine's code: the crash verifier's eyes.

walq's log through a minimal parser (framing, CRC-32, sequence numbers, the
fold with every epoch fence checked); SQLite's file with the stdlib ``sqlite3``
module and plain SQL. The transition table is restated here on purpose: a
verifier must not trust the code it is checking.
"""

from __future__ import annotations

import json
import sqlite3
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The transition table, restated here on purpose: the verifier must not trust
# the code it is checking.
LEGAL = {
    "scheduled": {"running", "cancelled"},
    "running": {"completed", "scheduled", "dead"},
    "completed": set(),
    "dead": {"scheduled"},  # an operator's retry
    "cancelled": {"scheduled"},
}
TERMINAL = {"completed", "dead", "cancelled"}


@dataclass
class JobFacts:
    state: str
    epoch: int
    attempts: int
    history: list[tuple[str, int]] = field(default_factory=list)  # (state, epoch) as folded
    max_attempts: int = 0
    attempts_total: int = 0  # attempts before the latest operator retry


def _facts(j: dict[str, Any]) -> JobFacts:
    """A job record (a put, or a snapshot's job) as facts."""
    return JobFacts(
        j["state"], j["epoch"], j["attempts"], [(j["state"], j["epoch"])],
        max_attempts=j.get("max_attempts", 0), attempts_total=j.get("attempts_total", 0),
    )  # fmt: skip


@dataclass
class ClientRecord:
    """What the clients did with one job and what they were told, in order.

    ``events``: ``cancel?`` and ``retry?`` when a request was sent (it may have
    landed even if no answer came back before the kill), ``cancel`` and ``retry``
    when it was answered 200.
    """

    max_attempts: int | None = None  # as asked; None: the server's default
    can_fail: bool = False  # the job was asked to fail (or hang) sometimes
    events: list[str] = field(default_factory=list)

    def after(self, event: str, start: int) -> bool:
        return event in self.events[start:]

    def last(self, event: str) -> int:
        """The index of the last ``event``; -1 if none."""
        return max((i for i, e in enumerate(self.events) if e == event), default=-1)


def judge(job: JobFacts | None, rec: ClientRecord, *, epochs_per_attempt: int = 1) -> str | None:
    """Whether an acknowledged job's end is one the client's own story allows; why not if not.

    It must be there and finished; a job that nothing could fail, completed. A cancel
    the client saw succeed, with no retry sent after it, leaves it cancelled; it is
    cancelled only if a cancel was sent and no retry was answered after it. Dead means
    its attempts were used up. Every epoch bump is a requeue after an attempt or an
    operator's retry (and, in shared mode, ``epochs_per_attempt=2``: a claim too).
    """
    if job is None:
        return "missing"
    if job.state not in TERMINAL:
        return f"not finished ({job.state})"
    if not rec.can_fail and rec.max_attempts is None and not rec.events:
        # Never asked to fail, never touched, the server's 5 attempts: a trial's few deaths
        # cannot use them up, so it completed.
        return None if job.state == "completed" else f"{job.state}, though nothing failed it"
    cancelled = rec.last("cancel")
    if cancelled >= 0 and not rec.after("retry?", cancelled) and job.state != "cancelled":
        return f"{job.state}, though the client saw it cancelled"
    if job.state == "cancelled":
        sent = rec.last("cancel?")
        if sent < 0:
            return "cancelled, though no client cancelled it"
        if rec.after("retry", sent):
            return "cancelled, though the client saw it retried after its last cancel"
    if job.state == "dead":
        limit = rec.max_attempts or job.max_attempts
        if job.attempts != job.max_attempts or (rec.max_attempts and limit != job.max_attempts):
            return f"dead after {job.attempts} of {limit} attempts"
    revivals = rec.events.count("retry?")
    if job.epoch > epochs_per_attempt * (job.attempts + job.attempts_total) + revivals:
        return f"epoch {job.epoch} but only {job.attempts + job.attempts_total} attempts"
    return None


class VerifyError(Exception):
    pass


def read_walq(path: Path) -> dict[str, JobFacts]:
    """Fold a walq log with nothing but json and zlib. Raises on any inconsistency."""
    data = path.read_bytes()
    jobs: dict[str, JobFacts] = {}
    expect_seq: int | None = None
    pos = 0
    lines = data.split(b"\n")
    complete = lines[:-1]  # a final piece without newline is a torn tail: ignored
    for n, line in enumerate(complete):
        prefix, middle = b'{"crc":"', b'","rec":'
        if not (line.startswith(prefix) and line[16:24] == middle and line.endswith(b"}")):
            raise VerifyError(f"{path}: line {n} at byte {pos}: bad framing")
        body = line[24:-1]
        if line[8:16] != b"%08x" % zlib.crc32(body):
            if n == len(complete) - 1:
                break  # a torn last line that happens to end in a newline
            raise VerifyError(f"{path}: line {n} at byte {pos}: checksum mismatch mid-log")
        rec = json.loads(body)
        pos += len(line) + 1
        if n == 0:
            if rec.get("magic") != "walq":
                raise VerifyError(f"{path}: no walq header")
            expect_seq = rec["start_seq"]
            continue
        if "snap" in rec:
            j = rec["snap"]
            jobs[j["id"]] = _facts(j)
            continue
        if "sched" in rec:  # a schedule's snapshot (bench.offline_schedules reads those)
            continue
        if rec["seq"] != expect_seq:
            raise VerifyError(f"{path}: sequence {rec['seq']} where {expect_seq} was expected")
        assert expect_seq is not None
        expect_seq += 1
        for op in rec["ops"]:
            if not ("put" in op or "set" in op):  # a schedule's change: offline_schedules
                continue
            if "put" in op:
                j = op["put"]
                if j["id"] in jobs:
                    raise VerifyError(f"job {j['id']} submitted twice")
                jobs[j["id"]] = _facts(j)
            else:
                t = op["set"]
                cur = jobs.get(t["id"])
                if cur is None:
                    raise VerifyError(f"change to unknown job {t['id']}")
                if t["expect_epoch"] != cur.epoch:
                    raise VerifyError(
                        f"job {t['id']}: change fenced at epoch {t['expect_epoch']} "
                        f"applied at {cur.epoch}"
                    )
                if t["state"] not in LEGAL[cur.state]:
                    raise VerifyError(f"job {t['id']}: illegal {cur.state} -> {t['state']}")
                if t["epoch"] < cur.epoch:
                    raise VerifyError(f"job {t['id']}: epoch went back")
                cur.state, cur.epoch, cur.attempts = t["state"], t["epoch"], t["attempts"]
                if t.get("attempts_total") is not None:  # only an operator's retry sets it
                    cur.attempts_total = t["attempts_total"]
                cur.history.append((cur.state, cur.epoch))
    return jobs


def read_sqlite(path: Path) -> dict[str, JobFacts]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = db.execute(
            "SELECT id, state, epoch, attempts, max_attempts, attempts_total FROM jobs"
        ).fetchall()
    jobs = {}
    for job_id, state, epoch, attempts, max_attempts, attempts_total in rows:
        if state not in LEGAL:
            raise VerifyError(f"job {job_id}: unknown state {state!r}")
        if attempts > max_attempts:
            raise VerifyError(f"job {job_id}: {attempts} attempts of at most {max_attempts}")
        jobs[job_id] = JobFacts(
            state, epoch, attempts, max_attempts=max_attempts, attempts_total=attempts_total
        )
    return jobs


# Each single-node durable engine's files, read offline: the crash verifier, and the
# crash, I/O-error and power-loss tests that run over every such engine of the registry,
# read an engine's data directory through this one table (a test checks it names them all).
READERS: dict[str, Callable[[Path], dict[str, JobFacts]]] = {
    "walq": lambda data: read_walq(data / "walq" / "walq.log"),
    "sqlite": lambda data: read_sqlite(data / "sqlite" / "sqlq.db"),
}


def read_data(store: str, data: Path) -> dict[str, JobFacts]:
    """The jobs in the data directory ``data`` of engine ``store``, without its code."""
    try:
        reader = READERS[store]
    except KeyError:
        raise VerifyError(
            f"no offline reader for the {store!r} engine: add one to READERS "
            "(sqlq.bench.offline), or the crash suites cannot verify it"
        ) from None
    return reader(data)
