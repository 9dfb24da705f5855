"""``log.scan`` reads a snapshot's lines a run at a time (``_snapshot_run``): whatever the
run's size, it hands over the same records at the same offsets, and finds the same damage
at the same offset, as the line-by-line reader (a run size of 0: no run is ever taken)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from sqlq.common.models import Job
from sqlq.walq import log
from tests.walq_helpers import NOW

SIZES = (0, 1, 300, 1_000, 5_000, 1 << 22)  # 0: line by line, the reference


def snapshot_log(n: int) -> bytes:
    """A compacted log: its header, ``n`` jobs' snapshot records (args of growing sizes,
    so the lines differ in length), a schedule's, then one change record."""
    jobs = [
        Job.new(kind="sleep", args={"n": i, "pad": "x" * (i % 37)}, now=NOW + i) for i in range(n)
    ]
    lines = [log.header(7, NOW)]
    lines += [log.frame(b'{"snap":%s}' % msgspec.json.encode(job)) for job in jobs]
    lines.append(log.encode({"sched": {"name": "nightly"}}))
    later = jobs[0].start(NOW + 999)
    lines.append(log.frame(b'{"seq":7,"ops":[{"set":%s}]}' % msgspec.json.encode(later)))
    return b"".join(lines)


def scanned(data: bytes, size: int, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, ...]:
    monkeypatch.setattr(log, "SNAPSHOT_RUN_BYTES", size)
    folded: list[tuple[int, bool, str]] = []

    def fold(offset: int, is_snap: bool, record: Any) -> None:
        name = record.id if isinstance(record, Job) else type(record).__name__
        folded.append((offset, is_snap, name))

    s = log.scan(data, fold)
    return tuple(folded), s.valid_end, s.bad_offset, s.bad_reason, s.corrupt, s.records, s.last_seq


def test_every_run_size_folds_what_the_line_reader_folds(monkeypatch: pytest.MonkeyPatch) -> None:
    data = snapshot_log(120)
    reference = scanned(data, 0, monkeypatch)
    folded, valid_end, bad_offset, _, _, records, last_seq = reference
    assert (valid_end, bad_offset, records, last_seq) == (len(data), None, 122, 7)
    assert [is_snap for _, is_snap, _ in folded] == [True] * 121 + [False]
    run = log._snapshot_run
    taken: list[int] = []

    def spy(data: bytes, start: int, emit: log.Fold) -> tuple[int, int]:
        n, end = run(data, start, emit)
        taken.append(n)
        return n, end

    monkeypatch.setattr(log, "_snapshot_run", spy)
    for size in SIZES[1:]:
        taken.clear()
        assert scanned(data, size, monkeypatch) == reference, size
        if 1_000 <= size < len(data):  # most runs hold jobs only: those are taken whole
            assert sum(taken) > 60, (size, taken)


@pytest.mark.parametrize("line", [1, 2, 60, 119, 120])
def test_damage_in_any_run_is_found_where_the_line_reader_finds_it(
    monkeypatch: pytest.MonkeyPatch, line: int
) -> None:
    data = bytearray(snapshot_log(120))
    start = 0
    for _ in range(line):  # the start of that line (0: the header)
        start = data.index(b"\n", start) + 1
    data[start + 40] ^= 0x01  # a bit inside the record: its CRC no longer holds
    damaged = bytes(data)
    reference = scanned(damaged, 0, monkeypatch)
    assert reference[2] == start
    assert reference[4]
    for size in SIZES[1:]:
        assert scanned(damaged, size, monkeypatch) == reference, size


@pytest.mark.parametrize("cut", [1, 30, 200])
def test_a_torn_snapshot_tail_ends_the_prefix_where_the_line_reader_ends_it(
    monkeypatch: pytest.MonkeyPatch, cut: int
) -> None:
    whole = snapshot_log(80)
    sched = whole.rindex(b'{"crc"', 0, whole.index(b'"sched"'))
    last_snap = whole.rindex(b'{"crc"', 0, sched)
    torn = whole[: last_snap + cut]  # the last job's line, cut short: nothing after it
    reference = scanned(torn, 0, monkeypatch)
    assert reference[1] == last_snap
    assert not reference[4]
    for size in SIZES[1:]:
        assert scanned(torn, size, monkeypatch) == reference, size


def test_a_snapshot_job_whose_typed_decode_fails_goes_the_generic_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = snapshot_log(30)
    odd = log.frame(b'{"snap":{"id":"x","kind":7}}')  # framed whole, not a Job
    at = data.index(b"\n") + 1
    mixed = data[:at] + odd + data[at:]
    reference = scanned(mixed, 0, monkeypatch)
    assert reference[0][0] == (at, True, "dict")  # handed over as read
    for size in SIZES[1:]:
        assert scanned(mixed, size, monkeypatch) == reference, size
