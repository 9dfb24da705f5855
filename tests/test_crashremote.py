"""The remote-worker crash trials (``sqlq crashcheck --remote-workers``): every check of
their verdict fails on records doctored to break it, and passes on the honest story
beside it; the side files read back; and, in the slow tier, real short trials per
engine (a server, worker processes, kill -9)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from sqlq.bench.crashjudge import Death, Verdict
from sqlq.bench.crashload import Ledger, remote_spec
from sqlq.bench.crashrecords import TIMEOUT, RecordFile, read_records
from sqlq.bench.crashremote import MODES
from sqlq.bench.offline import JobFacts
from sqlq.bench.verdict import BURY_TAG, FORCE

T = 1_700_000_000.0  # the story's first second
LEASE = 5.0


class Story:
    """A trial's records written by hand: the workers' side files, the store's facts, the
    clients' ledger, the deaths."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "records"
        self.dir.mkdir(parents=True)
        self.files: dict[str, RecordFile] = {}
        self.jobs: dict[str, JobFacts] = {}
        self.ledger = Ledger(tmp / "ledger.txt")
        self.deaths: list[Death] = []

    def ev(self, worker: str, **event: Any) -> None:
        if worker not in self.files:
            self.files[worker] = RecordFile(self.dir / f"{worker}.rec")
        self.files[worker].write(**event)

    def claim(self, job: str, epoch: int, worker: str, at: float, attempt: int = 1) -> str:
        run = f"{worker}-{job}-{epoch}"
        self.ev(worker, ev="claim", job=job, epoch=epoch, w=worker, run=run, attempt=attempt,
                lease_s=LEASE, t0=at - 0.01, t=at, lease_until=at + LEASE)  # fmt: skip
        self.ev(worker, ev="start", job=job, epoch=epoch, run=run, t=at)
        return run

    def beat(self, run: str, at: float, **answer: Any) -> None:
        worker, job, epoch = run.split("-")
        self.ev(worker, ev="beat", job=job, epoch=int(epoch), run=run, t0=at - 0.01, t=at,
                **answer)  # fmt: skip

    def outcome(self, run: str, at: float, what: str = "complete", *, answer_at: float | None
                = None, status: int | None = 200, state: str | None = "completed",
                error: str | None = None, end: bool = True) -> None:  # fmt: skip
        worker, job, epoch = run.split("-")
        ids = {"job": job, "epoch": int(epoch), "run": run}
        if end:
            self.ev(worker, ev="end", **ids, t=at, what=what)
        self.ev(worker, ev="send", **ids, what=what, t=at, form="single")
        if answer_at is not None or status is not None or error is not None:
            self.ev(worker, ev="answer", **ids, what=what, t0=at, t=answer_at or at + 0.01,
                    status=status, state=state, error=error)  # fmt: skip

    def ack(self, job: str, state: str = "completed", run: str | None = None, epoch: int = 0,
            attempts: int = 1, **facts: Any) -> None:  # fmt: skip
        self.ledger.ack(job, None, False)
        self.jobs[job] = JobFacts(state, epoch, attempts, max_attempts=5,
                                  result={"run": run} if run else None, **facts)  # fmt: skip

    def verdict(self) -> tuple[dict[str, Any], list[str]]:
        for f in self.files.values():
            f.close()
        self.files.clear()
        v = Verdict(self.jobs, self.ledger, read_records(self.dir), self.deaths, clients=4)
        return v.row(), v.problems


def _honest(s: Story) -> None:
    """Job a completed by w0; job b stalled by w0 (fenced late), completed by w1."""
    ra = s.claim("a", 0, "w0", T)
    s.beat(ra, T + 1, lease_until=T + 6)
    s.outcome(ra, T + 2)
    s.ack("a", run=ra)
    rb = s.claim("b", 0, "w0", T)
    s.ev("w0", ev="stall", job="b", epoch=0, run=rb, t=T, lease_hi=T + LEASE)
    rb1 = s.claim("b", 1, "w1", T + 5.5, attempt=2)
    s.outcome(rb1, T + 6)
    s.outcome(rb, T + 7, status=409, state=None, error="fenced")
    s.ack("b", run=rb1, epoch=1, attempts=2)


def test_the_honest_story_passes_and_is_counted(tmp_path: Path) -> None:
    s = Story(tmp_path)
    _honest(s)
    row, problems = s.verdict()
    assert problems == []
    assert (row["stale_outcomes"], row["stale_fenced"], row["reruns_cut_off"]) == (1, 1, 1)
    assert (row["executions"], row["stalls"], row["results_checked"], row["lost"]) == (3, 1, 2, 0)


def test_a_stale_outcome_accepted_fails(tmp_path: Path) -> None:
    s = Story(tmp_path)
    r = s.claim("a", 0, "w0", T)
    s.outcome(r, T + LEASE + 1)  # no heartbeat: its lease ran out at T + 5, and it was taken
    s.ack("a", run=r)
    row, problems = s.verdict()
    assert row["violations"] == {"a stale outcome accepted": 1}
    assert "its lease had run out" in problems[0]


def test_an_outcome_after_a_newer_claim_must_be_fenced(tmp_path: Path) -> None:
    s = Story(tmp_path)
    r0 = s.claim("a", 0, "w0", T)
    s.beat(r0, T + 4, error=TIMEOUT)  # it may renew the lease any time: no lease bound
    r1 = s.claim("a", 1, "w1", T + 5.2, attempt=2)
    s.outcome(r0, T + 5.3, what="fail", state="scheduled")  # but the epoch had moved
    s.outcome(r1, T + 6)
    s.ack("a", run=r1, epoch=1, attempts=2)
    _, problems = s.verdict()
    assert any("a stale outcome accepted" in p and "newer attempt" in p for p in problems)


def test_an_outcome_fenced_while_its_lease_held_fails_unless_forced(tmp_path: Path) -> None:
    for forced in (False, True):
        s = Story(tmp_path / str(forced))
        r = s.claim("a", 0, "w0", T)
        s.outcome(r, T + 1, status=409, state=None, error="fenced")
        s.ack("a", "cancelled")
        s.ledger.note("a", "cancel?")
        if forced:
            s.ledger.note("a", FORCE)
        _, problems = s.verdict()
        assert any("fenced while its lease held" in p for p in problems) is not forced


def test_a_retry_of_an_outcome_that_may_have_landed_may_be_fenced(tmp_path: Path) -> None:
    s = Story(tmp_path)
    r = s.claim("a", 0, "w0", T)
    s.outcome(r, T + 1, status=None, state=None, error="unanswered")
    s.deaths.append(Death("server", "http://x", T + 1.005))
    s.outcome(r, T + 2, status=409, state=None, error="fenced", end=False)
    s.ack("a", run=r)
    row, problems = s.verdict()
    assert problems == []
    assert row["landed_then_retry_fenced"] == 1


def test_a_heartbeat_fenced_while_its_lease_held_fails(tmp_path: Path) -> None:
    s = Story(tmp_path)
    r = s.claim("a", 0, "w0", T)
    s.beat(r, T + 1, error="fenced")
    s.ack("a", run=r)
    s.outcome(r, T + 2, status=409, state=None, error="fenced")
    _, problems = s.verdict()
    assert any("heartbeat fenced while its lease held" in p for p in problems)


def test_two_executions_at_one_epoch_fail(tmp_path: Path) -> None:
    s = Story(tmp_path)
    r0 = s.claim("a", 0, "w0", T)
    s.claim("a", 0, "w1", T + 6)
    s.outcome(r0, T + 1)
    s.ack("a", run=r0)
    _, problems = s.verdict()
    assert any("two executions at one epoch" in p for p in problems)


def test_a_job_claimed_again_while_a_lease_held_fails(tmp_path: Path) -> None:
    s = Story(tmp_path)
    r0 = s.claim("a", 0, "w0", T)
    s.beat(r0, T + 1, lease_until=T + 6)
    s.deaths.append(Death("worker", "w0", T + 1.5))
    r1 = s.claim("a", 1, "w1", T + 5.5, attempt=2)  # before T + 6
    s.outcome(r1, T + 6)
    s.ack("a", run=r1, epoch=1, attempts=2)
    _, problems = s.verdict()
    assert any("claimed again while a lease held" in p for p in problems)


def test_a_rerun_needs_a_death_and_is_counted_by_its_cause(tmp_path: Path) -> None:
    for killed in (False, True):
        s = Story(tmp_path / str(killed))
        r0 = s.claim("a", 0, "w0", T)  # started, never ended
        if killed:
            s.deaths.append(Death("worker", "w0", T + 1))
        r1 = s.claim("a", 1, "w1", T + 6, attempt=2)
        s.outcome(r1, T + 7)
        s.ack("a", run=r1, epoch=1, attempts=2)
        row, problems = s.verdict()
        assert row["reruns_worker_killed"] == int(killed)
        assert row["reruns_unexplained"] == int(not killed)
        assert any("executed twice with no death" in p for p in problems) is not killed
        assert any("never answered" in p for p in problems) is False  # it never ended
        del r0


def test_a_rerun_after_an_accepted_end_fails_unless_the_operator_retried(tmp_path: Path) -> None:
    for retried in (False, True):
        s = Story(tmp_path / str(retried))
        r0 = s.claim("a", 0, "w0", T)
        s.outcome(r0, T + 1, what="fail", state="dead")
        r1 = s.claim("a", 1, "w1", T + 2)
        s.outcome(r1, T + 3)
        s.ack("a", run=r1, epoch=1)
        s.ledger.ack("a", 1, True)  # may fail: dead, then retried by the operator
        if retried:
            s.ledger.note("a", "retry?")
            s.ledger.note("a", "retry")
        _, problems = s.verdict()
        assert any("ran again after its end was accepted" in p for p in problems) is not retried


def test_a_requeue_by_design_is_no_rerun(tmp_path: Path) -> None:
    s = Story(tmp_path)
    r0 = s.claim("a", 0, "w0", T)
    s.outcome(r0, T + 1, what="snooze", state="scheduled")
    r1 = s.claim("a", 1, "w0", T + 2)
    s.outcome(r1, T + 3)
    s.ack("a", run=r1, epoch=1, snoozes=1)
    row, problems = s.verdict()
    assert problems == []
    assert sum(row[k] for k in row if k.startswith("reruns_")) == 0


def test_the_newer_attempt_must_stand(tmp_path: Path) -> None:
    s = Story(tmp_path)
    r0 = s.claim("a", 0, "w0", T)
    s.outcome(r0, T + 1, status=None, state=None, error=TIMEOUT)  # may yet land...
    s.outcome(r0, T + 1.5, status=409, state=None, error="fenced", end=False)
    s.claim("a", 1, "w1", T + 6, attempt=2)
    s.deaths.append(Death("worker", "w1", T + 6.5))
    s.ack("a", run=r0, epoch=1, attempts=2)  # ... but the older attempt's result stood
    _, problems = s.verdict()
    assert any("an older attempt's result stood" in p for p in problems)


def test_a_result_that_names_no_execution_fails(tmp_path: Path) -> None:
    s = Story(tmp_path)
    r0 = s.claim("a", 0, "w0", T)
    s.outcome(r0, T + 1)
    s.ack("a", run="nobody")
    _, problems = s.verdict()
    assert any("names no execution" in p for p in problems)


def test_an_outcome_a_live_worker_never_had_answered_fails(tmp_path: Path) -> None:
    for killed in (False, True):
        s = Story(tmp_path / str(killed))
        r0 = s.claim("a", 0, "w0", T)
        s.outcome(r0, T + 1, status=None, state=None, error=None)  # sent, then nothing
        if killed:
            s.deaths.append(Death("worker", "w0", T + 1.1))
        s.ack("a", run=r0)
        _, problems = s.verdict()
        assert any("never answered" in p for p in problems) is not killed


def test_an_outcome_refused_fails(tmp_path: Path) -> None:
    s = Story(tmp_path)
    r0 = s.claim("a", 0, "w0", T)
    s.outcome(r0, T + 1, status=422, state=None, error="invalid")
    s.ack("a", run=r0)
    _, problems = s.verdict()
    assert any("an outcome refused" in p for p in problems)


def test_an_acknowledged_job_lost_or_ended_wrong_fails(tmp_path: Path) -> None:
    s = Story(tmp_path)
    s.ledger.ack("gone", None, False)
    s.ack("dead", "dead", attempts=5)  # nothing failed it
    row, problems = s.verdict()
    assert row["lost"] == 2
    assert any("1 acknowledged jobs missing" in p for p in problems)
    assert any("nothing failed it" in p for p in problems)


def test_a_buried_job_is_dead_with_attempts_to_spare_and_a_release_costs_an_epoch(
    tmp_path: Path,
) -> None:
    s = Story(tmp_path)
    r0 = s.claim("a", 0, "w0", T)
    s.ev("w0", ev="release", job="a", epoch=0, run=r0, t=T + 0.1)
    s.outcome(r0, T + 0.2, what="release", state="scheduled", end=False)
    r1 = s.claim("a", 1, "w0", T + 1)
    s.outcome(r1, T + 2, what="fail", state="dead")
    s.ledger.ack("a", 3, True, BURY_TAG)
    s.jobs["a"] = JobFacts("dead", 2, 1, max_attempts=3)
    row, problems = s.verdict()
    assert problems == []
    assert row["releases"] == 1
    s.jobs["a"] = JobFacts("dead", 3, 1, max_attempts=3)  # an epoch too many
    assert any("epoch 3" in p for p in Story.verdict(s)[1])


def test_outcomes_kept_across_a_server_death_are_counted_when_they_land(tmp_path: Path) -> None:
    s = Story(tmp_path)
    r0 = s.claim("a", 0, "w0", T)
    s.outcome(r0, T + 1, status=None, state=None, error="unanswered")
    s.deaths.append(Death("server", "http://x", T + 1.2))
    s.outcome(r0, T + 2.5, end=False)
    s.ack("a", run=r0)
    row, problems = s.verdict()
    assert problems == []
    assert row["landed_after_restart"] == 1


def test_the_side_files_ignore_a_torn_last_line_and_count_others(tmp_path: Path) -> None:
    s = Story(tmp_path)
    _honest(s)
    s.verdict()
    (s.dir / "w0.rec").write_bytes((s.dir / "w0.rec").read_bytes() + b'{"ev":"beat","jo')
    assert read_records(s.dir).bad_lines == 0
    (s.dir / "w9.rec").write_bytes(b'{"ev":"start","job":"z","epoch":0,"run":"nope","t":1}\n')
    (s.dir / "w8.rec").write_bytes(b"garbage\n{}\n")
    assert read_records(s.dir).bad_lines == 3  # a run never claimed, garbage, no "ev"


def test_the_remote_workload_uses_every_kind_and_tag() -> None:
    rng = random.Random(3)
    specs = [remote_spec(rng, 0.2) for _ in range(3000)]
    kinds = {s["kind"] for s, _, _ in specs}
    assert kinds == {"r.sleep", "r.stubborn", "r.checkpoint", "r.snooze", "r.bury"}
    assert {t for _, _, t in specs} == {"", "cancel", "checkpoint", "snooze", BURY_TAG}
    stalls = [s for s, _, _ in specs if s["args"].get("stall")]
    assert 0.1 < len(stalls) / len(specs) < 0.25
    assert {s["queue"] for s, _, _ in specs} == {"default", "mail"}
    assert not any(s["args"].get("stall") for s, _, _ in [remote_spec(rng) for _ in range(500)])


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("store", ["walq", "sqlite"])
def test_a_real_remote_trial_per_mode_loses_nothing(tmp_path: Path, store: str, mode: str) -> None:
    from sqlq.bench.crashremote import run_remote_trials

    rows = run_remote_trials(store=store, sync="full", trials=1, jobs=300, seed=7,
                             out=tmp_path, modes=(mode,), progress=False)  # fmt: skip
    [row] = rows
    assert row["problems"] == []
    assert row["acknowledged"] > 0
    assert row["executions"] > 0
    if mode == "worker":
        assert row["workers_killed"] == 2
    elif mode == "server":
        assert row["servers_killed"] == 1
    else:
        assert row["stalls"] > 0
        assert row["stale_fenced"] == row["stale_outcomes"] > 0
    assert (tmp_path / f"crash-remote-{store}-{mode}.jsonl").exists()


@pytest.mark.slow
def test_a_real_remote_trial_on_two_postgres_nodes_loses_nothing(tmp_path: Path) -> None:
    from sqlq.bench.crashremote_pg import run_remote_pg_trials

    [row] = run_remote_pg_trials(trials=1, jobs=300, seed=3, out=tmp_path, progress=False)
    assert row["problems"] == []
    assert (row["servers_killed"], row["workers_killed"]) == (1, 1)
    assert row["acknowledged"] > 0


def test_the_crash_report_has_a_row_per_store_and_mode(tmp_path: Path) -> None:
    import json

    from sqlq.bench.crashreport import _remote_section, write_report

    row = {"store": "walq", "mode": "fence", "workload": "remote", "acknowledged": 10,
           "lost": 0, "executions": 12, "stale_outcomes": 2, "stale_fenced": 2,
           "reruns_worker_killed": 0, "reruns_server_killed": 0, "reruns_cut_off": 2,
           "reruns_fenced": 1, "reruns_unexplained": 0, "landed_after_restart": 0,
           "violations": {}, "ok": True, "git_commit": "abc"}  # fmt: skip
    rows = [row, {**row, "violations": {"a job claimed again while a lease held": 1},
                  "ok": False}]  # fmt: skip
    lines = _remote_section([rows])
    want = (
        "| walq | fence | 2 | 20 | 0 | 24 | 4 | 4 | 0 | 1 | 0 | 0 | 4 | 2 | 0 | 0 | - | 1 | abc |"
    )
    assert want in lines
    server = [{**row, "mode": "server", "downtime_s": d} for d in (1.0, 3.0, 2.0)]
    assert any("| 0 | 2.00 / 3.00 | 0 | abc |" in x for x in _remote_section([server]))
    (tmp_path / "crash-remote-walq-fence.jsonl").write_text(json.dumps(row) + "\n")
    assert "| walq | fence | 1 |" in write_report(tmp_path)  # beside no other trial's rows


def test_a_job_that_left_running_still_holding_a_lease_fails(tmp_path: Path) -> None:
    s = Story(tmp_path)
    r = s.claim("a", 0, "w0", T)
    s.outcome(r, T + 1)
    s.ack("a", run=r, holder="worker:w0", lease_until=T + 5)
    _, problems = s.verdict()
    assert any("still names a holder or lease" in p for p in problems)


def test_the_sqlite_reader_reads_a_running_job_s_holder_and_lease(tmp_path: Path) -> None:
    import sqlite3

    from sqlq.bench.offline import read_sqlite

    path = tmp_path / "sqlq.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE jobs (id TEXT, state TEXT, epoch INT, attempts INT, max_attempts INT, "
            "attempts_total INT, holder TEXT, lease_until REAL)"
        )
        db.execute("INSERT INTO jobs VALUES ('a', 'running', 0, 1, 5, 0, 'worker:w0', 12.5)")
        db.execute("INSERT INTO jobs VALUES ('b', 'completed', 0, 1, 5, 0, NULL, NULL)")
    facts = read_sqlite(path)
    assert (facts["a"].holder, facts["a"].lease_until) == ("worker:w0", 12.5)
    assert (facts["b"].holder, facts["b"].lease_until) == (None, None)


def test_a_lease_the_store_expired_while_a_heartbeat_held_it_fails(tmp_path: Path) -> None:
    for at, forced in ((T + 7.0, False), (T + 7.0, True), (T + 9.5, False)):
        s = Story(tmp_path / f"{at}-{forced}")
        r0 = s.claim("a", 0, "w0", T)
        s.beat(r0, T + 4, lease_until=T + 9)  # renewed: it holds until T + 9
        s.deaths.append(Death("worker", "w0", T + 4.5))
        r1 = s.claim("a", 1, "w1", at + 0.5, attempt=2)
        s.outcome(r1, at + 1)
        silent = {"attempt": 1, "error": "lease expired: worker w0 went silent", "at": at}
        s.ack("a", run=r1, epoch=1, attempts=2, errors=[silent])
        if forced:
            s.ledger.note("a", FORCE)
        row, problems = s.verdict()
        early = at < T + 9 and not forced
        assert any("expired before it ran out" in p for p in problems) is early
        assert row["expiries"] == 1


def test_an_expiry_is_matched_to_the_claim_the_server_had_made_by_then(tmp_path: Path) -> None:
    """The same worker claims the job again: that claim was sent before the expiry and made
    after it, so the expiry is of the earlier claim, whose lease had run out."""
    s = Story(tmp_path)
    r0 = s.claim("a", 0, "w0", T)  # lease until T + 5, never renewed (stalled)
    s.ev("w0", ev="stall", job="a", epoch=0, run=r0, t=T, lease_hi=T + LEASE)
    r1 = "w0-a-1"
    s.ev("w0", ev="claim", job="a", epoch=1, w="w0", run=r1, attempt=2, lease_s=LEASE,
         t0=T + 5.0, t=T + 5.3, lease_until=T + 5.2 + LEASE)  # fmt: skip
    s.ev("w0", ev="start", job="a", epoch=1, run=r1, t=T + 5.3)
    s.outcome(r1, T + 6)
    s.outcome(r0, T + 7, status=409, state=None, error="fenced")
    silent = {"attempt": 1, "error": "lease expired: worker w0 went silent", "at": T + 5.1}
    s.ack("a", run=r1, epoch=1, attempts=2, errors=[silent])
    row, problems = s.verdict()
    assert problems == []
    assert row["expiries"] == 1
