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
from dataclasses import dataclass, field
from pathlib import Path

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
            jobs[j["id"]] = JobFacts(
                j["state"], j["epoch"], j["attempts"], [(j["state"], j["epoch"])]
            )
            continue
        if rec["seq"] != expect_seq:
            raise VerifyError(f"{path}: sequence {rec['seq']} where {expect_seq} was expected")
        assert expect_seq is not None
        expect_seq += 1
        for op in rec["ops"]:
            if "put" in op:
                j = op["put"]
                if j["id"] in jobs:
                    raise VerifyError(f"job {j['id']} submitted twice")
                jobs[j["id"]] = JobFacts(
                    j["state"], j["epoch"], j["attempts"], [(j["state"], j["epoch"])]
                )
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
                cur.history.append((cur.state, cur.epoch))
    return jobs


def read_sqlite(path: Path) -> dict[str, JobFacts]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT id, state, epoch, attempts FROM jobs").fetchall()
    jobs = {}
    for job_id, state, epoch, attempts in rows:
        if state not in LEGAL:
            raise VerifyError(f"job {job_id}: unknown state {state!r}")
        if epoch > attempts:  # every requeue follows an attempt
            raise VerifyError(f"job {job_id}: epoch {epoch} exceeds attempts {attempts}")
        jobs[job_id] = JobFacts(state, epoch, attempts)
    return jobs
