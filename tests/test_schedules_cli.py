"""``sqlq schedules ...`` against a real server (and ``Client``, which it drives): the
table, --json, and errors as one-line messages naming what was wrong, never a traceback."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from sqlq.bench.client.server import ServerProcess
from sqlq.client import Client
from tests.helpers import run_cli, spawn_server


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    srv = spawn_server("--store", "memory", "--workers", "1")
    srv.wait_ready()
    yield srv
    srv.stop()


@pytest.fixture
def q(server: ServerProcess) -> Iterator[Client]:
    with Client(server.url) as client:
        yield client
        for view in client.schedules():
            client.delete_schedule(view.name)


run = run_cli  # (one home: tests/helpers.py)


def test_list_is_a_table_and_json(server: ServerProcess, q: Client) -> None:
    assert run(server, "schedules", "list") == (0, "no schedules\n")
    q.put_schedule("hourly", "sleep", every_s=3600, queue="reports")
    q.put_schedule("nightly", "sleep", cron="30 2 * * *", tz="Europe/Berlin", paused=True)
    code, out = run(server, "schedules", "list")
    assert code == 0, out
    header, first, second = out.splitlines()
    assert header.split() == ["name", "when", "tz", "kind", "next", "last_tick", "last_job",
                              "paused"]  # fmt: skip
    assert first.split()[:5] == ["hourly", "every", "3600", "s", "UTC"]
    assert first.split()[-1] == "no"
    assert second.startswith("nightly")
    assert "30 2 * * *" in second
    assert "Europe/Berlin" in second
    assert second.split()[-1] == "yes"
    code, out = run(server, "schedules", "list", "--json")
    assert code == 0, out
    views = json.loads(out)
    assert [v["name"] for v in views] == ["hourly", "nightly"]
    assert views[0]["spec"]["queue"] == "reports"
    assert views[1]["next_at"] is None


def test_get_pause_resume_trigger_rm(server: ServerProcess, q: Client) -> None:
    q.put_schedule("hourly", "sleep", {"work_ms": 0}, every_s=3600)
    code, out = run(server, "schedules", "get", "hourly")
    assert code == 0, out
    assert "every 3600 s" in out
    assert "catch_up  latest" in out
    code, out = run(server, "schedules", "pause", "hourly", "--json")
    assert (code, json.loads(out)["spec"]["paused"]) == (0, True)
    assert q.schedule("hourly").spec.paused
    code, out = run(server, "schedules", "resume", "hourly")
    assert code == 0, out
    assert "paused  no" in out, out
    code, out = run(server, "schedules", "trigger", "hourly", "--json")
    assert code == 0, out
    job = json.loads(out)
    assert (job["schedule"], job["tick"], job["kind"]) == ("hourly", None, "sleep")
    code, out = run(server, "jobs", "list", "--schedule", "hourly", "--json")
    assert [j["id"] for j in json.loads(out)] == [job["id"]]
    code, out = run(server, "schedules", "trigger", "hourly")
    assert code == 0, out
    assert "schedule  hourly" in out, out
    assert run(server, "schedules", "rm", "hourly") == (0, "removed schedule hourly\n")
    assert q.schedules() == []


def test_errors_are_messages_naming_what(server: ServerProcess) -> None:
    for command in ("get", "pause", "resume", "trigger", "rm"):
        code, out = run(server, "schedules", command, "missing")
        assert code == 1, out
        assert "schedule missing not found" in out
        code, out = run(server, "schedules", command, "a:b")
        assert code == 2, out
        assert "Invalid value for 'NAME'" in out
    code, out = run(server, "schedules", "get")
    assert code == 2
    assert "Missing argument 'NAME'" in out
    code, out = run(server, "schedules", "list", "--url", "http://127.0.0.1:9")
    assert code == 1, out
    assert "ConnectError" in out, out
    code, out = run(server, "jobs", "list", "--schedule", "a:b")
    assert code == 1, out
    assert "(schedule)" in out, out


def test_the_next_run_is_in_the_schedules_own_zone_and_says_so(
    server: ServerProcess, q: Client
) -> None:
    """#34: a next run in unlabelled UTC beside a Europe/Berlin column read an hour off."""
    q.put_schedule("nightly", "sleep", cron="30 2 * * *", tz="Europe/Berlin")
    q.put_schedule("hourly", "sleep", every_s=3600)
    code, out = run(server, "schedules", "get", "nightly")
    assert code == 0, out
    shown = {ln.split()[0]: ln.split()[1:] for ln in out.splitlines() if ln.strip()}
    next_at = q.schedule("nightly").next_at
    assert next_at is not None
    when = datetime.fromisoformat(shown["next"][0])
    assert when.timestamp() == next_at  # the same instant, written with its offset
    assert (
        when.utcoffset() == datetime.fromtimestamp(next_at, ZoneInfo("Europe/Berlin")).utcoffset()
    )
    assert (when.hour, when.minute) == (2, 30)  # as the cron says, in Berlin
    assert shown["last_tick"] == ["-"]
    code, out = run(server, "schedules", "list")
    hourly = next(ln for ln in out.splitlines() if ln.startswith("hourly"))
    assert re.search(r" \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3})?Z ", hourly), hourly
