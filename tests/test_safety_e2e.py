"""Safety through a real ``sqlq serve``: poison results, tokens, binding, files, logs."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from sqlq.cli import main
from sqlq.engines.registry import DURABLE
from tests.helpers import spawn_server

POISON = (
    "from sqlq import task\n\n"
    "@task()\n"
    "def poison(args):\n"
    "    return object()\n\n"
    "@task()\n"
    "def fine(args):\n"
    "    return {'ok': True}\n"
)


def _wait_state(c: httpx.Client, job_id: str, states: set[str], within: float = 30) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        job = c.get(f"/jobs/{job_id}").json()
        if job["state"] in states:
            return job  # type: ignore[no-any-return]
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} never reached {states}")


@pytest.mark.slow  # a real sqlq serve
@pytest.mark.parametrize("store", DURABLE)
def test_a_handler_returning_object_leaves_the_store_healthy_across_a_restart(
    tmp_path: Path, store: str
) -> None:
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "poisontasks.py").write_text(POISON)
    env = {"PYTHONPATH": f"{mods}:{Path.cwd()}"}
    args = ("--store", store, "--data", str(tmp_path / "data"), "--import", "poisontasks")
    server = spawn_server(*args, "--max-attempts", "2", env=env)
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=10) as c:
            bad = c.post("/jobs", json={"kind": "poison"}).json()["id"]
            # Killed while the poison job waits for its retry: recovery must not loop on it.
            job = _wait_state(c, bad, {"dead"})
            assert job["last_error"] == "result is not JSON-serialisable: object"
            assert job["attempts"] == 2
            r = c.post("/jobs", json={"kind": "fine"})
            assert r.status_code == 201
            assert c.get("/readyz").status_code == 200
            assert c.get("/healthz").status_code == 200
            pending = c.post("/jobs", json={"kind": "poison", "delay_ms": 500}).json()["id"]
    finally:
        server.stop()  # kill -9, with a poison job still scheduled
    again = spawn_server(*args, "--max-attempts", "2", env=env)
    try:
        again.wait_ready()
        with httpx.Client(base_url=again.url, timeout=10) as c:
            assert c.get(f"/jobs/{bad}").json()["state"] == "dead"
            assert _wait_state(c, pending, {"dead"})["attempts"] == 2
            assert c.post("/jobs", json={"kind": "fine"}).status_code == 201
            assert c.get("/readyz").status_code == 200
            assert c.get("/stats").json()["store"].get("failed") is None
    finally:
        again.stop()


def test_a_non_loopback_host_without_a_token_refuses_to_start() -> None:
    r = CliRunner().invoke(main, ["serve", "--host", "0.0.0.0", "--store", "memory"])
    assert r.exit_code == 2
    assert "--token" in r.output
    r = CliRunner().invoke(
        main,
        ["serve", "--host", "0.0.0.0", "--allow-no-token", "--allowed-host", "queue.internal",
         "--import", "no_such_module_xyz"],
    )  # fmt: skip
    assert r.exit_code == 2  # past the token check; stopped by the next bad flag
    assert "--import" in r.output
    assert "--token" not in r.output
    r = CliRunner().invoke(main, ["serve", "--token", " ", "--store", "memory"])
    assert r.exit_code == 2
    assert "--token" in r.output


@pytest.mark.parametrize(
    ("args", "flag", "says"),
    [
        (["--token", "short-token"], "--token", "at least 16 characters"),
        (["--token", "0123456789abcde"], "--token", "at least 16 characters"),
        (["--host", "0.0.0.0", "--allow-no-token"], "--allowed-host", "--allowed-host"),
        (["--host", "127.evil.example"], "--token", "reachable from other machines"),
    ],
)
def test_serve_refuses_a_weak_token_or_an_open_binding(
    args: list[str], flag: str, says: str
) -> None:
    r = CliRunner().invoke(main, ["serve", "--store", "memory", *args])
    assert r.exit_code == 2, r.output
    assert flag in r.output
    assert says in r.output
    assert "Traceback" not in r.output


@pytest.mark.slow  # a real sqlq serve
def test_the_token_from_the_environment_guards_the_api_and_never_reaches_logs(
    tmp_path: Path,
) -> None:
    token = "tok-9f8e7d6c5b4a"
    server = spawn_server(
        "--store", "sqlite", "--data", str(tmp_path), "--log-level", "debug", "--access-log",
        env={"SQLQ_TOKEN": token},
    )  # fmt: skip
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=10) as c:
            assert c.post("/jobs", json={"kind": "sleep"}).status_code == 401
            bad = {"authorization": "Bearer " + token[:-1]}
            assert c.post("/jobs", json={"kind": "sleep"}, headers=bad).status_code == 401
            good = {"authorization": "Bearer " + token}
            assert c.post("/jobs", json={"kind": "sleep"}, headers=good).status_code == 201
            stats = c.get("/stats", headers=good)
            assert stats.status_code == 200
            assert token not in stats.text
            assert c.get("/healthz").status_code == 200
    finally:
        server.stop()
    assert token not in server.output
    assert token not in server.output
    assert "401" in server.output  # the access log was on, and saw the requests


@pytest.mark.slow  # a real sqlq serve
def test_the_memory_store_warns_that_nothing_survives() -> None:
    server = spawn_server("--store", "memory")
    try:
        server.wait_ready()
        assert httpx.get(server.url + "/stats").json()["durable"] is False
    finally:
        server.stop()
    assert "nothing survives a restart" in server.output


# What each engine keeps under --data: every durable engine must be named here (a new one
# fails with a KeyError below until its files are, rather than going unchecked).
PRIVATE_FILES = {
    "walq": ["walq/walq.log", "walq/walq.lock"],
    "sqlite": ["sqlite/sqlq.db", "sqlite/sqlq.db-wal", "sqlite/sqlq.db-shm", "sqlite/sqlq.lock"],
}


@pytest.mark.slow  # a real sqlq serve
@pytest.mark.parametrize("store", DURABLE)
def test_data_directory_is_private(tmp_path: Path, store: str) -> None:
    files = PRIVATE_FILES[store]
    os.umask(0o022)
    data = tmp_path / "fresh" / "data"
    server = spawn_server("--store", store, "--data", str(data))
    try:
        server.wait_ready()
        assert httpx.post(server.url + "/jobs", json={"kind": "sleep"}).status_code == 201
        for d in (data, data / store):
            assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
        for name in files:
            assert stat.S_IMODE((data / name).stat().st_mode) == 0o600, name
    finally:
        server.stop()


@pytest.mark.slow  # a real sqlq serve
@pytest.mark.parametrize("store", DURABLE)
def test_an_unsafe_data_directory_is_refused(tmp_path: Path, store: str) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o700)
    shared.chmod(0o770)
    _refused(("--store", store, "--data", str(shared)), "writable by group or others")
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 65534, 65534)  # nobody; the tests run as root, which may do this
    _refused(("--store", store, "--data", str(foreign)), "belongs to uid 65534")


@pytest.mark.slow  # a real sqlq serve
def test_a_log_replaced_by_a_link_is_not_followed(tmp_path: Path) -> None:
    """walq only, by nature: it plants a link where walq's log goes (SQLite opens its
    file through its own library, with no door of ours to check)."""
    data = tmp_path / "data"
    (data / "walq").mkdir(parents=True, mode=0o700)
    data.chmod(0o700)
    target = tmp_path / "elsewhere.log"
    target.write_bytes(b"")
    (data / "walq" / "walq.log").symlink_to(target)
    _refused(("--store", "walq", "--data", str(data)), "walq.log")
    assert target.read_bytes() == b""


def _refused(args: tuple[str, ...], reason: str) -> None:
    server = spawn_server(*args)
    assert server.proc is not None
    code = server.proc.wait(timeout=30)
    server.stop()
    assert code == 1, server.output
    assert reason in server.output
    assert "Traceback" not in server.output


@pytest.mark.slow
@pytest.mark.parametrize("store", DURABLE)
def test_an_idempotency_key_survives_kill9(tmp_path: Path, store: str) -> None:
    args = ("--store", store, "--data", str(tmp_path))
    body = {"kind": "sleep", "args": {"work_ms": 1}, "delay_ms": 60_000}
    server = spawn_server(*args)
    try:
        server.wait_ready()
        first = httpx.post(server.url + "/jobs", json=body, headers={"Idempotency-Key": "pay-42"})
        assert first.status_code == 201
    finally:
        server.stop()  # SIGKILL right after the acknowledgement
    again = spawn_server(*args)
    try:
        again.wait_ready()
        with httpx.Client(base_url=again.url, timeout=10) as c:
            replay = c.post("/jobs", json=body, headers={"Idempotency-Key": "pay-42"})
            assert (replay.status_code, replay.json()["id"]) == (200, first.json()["id"])
            changed = c.post(
                "/jobs", json={**body, "priority": 1}, headers={"Idempotency-Key": "pay-42"}
            )
            assert changed.status_code == 409
            assert len(c.get("/jobs").json()["jobs"]) == 1
    finally:
        again.stop()


@pytest.mark.slow  # a real sqlq serve
def test_repair_refuses_while_a_server_holds_the_directory(tmp_path: Path) -> None:
    """walq only, by nature: ``sqlq repair`` cuts walq's log (no other engine has one)."""
    data = tmp_path / "data"
    server = spawn_server("--store", "walq", "--data", str(data))
    try:
        server.wait_ready()
        submitted = httpx.post(server.url + "/jobs", json={"kind": "sleep"})
        assert submitted.status_code == 201
        # Once the job is finished the server writes nothing more: the log must then stay
        # as it is while repair looks at it (a repair that cut it would change it).
        done = httpx.get(f"{server.url}/jobs/{submitted.json()['id']}?wait=30", timeout=40)
        assert done.json()["state"] == "completed"
        log = (data / "walq" / "walq.log").read_bytes()
        r = CliRunner().invoke(main, ["repair", "--data", str(data)])
        assert r.exit_code == 1, r.output
        assert "walq.lock is held by another process" in r.output
        assert "stop the server" in r.output
        assert "Traceback" not in r.output
        assert (data / "walq" / "walq.log").read_bytes() == log  # untouched
        assert not list((data / "walq").glob("walq.log.broken-*"))
    finally:
        server.stop()
    r = CliRunner().invoke(main, ["repair", "--data", str(data)])
    assert r.exit_code == 0, r.output  # the server is gone: the lock is free
    assert "no damage found" in r.output
