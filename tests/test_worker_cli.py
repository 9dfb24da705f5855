"""``sqlq worker``'s flags: each refusal names its flag and never shows a traceback; the
token is never printed; an idle worker stops at SIGTERM with status 0, and one the
server is away from backs off rather than failing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from sqlq.cli import main
from tests.helpers import ROOT


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--concurrency", "0"], "--concurrency"),
        (["--processes", "3", "--concurrency", "2"], "--concurrency"),
        (["--lease", "1"], "--lease"),
        (["--wait", "31"], "--wait"),
        (["--name", "has space"], "--name"),
        (["--url", "ftp://x"], "--url"),
        (["--queue", "bad queue"], "--queue"),
        (["--import", "sqlq_no_such_module_here"], "--import"),
        (["--kind", "nope"], "--kind"),
        (["--token", " "], "--token"),
        (["--token", "s3cret-with-a-newline\n"], "--token"),
        (["--token", "s3cret-t\u00f6ken-not-ascii"], "--token"),  # httpx would quote it
        (["--token", "s3cret-with-a\ttab"], "--token"),
    ],
)
def test_a_bad_flag_is_named_without_a_traceback(args: list[str], flag: str) -> None:
    result = CliRunner().invoke(main, ["worker", "--url", "http://127.0.0.1:9", *args])
    assert result.exit_code == 2, result.output
    assert flag in result.output
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    assert "s3cret" not in result.output  # a token is never printed, even a bad one


def test_an_import_that_raises_is_its_message(tmp_path: Path) -> None:
    (tmp_path / "broken_tasks.py").write_text("raise RuntimeError('no config file')\n")
    sys.path.insert(0, str(tmp_path))
    try:
        result = CliRunner().invoke(main, ["worker", "--import", "broken_tasks"])
    finally:
        sys.path.remove(str(tmp_path))
    assert result.exit_code == 2
    assert "--import" in result.output
    assert "broken_tasks: RuntimeError: no config file" in result.output


@pytest.mark.slow
def test_unreachable_it_backs_off_and_sigterm_stops_it_with_0_never_printing_the_token(
    tmp_path: Path,
) -> None:
    secret = "s3cret-token-that-must-never-show-up"
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sqlq", "worker", "--url", "http://127.0.0.1:9",
             "--log-level", "debug", "--wait", "1"],
            stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "SQLQ_TOKEN": secret},
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 30
            while log.read_text().count("could not claim") < 2:  # backing off, alive
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text()
    assert "stopping" in text
    assert secret not in text
    assert "Traceback" not in text
