"""walq's recovery rule: torn tails are cut and kept, damage in the middle is loud."""

from __future__ import annotations

import shutil
from pathlib import Path

import msgspec
import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.errors import CorruptLogError, StoreFailedError
from sqlq.common.models import Job, State
from sqlq.walq import log
from sqlq.walq.repair import repair
from sqlq.walq.store import WalStore
from tests.walq_helpers import NOW, FaultyFiles, NoSyncFiles, log_path, read_state, write_history


def last_record_offset(data: bytes) -> int:
    return data.rstrip(b"\n").rfind(b"\n") + 1


async def test_truncation_at_every_byte_of_the_last_record(tmp_path: Path) -> None:
    src = tmp_path / "src"
    final = await write_history(src)
    data = log_path(src).read_bytes()
    start = last_record_offset(data)
    ids = sorted(final)
    # The fold of the complete records: everything but the last (job-000's completion).
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    log_path(ref_dir).write_bytes(data[:start])
    before_last = await read_state(ref_dir, ids)
    assert before_last["job-000"] is not None
    assert before_last["job-000"].state is State.RUNNING
    assert final["job-000"].state is State.COMPLETED

    for cut in range(start + 1, len(data)):
        d = tmp_path / f"cut-{cut}"
        d.mkdir()
        log_path(d).write_bytes(data[:cut])
        store = WalStore(d, clock=FakeClock(NOW), fs=NoSyncFiles())
        recovery = await store.open()
        assert recovery.torn_bytes == cut - start
        assert {i: await store.get(i) for i in ids} == before_last
        extra = Job.new(kind="sleep", args={}, now=NOW, job_id="after-the-cut")
        await store.commit([extra])
        await store.close()
        # The cut bytes were kept, and the log is whole again.
        assert (d / "walq.log.broken-1").read_bytes() == data[start:cut]
        again = await read_state(d, [*ids, extra.id])
        assert again == {**before_last, extra.id: extra}
        shutil.rmtree(d)

    d = tmp_path / "whole"
    d.mkdir()
    log_path(d).write_bytes(data)
    assert await read_state(d, ids) == final


async def test_flipped_byte_in_the_middle_fails_open_and_repair_keeps_prefix(
    tmp_path: Path,
) -> None:
    final = await write_history(tmp_path)
    path = log_path(tmp_path)
    data = path.read_bytes()
    offsets = [off for off, _, _ in log.lines(data)]
    victim = offsets[len(offsets) // 2]
    damaged = bytearray(data)
    damaged[victim + 40] ^= 0x01  # inside the record, not the newline
    path.write_bytes(bytes(damaged))

    store = WalStore(tmp_path, clock=FakeClock(NOW))
    with pytest.raises(CorruptLogError) as err:
        await store.open()
    assert err.value.offset == victim
    assert err.value.path == str(path)
    assert f"offset {victim}" in str(err.value)

    report = repair(tmp_path)
    assert report.kept_bytes == victim
    assert report.moved_to is not None
    assert Path(report.moved_to).read_bytes() == bytes(damaged[victim:])
    assert path.read_bytes() == data[:victim]
    # The prefix opens, and holds exactly what its records say.
    got = await read_state(tmp_path, sorted(final))
    records = [rec for _, rec in log.scan(data[:victim]).changes]
    assert all(isinstance(rec, log.ChangeRecord) for rec in records)  # the typed path read them
    prefix_ids = {
        op.put.id
        for rec in records
        if isinstance(rec, log.ChangeRecord)
        for op in rec.ops
        if op.put is not None
    }
    assert {i for i, j in got.items() if j is not None} == prefix_ids


async def test_a_gap_in_sequence_numbers_is_corruption(tmp_path: Path) -> None:
    await write_history(tmp_path)
    path = log_path(tmp_path)
    data = path.read_bytes()
    found = list(log.lines(data))
    off, line, _ = found[5]  # drop one whole, valid record from the middle
    path.write_bytes(data[:off] + data[off + len(line) + 1 :])
    with pytest.raises(CorruptLogError) as err:
        await WalStore(tmp_path).open()
    assert err.value.offset == off
    assert "sequence" in err.value.reason


async def test_future_format_version_is_refused(tmp_path: Path) -> None:
    path = log_path(tmp_path)
    path.write_bytes(log.encode({"magic": "walq", "version": 2, "start_seq": 1}))
    with pytest.raises(CorruptLogError, match="unsupported format version"):
        await WalStore(tmp_path).open()


def test_a_foreign_version_is_damage_by_its_type_even_as_the_last_line() -> None:
    """Whole and checksummed, so never a torn write: the scan says so by the error's type,
    not by what its message starts with."""
    sc = log.scan(log.encode({"magic": "walq", "version": 2, "start_seq": 1}))
    assert isinstance(sc.bad, log.ForeignVersion)
    assert (sc.corrupt, sc.bad_offset) == (True, 0)
    torn = log.scan(log.header(1, 0.0)[:-1])  # no newline: a torn write
    assert type(torn.bad) is log.BadLine
    assert (torn.corrupt, torn.bad_reason) == (False, "no newline at end of file")


async def test_empty_file_opens_as_an_empty_log(tmp_path: Path) -> None:
    log_path(tmp_path).write_bytes(b"")
    store = WalStore(tmp_path)
    recovery = await store.open()
    assert recovery.jobs == []
    job = Job.new(kind="sleep", args={}, now=NOW)
    await store.commit([job])
    await store.close()
    assert await read_state(tmp_path, [job.id]) == {job.id: job}


@pytest.mark.parametrize("op", ["write", "fdatasync"])
async def test_failed_append_is_fatal_and_nothing_unsynced_is_acked(
    tmp_path: Path, op: str
) -> None:
    fs = FaultyFiles(op, where="walq.log", nth=3)
    store = WalStore(tmp_path, fs=fs)
    await store.open()
    acked = []
    for i in range(2):
        job = Job.new(kind="sleep", args={"i": i}, now=NOW)
        await store.commit([job])
        acked.append(job)
    with pytest.raises(StoreFailedError):
        await store.commit([Job.new(kind="sleep", args={}, now=NOW)])
    # Never retried: the engine stays failed until it is reopened.
    with pytest.raises(StoreFailedError):
        await store.commit([Job.new(kind="sleep", args={}, now=NOW)])
    assert store.stats().failed
    await store.close()
    got = await read_state(tmp_path, [j.id for j in acked])
    assert got == {j.id: j for j in acked}


async def test_a_snapshot_job_the_index_refuses_is_damage_at_its_offset(tmp_path: Path) -> None:
    """A compacted log's jobs go from the scan straight into the index (``scan``'s ``job``):
    one it refuses, a job twice, still fails the open naming that record's byte offset."""
    a, b = (Job.new(kind="sleep", args={}, now=NOW + n) for n in range(2))
    snap = [log.encode({"snap": msgspec.to_builtins(j)}) for j in (a, a, b)]
    head = log.header(1, NOW)
    log_path(tmp_path).write_bytes(head + b"".join(snap))
    with pytest.raises(CorruptLogError) as err:
        await WalStore(tmp_path).open()
    assert err.value.offset == len(head) + len(snap[0])
    assert "bad snapshot record" in err.value.reason
    assert "DuplicateJobError" in err.value.reason
    # whole, the same jobs open as written
    log_path(tmp_path).write_bytes(head + snap[0] + snap[2])
    store = WalStore(tmp_path)
    recovery = await store.open()
    assert recovery.by_id == {a.id: a, b.id: b}
    await store.close()
