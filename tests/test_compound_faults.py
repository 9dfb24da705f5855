"""Compound faults with real processes: kill -9 during recovery, again and again.

A large log with a torn tail; the server is started and SIGKILLed while it is
still recovering (before /readyz), three times; the fourth start must find
exactly what a clean recovery finds. Kills during compaction are covered by
``sqlq crashcheck`` (every third walq trial compacts continuously) and every
I/O step of a compaction and of a recovery by the SimDisk tests.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from bench.crashcheck import read_sqlite, read_walq
from tests.serve_helpers import ROOT, Server


def _fill(store: str, data: Path, transitions: int) -> None:
    subprocess.run(
        [sys.executable, "-m", "bench.fill", "--store", store, "--data", str(data),
         "--transitions", str(transitions)],
        check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


@pytest.mark.parametrize("store", ["walq", "sqlite"])
def test_kill9_during_recovery_three_times_then_recover_everything(
    tmp_path: Path, store: str
) -> None:
    _fill(store, tmp_path, 90_000)
    if store == "walq":
        with open(tmp_path / "walq" / "walq.log", "ab") as f:
            f.write(b'{"crc":"00000000","rec":{"seq":')  # and a torn tail to cut
    kills_before_ready = 0
    for delay in (0.05, 0.15, 0.3):
        server = Server("--store", store, "--data", str(tmp_path))
        time.sleep(delay)
        ready = False
        try:
            ready = httpx.get(server.url + "/readyz", timeout=0.05).status_code == 200
        except httpx.TransportError:
            pass
        server.stop()  # SIGKILL, most likely mid-recovery
        kills_before_ready += not ready
    assert kills_before_ready >= 1  # at least one kill really landed inside recovery
    final = Server("--store", store, "--data", str(tmp_path))
    try:
        final.wait_ready(60)
    finally:
        final.stop(signal.SIGTERM)
    # Read offline, without the engine: every job the fill made is still there. Some
    # may have run in a life that got ready before its kill; none may be missing.
    if store == "walq":
        jobs = read_walq(tmp_path / "walq" / "walq.log")
    else:
        jobs = read_sqlite(tmp_path / "sqlite" / "sqlq.db")
    live = 90_000 // 30
    assert len(jobs) == (90_000 - live) // 3 + live
    assert {j.state for j in jobs.values()} <= {"completed", "scheduled", "running"}
    if store == "walq":
        broken = sorted(p.name for p in (tmp_path / "walq").iterdir() if "broken" in p.name)
        assert broken  # the torn tail was kept, never deleted
