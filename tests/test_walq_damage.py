"""Damaged walq logs: every case is either a torn tail or a loud error, never a skip.

The oracle: damage to bytes [a, b) lands in line L. If any original line starts
at or after b (a whole record survives after the damage), open must fail with
``CorruptLogError`` naming the file and L's offset. Otherwise the damage reaches
the end and is indistinguishable from a torn write: open succeeds with exactly
the fold of the lines before L, and the cut bytes are kept beside the log.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sqlq.common.clock import FakeClock
from sqlq.common.errors import CorruptLogError
from sqlq.common.models import Job
from sqlq.walq import log
from sqlq.walq.repair import repair
from sqlq.walq.store import WalStore
from tests.walq_helpers import NOW, NoSyncFiles, log_path, read_state, write_history

_SOURCE = Path(tempfile.mkdtemp(prefix="walq-damage-src-"))
asyncio.run(write_history(_SOURCE, n=12))
DATA = log_path(_SOURCE).read_bytes()
STARTS = [off for off, _, _ in log.lines(DATA)]
IDS = [f"job-{i:03}" for i in range(12)]
_FOLDS: dict[int, dict[str, Job | None]] = {}


def fold_before(line: int) -> dict[str, Job | None]:
    """The state recovery must give when the log is cut at the start of ``line``."""
    if line not in _FOLDS:
        d = Path(tempfile.mkdtemp(prefix="walq-damage-ref-"))
        log_path(d).write_bytes(DATA[: STARTS[line]])
        _FOLDS[line] = asyncio.run(read_state(d, IDS)) if line > 0 else {i: None for i in IDS}
        shutil.rmtree(d)
    return _FOLDS[line]


def line_of(offset: int) -> int:
    return max(i for i, s in enumerate(STARTS) if s <= offset)


def check(damaged: bytes, a: int, b: int) -> None:
    line = line_of(a)
    intact_after = any(s >= b for s in STARTS)
    d = Path(tempfile.mkdtemp(prefix="walq-damage-"))
    try:
        log_path(d).write_bytes(damaged)
        if intact_after:
            with pytest.raises(CorruptLogError) as err:
                asyncio.run(WalStore(d, clock=FakeClock(NOW), fs=NoSyncFiles()).open())
            assert err.value.offset == STARTS[line]
            assert err.value.path == str(log_path(d))
            # repair keeps the valid prefix and every byte it cut
            report = repair(d)
            assert report.kept_bytes == STARTS[line]
            assert report.moved_to is not None
            assert log_path(d).read_bytes() + Path(report.moved_to).read_bytes() == damaged
        assert asyncio.run(read_state(d, IDS)) == fold_before(line)
        if not intact_after and line > 0:
            kept = sorted(p.name for p in d.iterdir() if ".broken-" in p.name)
            assert kept == ["walq.log.broken-1"]
    finally:
        shutil.rmtree(d)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(offset=st.integers(0, len(DATA) - 1), bit=st.integers(0, 7))
def test_a_flipped_bit_anywhere(offset: int, bit: int) -> None:
    damaged = bytearray(DATA)
    damaged[offset] ^= 1 << bit
    check(bytes(damaged), offset, offset + 1)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(offset=st.integers(0, len(DATA) - 1), length=st.integers(1, 400))
def test_a_run_of_zeros_anywhere(offset: int, length: int) -> None:
    end = min(len(DATA), offset + length)
    damaged = DATA[:offset] + bytes(end - offset) + DATA[end:]
    check(damaged, offset, end)


def test_a_damaged_newline_before_the_last_record_is_not_taken_for_a_torn_tail() -> None:
    nl = STARTS[-1] - 1  # the newline ending the second-to-last record
    damaged = DATA[:nl] + b"X" + DATA[nl + 1 :]
    check(damaged, nl, nl + 1)  # the last record is whole after it: corruption


def test_a_last_record_cut_short_with_a_newline() -> None:
    last = STARTS[-1]
    damaged = DATA[: last + 30] + b"\n"  # the record's JSON runs past what was written
    check(damaged, last, len(damaged))


def test_a_missing_final_newline_is_a_torn_tail() -> None:
    check(DATA[:-1], len(DATA) - 1, len(DATA))


def test_a_truncated_header() -> None:
    d = Path(tempfile.mkdtemp(prefix="walq-damage-"))
    log_path(d).write_bytes(DATA[:10])

    async def open_and_close() -> object:
        store = WalStore(d, clock=FakeClock(NOW))
        recovery = await store.open()
        await store.close()
        return recovery

    recovery = asyncio.run(open_and_close())
    assert recovery.torn_bytes == 10  # type: ignore[attr-defined]
    assert recovery.jobs == []  # type: ignore[attr-defined]
    assert (d / "walq.log.broken-1").read_bytes() == DATA[:10]
    shutil.rmtree(d)


@pytest.mark.parametrize("twice", ["id", "idempotency_key"])
def test_a_snapshot_holding_a_job_or_a_key_twice_fails_the_open(tmp_path: Path, twice: str) -> None:
    """A snapshot's jobs fold through ``JobIndex.insert``, with replay's checks: a second job
    of the same id, or of the same key, is damage, named at its record."""
    first = Job.new(kind="k", args={}, now=NOW, job_id="1" * 32, idempotency_key="key")
    second = Job.new(kind="k", args={}, now=NOW, job_id="1" * 32 if twice == "id" else "2" * 32,
                     idempotency_key="key")  # fmt: skip
    d = tmp_path / "walq"
    d.mkdir()
    snaps = [log.frame(b'{"snap":%s}' % msgspec.json.encode(j)) for j in (first, second)]
    path = d / "walq.log"
    path.write_bytes(log.header(1, NOW) + b"".join(snaps))

    async def go() -> None:
        store = WalStore(d, clock=FakeClock(NOW), fs=NoSyncFiles())
        with pytest.raises(CorruptLogError) as err:
            await store.open()
        assert str(len(log.header(1, NOW)) + len(snaps[0])) in str(err.value)
        assert "Duplicate" in str(err.value)

    asyncio.run(go())
