"""walq replays a log written before a running job carried anything (issue 22).

``tests/data/walq_v_old/`` was written by the code at commit ab7b3a9, whose ``Job`` and
``Transition`` had no ``cancel_requested_at``, ``progress``, ``checkpoint``, ``snoozes``
or ``errors`` (``tests/data/make_walq_old.py`` says how): jobs in every state, a paused
queue, a schedule and its tick, a compaction's snapshot, then change records after it.
Today's code must read every job as that code wrote it, with the new fields at their
defaults, and then store new values of them on top of the old log and read them back,
through a reopen and through a compaction.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.models import Job, State, Transition
from sqlq.common.running import Progress
from sqlq.walq import log
from sqlq.walq.store import LOG_NAME, WalStore
from tests.walq_helpers import NOW, NoSyncFiles

OLD = Path(__file__).parent / "data" / "walq_v_old"
NEW_FIELDS = ("cancel_requested_at", "progress", "checkpoint", "snoozes", "errors", "holder",
              "lease_until")  # fmt: skip
DEFAULTS: dict[str, Any] = {
    "cancel_requested_at": None,
    "progress": None,
    "checkpoint": None,
    "snoozes": 0,
    "errors": [],
    "holder": None,  # issue 23's: who holds a running job, until when
    "lease_until": None,
    "cancel_forced": False,  # a forced cancel's held lease: an old log's jobs were not
    "flow": None,  # a workflow member's place in its graph: none before workflows
    "key": None,  # fair claims' key and weight: a job of an old log has neither
    "weight": 1,
}


@pytest.fixture
def old_log(tmp_path: Path) -> Path:
    """A copy of the old data directory (the store rewrites it: never the committed one)."""
    data = tmp_path / "data"
    shutil.copytree(OLD, data)
    (data / "expected.json").unlink()
    data.chmod(0o700)
    return data


def expected() -> dict[str, Any]:
    return json.loads((OLD / "expected.json").read_text())  # type: ignore[no-any-return]


async def opened(data: Path) -> tuple[WalStore, list[str]]:
    store = WalStore(data, clock=FakeClock(NOW + 100), fs=NoSyncFiles())
    recovery = await store.open()
    return store, recovery.paused_queues


async def all_jobs(store: WalStore, ids: list[str]) -> dict[str, Job]:
    got = {i: await store.get(i) for i in ids}
    assert all(j is not None for j in got.values()), [i for i, j in got.items() if j is None]
    return {i: j for i, j in got.items() if j is not None}


def test_the_fixture_is_an_old_log_with_a_snapshot_and_records_after_it() -> None:
    """What the replay test stands on: no new field anywhere, and both kinds of record."""
    data = (OLD / LOG_NAME).read_bytes()
    for name in NEW_FIELDS:
        assert f'"{name}"'.encode() not in data
    records = [log.unframe(line) for line in data.splitlines()]
    assert records[0]["start_seq"] > 1  # compacted
    kinds = [next(iter(r)) for r in records[1:]]
    assert kinds.count("snap") >= 8
    assert kinds.count("sched") == 1
    assert kinds[-1] == "seq"
    assert kinds.index("seq") > kinds.index("snap")
    states = {j["state"] for j in expected()["jobs"].values()}
    assert states == {s.value for s in State} - {"waiting"}  # (no log before workflows held one)


async def test_an_old_log_replays_every_job_as_written_with_the_new_fields_at_defaults(
    old_log: Path,
) -> None:
    want = expected()
    store, paused = await opened(old_log)
    try:
        jobs = await all_jobs(store, sorted(want["jobs"]))
        schedules = await store.list_schedules()
    finally:
        await store.close()
    assert paused == want["paused_queues"] == ["mail"]
    for job_id, job in jobs.items():
        assert json.loads(msgspec.json.encode(job)) == {**want["jobs"][job_id], **DEFAULTS}, job_id
        assert job.all_attempts == job.attempts + job.attempts_total
    assert [msgspec.to_builtins(s) for s in schedules] == want["schedules"]
    revived = jobs["0" * 30 + "a7"]
    assert (revived.state, revived.attempts_total, revived.all_attempts) == ("scheduled", 1, 1)


async def test_new_values_round_trip_on_top_of_an_old_log_through_reopen_and_compaction(
    old_log: Path,
) -> None:
    want = expected()
    ids = sorted(want["jobs"])
    store, _ = await opened(old_log)
    t = NOW + 200
    try:
        jobs = await all_jobs(store, ids)

        async def move(job_id: str, change: Transition) -> None:
            await store.commit([change])
            jobs[job_id] = jobs[job_id].apply(change)

        running = "0" * 30 + "a0"  # running when the old code closed
        progress = Progress(percent=40.0, message="page 4 of 10", at=t)
        await move(running, jobs[running].touch(t, progress=progress, checkpoint={"page": 4}))
        await move(running, jobs[running].request_cancel(t + 1))
        await move(running, jobs[running].withdraw("stopped at the request", t + 2))
        waiting = "0" * 30 + "a1"  # scheduled
        await move(waiting, jobs[waiting].start(t))
        await move(waiting, jobs[waiting].touch(t, checkpoint={"done": [1, 2]}))
        await move(waiting, jobs[waiting].retry("boom", t + 5, t + 1))
        await move(waiting, jobs[waiting].start(t + 5))
        await move(waiting, jobs[waiting].snooze(t + 60, t + 6))
        revived = "0" * 30 + "a7"
        await move(revived, jobs[revived].start(t))
        await move(revived, jobs[revived].complete({"ok": 1}, t + 1))
    finally:
        await store.close()
    cancelled, snoozed, done = jobs["0" * 30 + "a0"], jobs["0" * 30 + "a1"], jobs[revived]
    assert cancelled.state == State.CANCELLED
    assert cancelled.cancel_requested_at == t + 1
    assert cancelled.checkpoint == {"page": 4}
    assert cancelled.progress == progress
    assert [e.error for e in cancelled.errors] == ["stopped at the request"]
    assert (snoozed.state, snoozed.attempts, snoozed.snoozes) == (State.SCHEDULED, 1, 1)
    assert snoozed.checkpoint == {"done": [1, 2]}
    assert [e.attempt for e in snoozed.errors] == [1]
    assert (done.checkpoint, done.all_attempts) == (None, 2)

    store, _ = await opened(old_log)
    try:
        assert await all_jobs(store, ids) == jobs
        await store.compact()
    finally:
        await store.close()
    records = [log.unframe(x) for x in (old_log / LOG_NAME).read_bytes().splitlines()]
    snaps = {r["snap"]["id"]: r["snap"] for r in records if "snap" in r}
    assert snaps[snoozed.id]["checkpoint"] == {"done": [1, 2]}  # the snapshot holds it
    store, _ = await opened(old_log)
    try:
        assert await all_jobs(store, ids) == jobs
    finally:
        await store.close()


async def test_a_remote_claim_on_top_of_an_old_log_keeps_its_holder_and_lease(
    old_log: Path,
) -> None:
    """Issue 23's fields on an old log: a remote worker's claim of an old job, its renewal,
    then a reopen (the records), a compaction (the snapshot) and a reopen of that; the
    job is found running with its holder and lease each time."""
    want = expected()
    store, _ = await opened(old_log)
    t = NOW + 300
    try:
        waiting = await store.get("0" * 30 + "a1")  # scheduled, delayed, in the old log
        assert waiting is not None
        start = waiting.start(t, holder="worker:w1", lease_until=t + 30)
        held = waiting.apply(start)
        renew = held.renew(t + 10, t + 40)
        held = held.apply(renew)
        await store.commit([start])
        await store.commit([renew])
    finally:
        await store.close()
    for compact in (True, False):
        store = WalStore(old_log, clock=FakeClock(NOW + 100), fs=NoSyncFiles())
        recovery = await store.open()
        try:
            assert held.id in recovery.running
            assert await store.get(held.id) == held
            assert (held.holder, held.lease_until) == ("worker:w1", t + 40)
            assert len(await all_jobs(store, sorted(want["jobs"]))) == len(want["jobs"])
            if compact:
                await store.compact()
        finally:
            await store.close()
