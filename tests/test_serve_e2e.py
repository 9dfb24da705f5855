"""End to end through a real ``sqlq serve`` process: kill -9, restart, user handlers."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from sqlq.cli import main
from sqlq.engines.registry import DURABLE
from tests.helpers import spawn_server


def _submit_until_killed(url: str, acked: list[str], stop: threading.Event, n: int) -> None:
    with httpx.Client(base_url=url, timeout=5) as c:
        while not stop.is_set() and len(acked) < n:
            try:
                r = c.post("/jobs", json={"kind": "sleep", "args": {"work_ms": 20}})
            except httpx.TransportError:
                return  # the server is gone; this submission was never acknowledged
            if r.status_code == 201:
                acked.append(r.json()["id"])


@pytest.mark.slow
@pytest.mark.parametrize("store", DURABLE)
def test_kill9_mid_run_then_every_acknowledged_job_finishes(tmp_path: Path, store: str) -> None:
    args = ("--store", store, "--data", str(tmp_path), "--workers", "8")
    server = spawn_server(*args)
    server.wait_ready()
    acked: list[str] = []
    stop = threading.Event()
    clients = [
        threading.Thread(target=_submit_until_killed, args=(server.url, acked, stop, 500))
        for _ in range(8)
    ]
    for t in clients:
        t.start()
    deadline = time.monotonic() + 60
    while len(acked) < 250 and time.monotonic() < deadline:
        time.sleep(0.005)
    server.stop()  # SIGKILL, mid-submission and mid-run
    stop.set()
    for t in clients:
        t.join()
    assert len(acked) >= 250

    again = spawn_server(*args)
    try:
        again.wait_ready()
        recovery = httpx.get(again.url + "/stats").json()["recovery"]
        assert recovery["live_jobs"] > 0  # the kill really interrupted work
        with httpx.Client(base_url=again.url, timeout=5) as c:
            pending = set(acked)
            deadline = time.monotonic() + 60
            while pending and time.monotonic() < deadline:
                for job_id in list(pending):
                    r = c.get(f"/jobs/{job_id}")
                    assert r.status_code == 200, f"acknowledged job {job_id} lost"
                    if r.json()["state"] in ("completed", "dead"):
                        pending.discard(job_id)
                time.sleep(0.05)
            assert not pending, f"{len(pending)} acknowledged jobs never finished"
    finally:
        again.stop()


@pytest.mark.slow  # a real sqlq serve
def test_user_handler_module_runs_and_its_result_is_readable(tmp_path: Path) -> None:
    (tmp_path / "mytasks.py").write_text(
        "from sqlq import task\n\n"
        "@task()\n"
        "async def double(args, ctx):\n"
        "    ctx.beat()\n"
        "    return {'y': args['x'] * 2}\n\n"
        "@task(name='shout')\n"
        "def shout(args):\n"
        "    return args['s'].upper()\n"
    )
    server = spawn_server(
        "--store", "memory", "--import", "mytasks", env={"PYTHONPATH": f"{tmp_path}:{Path.cwd()}"}
    )
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=5) as c:
            a = c.post("/jobs", json={"kind": "double", "args": {"x": 21}}).json()["id"]
            b = c.post("/jobs", json={"kind": "shout", "args": {"s": "hi"}}).json()["id"]
            deadline = time.monotonic() + 20
            results: dict[str, object] = {}
            while len(results) < 2 and time.monotonic() < deadline:
                for job_id in (a, b):
                    job = c.get(f"/jobs/{job_id}").json()
                    if job["state"] == "completed":
                        results[job_id] = job["result"]
                time.sleep(0.02)
        assert results == {a: {"y": 42}, b: "HI"}
    finally:
        server.stop()


@pytest.mark.slow  # a real sqlq serve
def test_sigterm_lets_running_jobs_finish_then_exits_cleanly(tmp_path: Path) -> None:
    args = ("--store", "sqlite", "--data", str(tmp_path), "--workers", "4", "--grace", "10")
    server = spawn_server(*args)
    server.wait_ready()
    with httpx.Client(base_url=server.url, timeout=5) as c:
        ids = [
            c.post("/jobs", json={"kind": "sleep", "args": {"work_ms": 400}}).json()["id"]
            for _ in range(4)
        ]
        deadline = time.monotonic() + 10
        while c.get("/stats").json()["jobs"]["running"] < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert server.stop(signal.SIGTERM) == 0, server.output
    again = spawn_server(*args)
    try:
        again.wait_ready()
        stats = httpx.get(again.url + "/stats").json()
        assert stats["recovery"]["found_running"] == 0
        for job_id in ids:
            assert httpx.get(f"{again.url}/jobs/{job_id}").json()["state"] == "completed"
    finally:
        again.stop()


@pytest.mark.slow  # a real sqlq serve
def test_a_second_signal_cuts_the_grace_period_short(tmp_path: Path) -> None:
    server = spawn_server("--store", "memory", "--workers", "2", "--grace", "120")
    server.wait_ready()
    with httpx.Client(base_url=server.url, timeout=5) as c:
        for _ in range(2):
            c.post("/jobs", json={"kind": "sleep", "args": {"work_ms": 300_000}})
        deadline = time.monotonic() + 10
        while c.get("/stats").json()["jobs"]["running"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)
    # The first signal starts a 120 s grace period for the running jobs: wait until the
    # server says it is in it (uvicorn logs the lifespan shutdown), then signal again.
    deadline = time.monotonic() + 10
    while "Waiting for application shutdown" not in server.output:
        assert time.monotonic() < deadline, server.output
        time.sleep(0.01)
    assert server.proc.poll() is None
    server.proc.send_signal(signal.SIGINT)
    code = server.proc.wait(timeout=20)  # far inside the grace period: the signal cut it
    server.stop()
    assert code in (0, 130), server.output


def test_bad_flags_name_the_flag() -> None:
    runner = CliRunner()
    r = runner.invoke(main, ["serve", "--workers", "-1"])  # (0 is allowed: all remote)
    assert r.exit_code == 2
    assert "--workers" in r.output
    r = runner.invoke(main, ["serve", "--store", "postgres"])
    assert r.exit_code == 2
    assert "--dsn" in r.output
    r = runner.invoke(main, ["serve", "--store", "nosuch"])
    assert r.exit_code == 2
    assert "--store" in r.output
    r = runner.invoke(main, ["serve", "--import", "no_such_module_xyz", "--store", "memory"])
    assert r.exit_code == 2
    assert "--import" in r.output


def test_env_vars_set_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLQ_<FLAG> reaches the service; the server itself is stubbed, so a miss fails, not hangs."""
    import sqlq.serve

    seen: dict[str, object] = {}

    async def fake_serve(runtime: object, opts: object) -> None:
        seen.update(runtime=runtime, opts=opts)

    monkeypatch.setattr(sqlq.serve, "serve", fake_serve)
    env = {
        "SQLQ_STORE": "memory",
        "SQLQ_WORKERS": "7",
        "SQLQ_HB_TIMEOUT": "150",
        "SQLQ_RETRIES": "false",
        "SQLQ_PORT": "18123",
        "SQLQ_MAX_QUEUED": "42",
    }
    r = CliRunner().invoke(main, ["serve"], env=env)
    assert r.exit_code == 0, r.output
    from sqlq.runtime.service import Service

    runtime = seen["runtime"]
    assert isinstance(runtime, Service)
    assert runtime.store.name == "memory"
    cfg = runtime.config
    got = (cfg.workers, cfg.hb_timeout_s, cfg.retry.retries, cfg.max_queued)
    assert got == (7, 0.15, False, 42)
    assert seen["opts"].port == 18123  # type: ignore[attr-defined]
    r = CliRunner().invoke(main, ["serve"], env={"SQLQ_WORKERS": "-1"})
    assert r.exit_code == 2
    assert "--workers" in r.output


@pytest.mark.slow  # a real sqlq serve
def test_corrupt_log_is_a_clean_error_not_a_traceback(tmp_path: Path) -> None:
    """walq only, by nature: it writes a header of walq's format, of a version it is not."""
    from sqlq.walq import log

    d = tmp_path / "walq"
    d.mkdir()
    (d / "walq.log").write_bytes(log.encode({"magic": "walq", "version": 9, "start_seq": 1}))
    server = spawn_server("--store", "wal", "--data", str(tmp_path))
    assert server.proc is not None
    code = server.proc.wait(timeout=30)  # it must exit by itself
    server.stop()
    assert code == 1
    assert "unsupported format version" in server.output
    assert "Traceback" not in server.output
