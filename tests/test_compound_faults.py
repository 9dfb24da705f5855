"""Compound faults with real processes: kill -9 during recovery, again and again.

A large log with a torn tail; the server is started and SIGKILLed while it is
still recovering (before /readyz), three times; the fourth start must find
exactly what a clean recovery of a copy of the same files finds, and what the
files held before any server touched them. Kills during compaction are covered by
``sqlq crashcheck`` (every third walq trial compacts continuously) and every
I/O step of a compaction and of a recovery by the SimDisk tests.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sqlq.bench.offline import JobFacts, read_data
from sqlq.engines.registry import DURABLE
from tests.helpers import ROOT, spawn_server

pytestmark = pytest.mark.slow


def _fill(store: str, data: Path, transitions: int) -> None:
    subprocess.run(
        [sys.executable, "-m", "sqlq.bench.fill", "--store", store, "--data", str(data),
         "--transitions", str(transitions)],
        check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


@pytest.mark.parametrize("store", DURABLE)
def test_kill9_during_recovery_three_times_then_recover_everything(
    tmp_path: Path, store: str
) -> None:
    data, clean = tmp_path / "data", tmp_path / "clean"
    _fill(store, data, 90_000)
    if store == "walq":
        with open(data / "walq" / "walq.log", "ab") as f:
            f.write(b'{"crc":"00000000","rec":{"seq":')  # and a torn tail to cut
    before = _read(store, data)  # the truth, read offline before any server ran
    shutil.copytree(data, clean)
    _start_and_stop(store, clean)  # a clean recovery of the same files
    kills_before_ready = 0
    for delay in (0.05, 0.15, 0.3):
        server = spawn_server("--store", store, "--data", str(data))
        time.sleep(delay)  # the moment of the kill, not a wait for a condition
        ready = False
        try:
            ready = httpx.get(server.url + "/readyz", timeout=0.05).status_code == 200
        except httpx.TransportError:
            pass
        server.stop()  # SIGKILL, most likely mid-recovery
        kills_before_ready += not ready
    assert kills_before_ready >= 1  # at least one kill really landed inside recovery
    _start_and_stop(store, data)
    killed, recovered = _read(store, data), _read(store, clean)
    # Every job is in both, and nothing else: no acknowledged job lost, none invented.
    assert set(killed) == set(recovered) == set(before)
    live = 90_000 // 30
    assert len(before) == (90_000 - live) // 3 + live
    # What had finished before the crash is exactly as it was, after both recoveries.
    finished = {i for i, j in before.items() if j.state == "completed"}
    assert {i: killed[i] for i in finished} == {i: before[i] for i in finished}
    assert {i: recovered[i] for i in finished} == {i: before[i] for i in finished}
    # What was live may have run meanwhile (a life that got ready before its kill),
    # so it is live or finished, and never further back than before.
    for i in set(before) - finished:
        for after in (killed[i], recovered[i]):
            assert after.state in {"scheduled", "running", "completed"}, after
            assert after.attempts >= before[i].attempts
    if store == "walq":
        broken = sorted(p.name for p in (data / "walq").iterdir() if "broken" in p.name)
        assert broken  # the torn tail was kept, never deleted


def _read(store: str, data: Path) -> dict[str, JobFacts]:
    """The jobs in ``data``, read without the engine's code."""
    return read_data(store, data)


def _start_and_stop(store: str, data: Path) -> None:
    server = spawn_server("--store", store, "--data", str(data))
    try:
        server.wait_ready(60)
    finally:
        assert server.stop(signal.SIGTERM) == 0, server.output
