"""``sqlq jobs ...`` and ``sqlq submit`` against a real server: tables, --json, errors."""

from __future__ import annotations

import importlib.metadata
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner

from sqlq.bench.client.server import ServerProcess
from sqlq.cli import main
from sqlq.client import Job
from sqlq.ops import show_job
from tests.helpers import spawn_server

OPSTASKS = """
import time

from sqlq import task


@task()
def fails(args):
    raise ValueError('nope')


@task()
def waits(args, ctx):
    # Until it is asked to stop (or a minute passes): a running job to cancel.
    deadline = time.monotonic() + 60
    while not ctx.cancelled and time.monotonic() < deadline:
        ctx.beat()
        time.sleep(0.01)
    ctx.raise_if_cancelled()
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    mods = tmp_path_factory.mktemp("mods")
    (mods / "opstasks.py").write_text(OPSTASKS)
    srv = spawn_server(
        "--store", "memory", "--import", "opstasks", "--max-attempts", "1",
        env={"PYTHONPATH": str(mods)},
    )  # fmt: skip
    srv.wait_ready()
    yield srv
    srv.stop()


def run(server: ServerProcess, *args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, list(args), env={"SQLQ_URL": server.url})
    return r.exit_code, r.output


def dead_job(server: ServerProcess) -> str:
    code, out = run(server, "submit", "fails", "--json")
    assert code == 0, out
    job_id: str = json.loads(out)["id"]
    deadline = time.monotonic() + 20
    while json.loads(run(server, "jobs", "get", job_id, "--json")[1])["state"] != "dead":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return job_id


def test_list_the_dead_and_retry_them(server: ServerProcess) -> None:
    job_id = dead_job(server)
    code, out = run(server, "jobs", "list", "--state", "dead")
    assert code == 0, out
    header, row = out.splitlines()[:2]
    assert header.split()[:4] == ["id", "kind", "queue", "state"]
    assert row.split()[:4] == [job_id, "fails", "default", "dead"]
    assert "ValueError: nope" in row
    code, out = run(server, "jobs", "retry", job_id, "--json")
    assert (code, json.loads(out)["state"]) == (0, "scheduled")
    another = dead_job(server)
    deadline = time.monotonic() + 20
    while len(json.loads(run(server, "jobs", "list", "--state", "dead", "--json")[1])) < 2:
        assert time.monotonic() < deadline  # the retried one dies again
        time.sleep(0.02)
    code, out = run(server, "jobs", "retry", "--all-dead", "--json")
    assert (code, json.loads(out)) == (0, {"retried": 2})
    for retried, before in ((job_id, 2), (another, 1)):  # each went back with its history
        code, out = run(server, "jobs", "get", retried, "--json")
        shown = json.loads(out)  # attempts_total: every attempt, this budget's (may run) too
        assert (code, shown["attempts_total"] - shown["attempts"]) == (0, before)


def test_submit_get_and_cancel(server: ServerProcess) -> None:
    code, out = run(server, "submit", "sleep", "--args", '{"work_ms": 1}', "--delay-ms", "60000")
    assert code == 0, out
    job_id = next(ln.split()[-1] for ln in out.splitlines() if ln.strip().startswith("id"))
    code, out = run(server, "jobs", "get", job_id)
    assert code == 0
    assert "scheduled" in out
    code, out = run(server, "jobs", "cancel", job_id, "--json")
    assert (code, json.loads(out)["state"]) == (0, "cancelled")


def _state(server: ServerProcess, job_id: str) -> str:
    code, out = run(server, "jobs", "get", job_id, "--json")
    assert code == 0, out
    state: str = json.loads(out)["state"]
    return state


def _until(server: ServerProcess, job_id: str, state: str) -> None:
    deadline = time.monotonic() + 20
    while _state(server, job_id) != state:
        assert time.monotonic() < deadline, f"{job_id} never {state}"
        time.sleep(0.02)


def _submit(server: ServerProcess, *args: str) -> str:
    code, out = run(server, "submit", *args, "--json")
    assert code == 0, out
    job_id: str = json.loads(out)["id"]
    return job_id


def test_cancel_says_what_happened_to_a_waiting_and_a_running_job(server: ServerProcess) -> None:
    waiting = _submit(server, "sleep", "--delay-ms", "60000")
    code, out = run(server, "jobs", "cancel", waiting)
    assert (code, out) == (0, f"job {waiting} is cancelled\n")
    running = _submit(server, "waits")
    _until(server, running, "running")
    code, out = run(server, "jobs", "cancel", running)
    assert code == 0, out
    assert out.startswith(f"cancel requested for job {running}: it is running")
    _until(server, running, "cancelled")
    code, out = run(server, "jobs", "cancel", running)  # finished now: a message, exit 1
    assert code == 1
    assert "cancel" in out
    assert "Traceback" not in out
    forced = _submit(server, "waits")
    _until(server, forced, "running")
    code, out = run(server, "jobs", "cancel", forced, "--force", "--json")
    assert code == 0, out
    shown = json.loads(out)
    assert (shown["state"], shown["cancel_requested"]) == ("running", True)
    _until(server, forced, "cancelled")


def test_bulk_cancel_counts_the_cancelled_and_the_asked(server: ServerProcess) -> None:
    waiting = [_submit(server, "sleep", "--delay-ms", "60000", "--queue", "bulk")
               for _ in range(2)]  # fmt: skip
    running = _submit(server, "waits", "--queue", "bulk")
    _until(server, running, "running")
    code, out = run(server, "jobs", "cancel", "--queue", "elsewhere", "--json")
    assert (code, json.loads(out)) == (0, {"cancelled": 0, "requested": 0})
    code, out = run(server, "jobs", "cancel", "--queue", "bulk", "--state", "scheduled")
    assert (code, out) == (0, "cancelled 2 scheduled jobs; asked 0 running jobs to stop\n")
    code, out = run(server, "jobs", "cancel", "--queue", "bulk", "--kind", "waits", "--json")
    assert (code, json.loads(out)) == (0, {"cancelled": 0, "requested": 1})
    _until(server, running, "cancelled")
    assert [_state(server, j) for j in waiting] == ["cancelled", "cancelled"]


def test_get_shows_the_errors_snoozes_and_progress(server: ServerProcess) -> None:
    job_id = dead_job(server)
    code, out = run(server, "jobs", "get", job_id)
    assert code == 0, out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip()}
    assert "request_hash" not in lines
    assert lines["errors"].split()[1:] == ["1", "(newest", "last)"]
    assert lines["snoozes"].split()[1] == "0"
    assert lines["progress"].split()[1] == "null"
    assert lines["attempts_total"].split()[1] == "1"
    assert "attempt 1 at " in out
    assert "ValueError: nope" in out.split("attempt 1 at ", 1)[1]


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (("submit", "sleep", "--args", "{nope"), 2, "--args"),
        (("submit", "sleep", "--args", "[1]"), 2, "--args"),
        (("submit", "sleep", "--args", '{"work_ms": -1}'), 1, "args.work_ms"),
        (("submit", "no_such_kind"), 1, "unknown kind"),
        (("jobs", "get", "ffff"), 1, "no job with id"),
        (("jobs", "retry"), 2, "--all-dead"),
        (("jobs", "list", "--state", "bogus"), 2, "--state"),
        (("jobs", "cancel"), 2, "JOB_ID"),
        (("jobs", "cancel", "f" * 32, "--state", "running"), 2, "not both"),
        (("jobs", "cancel", "--state", "bogus"), 2, "--state"),
        (("jobs", "cancel", "--state", "dead"), 2, "--state"),
        (("jobs", "cancel", "--queue", "no spaces"), 2, "--queue"),
        (("jobs", "cancel", "--kind", ""), 2, "--kind"),
        (("jobs", "cancel", "--all", "--force"), 2, "--force"),
        (("jobs", "cancel", "f" * 32), 1, "no job with id"),
    ],
)
def test_mistakes_are_one_line_messages(
    server: ServerProcess, args: tuple[str, ...], code: int, says: str
) -> None:
    got, out = run(server, *args)
    assert got == code, out
    assert says in out
    assert "Traceback" not in out


@pytest.mark.parametrize(
    "token",
    # h11 quotes a header value it refuses, and httpx names a non-ASCII one's character
    [
        "s3cret-token\nX-Evil: 1",
        "s3cret-token ",
        "s3cret\ttoken",
        "s3cret-t\u00f6ken",
        "s3cret\x00",
    ],
)
def test_a_token_no_header_can_carry_is_a_message_that_never_shows_it(token: str) -> None:
    r = CliRunner().invoke(main, ["jobs", "list", "--url", "http://127.0.0.1:9",
                                  "--token", token])  # fmt: skip
    assert r.exit_code == 2
    assert "--token" in r.output
    assert "line break, whitespace" in r.output
    assert "s3cret" not in r.output
    assert "Traceback" not in r.output


def test_an_unreachable_server_is_a_message(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["jobs", "list", "--url", "http://127.0.0.1:9"])
    assert r.exit_code == 1
    assert "127.0.0.1:9" in r.output
    assert "Traceback" not in r.output


def test_the_version_has_one_source() -> None:
    """pyproject reads ``sqlq.__version__``; ``sqlq --version`` and the API document say it."""
    import sqlq
    from sqlq.http import app

    r = CliRunner().invoke(main, ["--version"])
    assert (r.exit_code, r.output) == (0, f"sqlq {sqlq.__version__}\n")
    assert importlib.metadata.version("sqlq") == sqlq.__version__ == app.VERSION


# -- #34, item 8: ARGS, --wait, newest first, ISO 8601, tracebacks --------------------------

ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3})?Z")


def test_submit_takes_its_args_as_an_argument_and_waits(server: ServerProcess) -> None:
    code, out = run(server, "submit", "sleep", '{"work_ms": 1}', "--wait", "--json")
    assert code == 0, out
    job = json.loads(out)
    assert (job["state"], job["args"]["work_ms"]) == ("completed", 1)
    code, out = run(server, "jobs", "get", job["id"], "--wait")  # finished already: at once
    assert code == 0, out
    fields = {ln.split()[0]: ln.split()[1] for ln in out.splitlines() if ln.strip()}
    for name in ("created_at", "updated_at", "ready_at", "started_at"):
        assert ISO_UTC.fullmatch(fields[name]), (name, fields[name])
    assert fields["lease_until"] == "null"


def test_wait_exits_nonzero_when_the_job_did_not_complete(server: ServerProcess) -> None:
    code, out = run(server, "submit", "fails", "--wait", "--json")  # --max-attempts 1: dead
    assert code == 3, out
    assert json.loads(out.splitlines()[0])["state"] == "dead"
    assert "ended dead" in out
    code, out = run(server, "submit", "sleep", "--delay-ms", "600000", "--wait", "--timeout",
                    "0.2")  # fmt: skip
    assert code == 124, out
    assert "still scheduled" in out
    later = next(ln.split()[-1] for ln in out.splitlines() if ln.strip().startswith("id"))
    code, out = run(server, "jobs", "get", later, "--wait", "--timeout", "0", "--json")
    assert (code, json.loads(out.splitlines()[0])["state"]) == (124, "scheduled")
    run(server, "jobs", "cancel", later)
    code, out = run(server, "jobs", "get", later, "--wait")
    assert code == 3, out
    assert "ended cancelled" in out


def test_listings_are_newest_first_unless_asked(server: ServerProcess) -> None:
    made = [_submit(server, "sleep", "--delay-ms", "600000", "--queue", "order")
            for _ in range(4)]  # fmt: skip
    code, out = run(server, "jobs", "list", "--queue", "order")
    assert code == 0, out
    rows = out.splitlines()[1:]
    assert [r.split()[0] for r in rows] == made[::-1]
    assert all(ISO_UTC.fullmatch(r.split()[5]) for r in rows), rows
    code, out = run(server, "jobs", "list", "--queue", "order", "--oldest-first", "--json")
    assert [j["id"] for j in json.loads(out)] == made
    code, out = run(server, "jobs", "list", "--queue", "order", "--limit", "2", "--json")
    assert [j["id"] for j in json.loads(out)] == made[:1:-1]
    run(server, "jobs", "cancel", "--queue", "order")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("submit", "sleep", "{nope"), "ARGS: not JSON: Expecting property name"),
        (("submit", "sleep", "[1]"), "ARGS: must be a JSON object"),
        (("submit", "sleep", "{}", "--args", "{}"), "ARGS or as --args, not both"),
        (("submit", "sleep", "--timeout", "3"), "--timeout is for --wait"),
        (("jobs", "get", "f" * 32, "--timeout", "3"), "--timeout is for --wait"),
        (("submit", "sleep", "--wait", "--timeout", "-1"), "--timeout"),
    ],
)
def test_args_and_wait_mistakes_are_one_line_messages(
    server: ServerProcess, args: tuple[str, ...], says: str
) -> None:
    code, out = run(server, *args)
    assert code == 2, out
    assert says in out
    assert "Traceback" not in out


def _failed_view(tracebacks: list[str | None]) -> Job:
    """A dead job's view with one ``errors`` entry per traceback (None: without one)."""
    errors = [{"attempt": n, "error": f"KeyError: 'to' ({n})", "at": 1_780_000_000.0 + n}
              for n in range(1, len(tracebacks) + 1)]  # fmt: skip
    for entry, tb in zip(errors, tracebacks, strict=True):
        if tb is not None:
            entry["traceback"] = tb
    body = {"id": "a" * 32, "kind": "send_email", "args": {}, "ready_at": 0.0,
            "created_at": 1_780_000_000.5, "updated_at": 1_780_000_004.0, "state": "dead",
            "errors": errors}  # fmt: skip
    return msgspec.convert(body, Job)


TB = """Traceback (most recent call last):
  File "/srv/app/tasks.py", line 12, in send_email
    to = args["to"]
         ~~~~^^^^^^
KeyError: 'to'
"""


def test_get_shows_the_newest_traceback_whole_and_sums_up_the_older(
    capsys: pytest.CaptureFixture[str],
) -> None:
    show_job(_failed_view([TB, None, TB.replace("line 12", "line 13")]), as_json=False)
    out = capsys.readouterr().out
    first, second, third = out.split("attempt ")[1:]
    assert "(traceback: 5 lines, ending KeyError: 'to')" in first
    assert "File" not in first
    assert second.strip().endswith("(2)")  # none kept for it: nothing said
    assert '  File "/srv/app/tasks.py", line 13, in send_email' in third
    assert "~~~~^^^^^^" in third
    assert "2026-05-28T20:26:43Z" in third  # its time, ISO 8601 in UTC
    assert "created_at  2026-05-28T20:26:40.500Z" in out
    show_job(_failed_view([None]), as_json=False)  # a server that keeps no traceback
    assert "Traceback" not in capsys.readouterr().out


def test_get_shows_a_failed_jobs_traceback_from_the_server(server: ServerProcess) -> None:
    job_id = dead_job(server)
    code, out = run(server, "jobs", "get", job_id)
    assert code == 0, out
    tail = out.split("attempt 1 at ", 1)[1].splitlines()
    assert tail[1].strip() == "Traceback (most recent call last):"
    assert any(ln.strip().endswith(", in fails") for ln in tail)
    assert tail[-1].strip() == "ValueError: nope"
