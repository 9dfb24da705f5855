"""Reading a store's files without the engine's code: the crash verifier's eyes.

walq's log through a minimal parser (framing, CRC-32, sequence numbers, the
fold with every epoch fence checked); SQLite's file with the stdlib ``sqlite3``
module and plain SQL (PostgreSQL's rows, read in plain SQL by ``crashcheck_pg``,
become facts through ``row_facts`` too). The transition table is restated here on
purpose: a verifier must not trust the code it is checking.

Besides the state, each job's facts hold what a running job carries (issue 22): the
cancel asked for, progress, the checkpoint, snoozes and the last errors, read from the
log's JSON or the columns' JSON text, a running job's holder and lease (issue 23: a
remote worker's claim), and the result (the crash workload's checkpoint
jobs report there what they read). Folding walq's log, the reader also checks the
cancel rule on every step: a running job whose cancel was asked for leaves running
only to completed or cancelled (``JobFacts.breaks`` says when one did not).
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
    # a workflow's member waits for its parents; a parent's end moves it (its count, or out)
    "waiting": {"scheduled", "cancelled", "waiting"},
    "scheduled": {"running", "cancelled"},
    # running -> running: what the attempt carries changed (same epoch); -> cancelled: it
    # ended after a cancel was asked for
    "running": {"completed", "scheduled", "dead", "running", "cancelled"},
    "completed": set(),
    "dead": {"scheduled"},  # an operator's retry
    "cancelled": {"scheduled", "waiting"},  # a retry; a member revived with its parent
}
TERMINAL = {"completed", "dead", "cancelled"}
RUNNING_FIELDS = ("cancel_requested_at", "progress", "checkpoint", "snoozes", "errors")


@dataclass
class JobFacts:
    state: str
    epoch: int
    attempts: int
    history: list[tuple[str, int]] = field(default_factory=list)  # (state, epoch) as folded
    max_attempts: int = 0
    attempts_total: int = 0  # attempts before the latest operator retry
    cancel_requested_at: float | None = None  # what a running job carries, as stored
    progress: dict[str, Any] | None = None
    checkpoint: Any = None
    snoozes: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    result: Any = None
    holder: str | None = None  # a running job's remote worker (``worker:<name>``), as stored
    lease_until: float | None = None
    breaks: list[str] = field(default_factory=list)  # the cancel rule broken, step by step
    started_at: float | None = None  # when the latest attempt started
    updated_at: float = 0.0
    # A workflow's member: its workflow, parents, counts, policies and cancel reason, as
    # stored (the keys of ``sqlq.common.workflow.Flow``); None for any other job.
    flow: dict[str, Any] | None = None

    def carry(self, record: dict[str, Any]) -> None:
        """Take the running fields (and the result) of a job or transition record: whole,
        and an absent one at its default (a transition's JSON omits defaults)."""
        self.cancel_requested_at = record.get("cancel_requested_at")
        self.progress = record.get("progress")
        self.checkpoint = record.get("checkpoint")
        self.snoozes = record.get("snoozes", 0)
        self.errors = list(record.get("errors") or ())
        self.result = record.get("result")
        self.holder = record.get("holder")
        self.lease_until = record.get("lease_until")
        self.started_at = record.get("started_at")
        self.updated_at = record.get("updated_at", self.updated_at)
        change = record.get("flow")
        if change is not None and self.flow is not None:  # a transition's FlowChange
            self.flow["cancel_reason"] = change.get("cancel_reason")
            if change.get("counts", True):  # (False: the reason alone)
                self.flow["deps_pending"] = change.get("deps_pending", 0)
                self.flow["failed"] = change.get("failed", 0)


def _facts(j: dict[str, Any]) -> JobFacts:
    """A job record (a put, or a snapshot's job) as facts."""
    facts = JobFacts(
        j["state"], j["epoch"], j["attempts"], [(j["state"], j["epoch"])],
        max_attempts=j.get("max_attempts", 0), attempts_total=j.get("attempts_total", 0),
        flow=None if j.get("flow") is None else dict(j["flow"]),
    )  # fmt: skip
    facts.carry({k: v for k, v in j.items() if k != "flow"})
    return facts


def _step(job_id: str, cur: JobFacts, t: dict[str, Any]) -> None:
    """One transition folded into ``cur``, every fence and the cancel rule checked."""
    if t["expect_epoch"] != cur.epoch:
        raise VerifyError(
            f"job {job_id}: change fenced at epoch {t['expect_epoch']} applied at {cur.epoch}"
        )
    if t["state"] not in LEGAL[cur.state]:
        raise VerifyError(f"job {job_id}: illegal {cur.state} -> {t['state']}")
    if t["epoch"] < cur.epoch:
        raise VerifyError(f"job {job_id}: epoch went back")
    if cur.state == t["state"] == "running" and t["epoch"] != cur.epoch:
        raise VerifyError(f"job {job_id}: running -> running took a new epoch")
    if cur.state == "running" and cur.cancel_requested_at is not None:
        if t["state"] in ("scheduled", "dead"):
            cur.breaks.append(f"{t['state']} after a cancel was asked for (epoch {cur.epoch})")
    cur.state, cur.epoch, cur.attempts = t["state"], t["epoch"], t["attempts"]
    if t.get("attempts_total") is not None:  # only an operator's retry sets it
        cur.attempts_total = t["attempts_total"]
    cur.carry(t)
    cur.history.append((cur.state, cur.epoch))


def _patch(job_id: str, cur: JobFacts, p: dict[str, Any]) -> None:
    """A walq patch folded into ``cur``: running -> running at its epoch, and only what it
    carries (absent: its default) changed."""
    if cur.state != "running" or p["expect_epoch"] != cur.epoch:
        raise VerifyError(f"job {job_id}: patch at epoch {p['expect_epoch']} of {cur.state} "
                          f"at {cur.epoch}")  # fmt: skip
    cur.cancel_requested_at = p.get("cancel_requested_at")
    cur.progress = p.get("progress")
    cur.lease_until = p.get("lease_until")
    cur.history.append((cur.state, cur.epoch))


def _json(text: Any) -> Any:
    """A JSON column's value: text as stored (NULL: None); a driver that decodes jsonb
    itself hands over the value."""
    return json.loads(text) if isinstance(text, str | bytes) else text


def row_facts(row: dict[str, Any]) -> JobFacts:
    """A job row read in plain SQL (SQLite, PostgreSQL) as facts: JSON columns as text or
    NULL; a column the schema lacks (an old database) reads as its default."""
    job_id, state = row["id"], row["state"]
    if state not in LEGAL:
        raise VerifyError(f"job {job_id}: unknown state {state!r}")
    if row["attempts"] > row["max_attempts"]:
        raise VerifyError(
            f"job {job_id}: {row['attempts']} attempts of at most {row['max_attempts']}"
        )
    facts = JobFacts(
        state, row["epoch"], row["attempts"], max_attempts=row["max_attempts"],
        attempts_total=row["attempts_total"],
    )  # fmt: skip
    facts.carry(
        {
            "cancel_requested_at": row.get("cancel_requested_at"),
            "progress": _json(row.get("progress")),
            "checkpoint": _json(row.get("checkpoint")),
            "snoozes": row.get("snoozes") or 0,
            "errors": _json(row.get("errors")),
            "result": _json(row.get("result")),
            "holder": row.get("holder"),
            "lease_until": row.get("lease_until"),
            "started_at": row.get("started_at"),
            "updated_at": row.get("updated_at", 0.0),
        }
    )
    return facts


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
            if "patch" in op:  # a running job's progress, cancel asked or lease: the rest kept
                p = op["patch"]
                cur = jobs.get(p["id"])
                if cur is None:
                    raise VerifyError(f"patch of unknown job {p['id']}")
                _patch(p["id"], cur, p)
                continue
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
                _step(t["id"], cur, t)
    return jobs


JOB_FACT_COLUMNS = (
    "id", "state", "epoch", "attempts", "max_attempts", "attempts_total", "result",
    *RUNNING_FIELDS, "holder", "lease_until", "started_at", "updated_at",
)  # fmt: skip
FLOW_COLUMNS = ("workflow_id", "ref", "deps_pending", "failed", "on_parent_failure", "run_if",
                "cancel_reason")  # fmt: skip


def read_sqlite(path: Path) -> dict[str, JobFacts]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        have = {r[1] for r in db.execute("PRAGMA table_info(jobs)")}
        names = [c for c in JOB_FACT_COLUMNS if c in have]
        rows = db.execute(f"SELECT {', '.join(names)} FROM jobs").fetchall()
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        flows, parents = [], []
        if "flows" in tables:  # version 7: workflows (a plain SELECT of each table)
            flows = db.execute(f"SELECT job_id, {', '.join(FLOW_COLUMNS)} FROM flows").fetchall()
            parents = db.execute("SELECT child, parent FROM edges ORDER BY child, n").fetchall()
    jobs = {}
    for values in rows:
        row = dict(zip(names, values, strict=True))
        jobs[row["id"]] = row_facts(row)
    edges: dict[str, list[str]] = {}
    for child, parent in parents:
        edges.setdefault(child, []).append(parent)
    for job_id, *values in flows:
        if job_id in jobs:
            flow = dict(zip(FLOW_COLUMNS, values, strict=True))
            jobs[job_id].flow = {**flow, "parents": edges.get(job_id, [])}
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
