"""walq under simulated power loss: every acknowledged change survives at --sync full.

A workload of jobs (some submitted three at a time) runs submit -> start ->
complete, with compactions, on a ``SimDisk``. The power is cut after N I/O
calls; the disk a power cut would leave is rebuilt; walq recovers it. Each
job's operations are issued one after another, so the recovered job must be
the fold of a prefix of its own operations that holds every acknowledged one
(the operation in flight at the cut may or may not have landed), and a batch
submission must be all there or not at all.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.errors import StoreError
from sqlq.common.models import Job, Transition
from sqlq.walq.store import WalStore
from tests.helpers import NOW
from tests.powerloss import TAIL_MODES, SimDisk


@dataclass
class Script:
    ops: list[Job | Transition]
    states: list[Job | None]  # states[i] = the job after its first i operations
    group: int
    acked: int = 0


def scripts(n_groups: int = 8) -> list[Script]:
    out = []
    k = 0
    for g in range(n_groups):
        for _ in range(3 if g % 3 == 0 else 1):  # every third submission is a batch of 3
            job = Job.new(kind="sleep", args={"k": k}, now=NOW, job_id=f"job-{k:03}")
            start = job.start(NOW + 1)
            running = job.apply(start)
            done = running.complete({"k": k}, NOW + 2)
            out.append(Script([job, start, done], [None, job, running, running.apply(done)], g))
            k += 1
    return out


@dataclass
class Outcome:
    scripts: list[Script]
    io_calls: list[str] = field(default_factory=list)


async def run_workload(data: Path, disk: SimDisk, sync: str = "full") -> Outcome:
    store = WalStore(
        data, sync=sync, fs=disk, clock=FakeClock(NOW),
        compact_floor_bytes=1500, compact_ratio=1.5,
    )  # fmt: skip
    ss = scripts()
    try:
        await store.open()
    except StoreError:
        return Outcome(ss)
    except OSError:
        return Outcome(ss)

    async def group_life(members: list[Script]) -> None:
        try:
            await store.commit([s.ops[0] for s in members])
            for s in members:
                s.acked = 1
            for step in (1, 2):
                for s in members:
                    await store.commit([s.ops[step]])
                    s.acked = step + 1
        except StoreError:
            return

    async def compactor() -> None:
        await asyncio.sleep(0)
        try:
            await store.compact()
        except StoreError:
            pass

    groups: dict[int, list[Script]] = {}
    for s in ss:
        groups.setdefault(s.group, []).append(s)
    await asyncio.gather(*(group_life(m) for m in groups.values()), compactor())
    await store.close()
    return Outcome(ss, list(disk.calls))


async def recover(data: Path, disk: SimDisk) -> dict[str, Job | None]:
    store = WalStore(data, fs=disk, clock=FakeClock(NOW))
    await store.open()
    try:
        return {f"job-{k:03}": await store.get(f"job-{k:03}") for k in range(20)}
    finally:
        await store.close()


def lost_acknowledged(outcome: Outcome, got: dict[str, Job | None]) -> int:
    """Acked operations missing after recovery; raises if a state is not a prefix fold."""
    lost = 0
    present_by_group: dict[int, set[bool]] = {}
    for s in outcome.scripts:
        job_id = s.ops[0].id  # type: ignore[union-attr]
        state = got[job_id]
        matches = [i for i, expected in enumerate(s.states) if expected == state]
        assert matches, f"{job_id}: recovered state is not a fold of its operations: {state}"
        i = matches[-1]
        assert i <= s.acked + 1, f"{job_id}: recovered more than was ever issued"
        if i < s.acked:
            lost += s.acked - i
        present_by_group.setdefault(s.group, set()).add(state is not None)
    for g, present in present_by_group.items():
        assert len(present) == 1, f"batch {g} partly recovered: not atomic"
    return lost


def total_io_calls(tmp_path: Path) -> list[str]:
    disk = SimDisk()
    outcome = asyncio.run(run_workload(tmp_path / "count", disk))
    assert all(s.acked == 3 for s in outcome.scripts)
    return outcome.io_calls


def test_a_clean_run_compacts_and_recovers_everything(tmp_path: Path) -> None:
    disk = SimDisk()
    outcome = asyncio.run(run_workload(tmp_path, disk))
    assert "replace" in outcome.io_calls  # compaction really ran
    got = asyncio.run(recover(tmp_path, disk.after_cut("synced", random.Random(0))))
    assert lost_acknowledged(outcome, got) == 0
    assert all(got[s.ops[0].id] == s.states[3] for s in outcome.scripts)  # type: ignore[union-attr]


@pytest.mark.parametrize("seed", range(60))
def test_random_power_cuts_lose_nothing_acknowledged(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randrange(1, 160)
    mode = TAIL_MODES[seed % len(TAIL_MODES)]
    disk = SimDisk(cut_after=n)
    outcome = asyncio.run(run_workload(tmp_path, disk))
    got = asyncio.run(recover(tmp_path, disk.after_cut(mode, rng)))
    assert lost_acknowledged(outcome, got) == 0


def test_a_cut_after_every_single_io_call_loses_nothing_acknowledged(tmp_path: Path) -> None:
    calls = total_io_calls(tmp_path)
    assert {"replace", "fsync_dir"} <= set(calls)  # the loop covers compaction's steps
    rng = random.Random(7)
    for n in range(len(calls) + 1):
        for mode in ("synced", "prefix"):
            d = tmp_path / f"cut-{n}-{mode}"
            disk = SimDisk(cut_after=n)
            outcome = asyncio.run(run_workload(d, disk))
            got = asyncio.run(recover(d, disk.after_cut(mode, rng)))
            assert lost_acknowledged(outcome, got) == 0, f"cut after {n} I/O calls ({mode})"


def test_sync_os_loss_is_measured_not_hidden(tmp_path: Path) -> None:
    """--sync os never fdatasyncs an append: a power cut loses acknowledged work."""
    clean = asyncio.run(run_workload(tmp_path / "os-count", SimDisk(), sync="os"))
    total = len(clean.io_calls)
    lost_total = 0
    for n in (total // 2, 3 * total // 4, total - 1):
        disk = SimDisk(cut_after=n)
        outcome = asyncio.run(run_workload(tmp_path / f"os-{n}", disk, sync="os"))
        got = asyncio.run(recover(tmp_path / f"os-{n}", disk.after_cut("synced", random.Random(n))))
        lost_total += lost_acknowledged(outcome, got)
    print(
        f"--sync os: {lost_total} acknowledged operations lost over 3 power cuts "
        f"(of {total} I/O calls in the run)"
    )
    assert lost_total > 0


def test_a_power_cut_during_recovery_of_a_torn_tail_loses_nothing(tmp_path: Path) -> None:
    """Compound fault: the log has a torn tail, and the power goes while recovery cuts it."""
    clean = SimDisk()
    outcome = asyncio.run(run_workload(tmp_path, clean))
    torn = clean.after_cut("synced", random.Random(0))
    log = str(tmp_path / "walq.log")
    torn.inodes[torn.names[log]].data += b'{"crc":"1234abcd","rec":{"seq":99'  # a torn write
    torn.inodes[torn.names[log]].synced = bytes(torn.inodes[torn.names[log]].data)
    expect = asyncio.run(recover(tmp_path, torn.after_cut("synced", random.Random(0))))
    assert lost_acknowledged(outcome, expect) == 0

    probe = torn.after_cut("synced", random.Random(0))
    asyncio.run(recover(tmp_path, probe))
    recovery_calls = len(probe.calls)
    assert {"truncate", "fdatasync", "fsync_dir"} <= set(probe.calls)
    for n in range(recovery_calls + 1):
        for mode in ("synced", "prefix"):
            disk = torn.after_cut("synced", random.Random(n))
            disk.cut_after = n
            cause: BaseException | None = None
            try:
                asyncio.run(recover(tmp_path, disk))
            except StoreError as exc:  # the power went mid-recovery
                cause = exc.__cause__
            assert cause is None or isinstance(cause, OSError), cause
            got = asyncio.run(recover(tmp_path, disk.after_cut(mode, random.Random(n))))
            assert got == expect, f"cut after {n} recovery I/O calls ({mode})"
