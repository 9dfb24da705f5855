"""The PostgreSQL crash trial's verifier explains a live node's rerun only by an event of a
node's log that names that very job: the parsing of those lines and the counting per cause,
on sample text (the trial itself runs in ``test_shared_crash.py``)."""

from __future__ import annotations

from pathlib import Path

from sqlq.bench.crashcheck_pg import NodeEvents, explain, node_events, read_node_events
from sqlq.bench.crashreport import _shared_section

A = "0193a1b2c3d4e5f60718293a4b5c6d7e"
B = "0193a1b2c3d4e5f60718293a4b5c6d7f"
C = "0193a1b2c3d4e5f60718293a4b5c6d80"
D = "0193a1b2c3d4e5f60718293a4b5c6d81"

SAMPLE = f"""\
WARNING sqlq.runtime.shared: renewing this node's leases: postgres: PostgreSQL at 127.0.0.1:5/t is unavailable: ConnectionRefusedError: [Errno 111] Connect call failed
ERROR common.engine.groupcommit: postgres: a batch failed without an I/O error
Traceback (most recent call last):
  File "/work/main/common/engine/groupcommit.py", line 169, in _write
sqlq.common.errors.StoreUnavailableError: PostgreSQL at 127.0.0.1:5/t is unavailable: OSError: no
ERROR sqlq.runtime.claims: could not record the outcome of job {A}: postgres: the batch failed: StoreUnavailableError
WARNING sqlq.runtime.workers: worker 7 holding job {B}: lease lost: not renewed for 0.412 s past its end; replaced
WARNING sqlq.runtime.workers: worker 3 holding job {C}: worker hung: no heartbeat for 5012 ms; replaced
WARNING sqlq.runtime.leases: could not rescue job {D}: postgres: the batch failed: StoreUnavailableError
"""  # noqa: E501


def test_the_log_names_a_dropped_outcome_and_a_lease_lost_by_their_jobs() -> None:
    events = node_events(SAMPLE)
    assert events.dropped_outcome == {A}
    assert events.lease_lost == {B}


def test_a_claim_lost_before_it_started_is_a_lease_lost_too() -> None:
    """Its rerun is explained as a started one's is (``SharedClaims._lost_unstarted``)."""
    line = f"WARNING sqlq.runtime.shared: job {C}: lease lost before it started: its renewal\n"
    assert node_events(line).lease_lost == {C}


def test_lines_about_other_ends_or_no_job_name_nothing() -> None:
    """A hang declared, a rescue that failed, a database error: none is a live node's
    cause of a rerun, so none explains one."""
    assert node_events(SAMPLE.replace(A, "x").replace(B, "y")) == NodeEvents()
    assert node_events("") == NodeEvents()


def test_every_nodes_log_is_read_the_restarts_included(tmp_path: Path) -> None:
    lines = SAMPLE.splitlines(keepends=True)
    (tmp_path / "node0.log").write_text(lines[5])  # A's dropped outcome
    (tmp_path / "node4.log").write_text(lines[6])  # B's lease, on the killed node's restart
    (tmp_path / "ledger.txt").write_text(f"could not record the outcome of job {C}: x\n")
    events = read_node_events(tmp_path)
    assert events == NodeEvents(dropped_outcome=frozenset({A}), lease_lost=frozenset({B}))


def test_each_rerun_counts_under_its_first_cause_and_one_no_event_names_stays() -> None:
    events = NodeEvents(dropped_outcome=frozenset({A, B}), lease_lost=frozenset({B, C}))
    reruns = {"held", "crash", A, B, C, D}
    counts, unexplained = explain(reruns, {"held", A}, {"crash"}, events)
    assert counts == {
        "reruns_held_by_killed_node": 2,
        "reruns_running_at_db_crash": 1,
        "reruns_dropped_outcome": 1,
        "reruns_lease_lost": 1,
    }
    assert unexplained == {D}
    # An event of a job that did not rerun explains nothing and is no rerun.
    counts, unexplained = explain(set(), set(), set(), events)
    assert sum(counts.values()) == 0
    assert not unexplained


def test_the_report_counts_a_rerun_each_cause_explained_as_explained() -> None:
    row = {
        "acknowledged": 100, "rescue_s": 5.0, "db_killed": True, "lost": 0, "ok": True,
        "reruns": 5, "reruns_held_by_killed_node": 1, "reruns_running_at_db_crash": 1,
        "reruns_dropped_outcome": 2, "reruns_lease_lost": 1, "workload": "plain",
    }  # fmt: skip
    old = {k: v for k, v in row.items() if k not in ("reruns_dropped_outcome", "reruns_lease_lost")}
    lines = _shared_section([[{**row, "nodes": 3, "lease_s": 5.0}], [old]])
    header = [c.strip() for c in lines[4].split("|")]
    rows = [[c.strip() for c in line.split("|")] for line in lines[6:8]]
    for cells in rows:
        assert len(cells) == len(header)
    at = header.index("unexplained reruns")
    assert rows[0][at : at + 5] == ["0", "1", "1", "2", "1"]
    # A row from before the logs were read: its unnamed reruns stay unexplained.
    assert rows[1][at : at + 5] == ["3", "1", "1", "0", "0"]
