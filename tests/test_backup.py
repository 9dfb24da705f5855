"""``sqlq backup``: a copy of a running store that a server restores.

Each backup is taken while a real ``sqlq serve`` keeps acknowledging submissions (and,
on walq, compacting every 50 ms); a second server started on the copy must list every
job acknowledged before the backup began. walq's copy is also taken with a compaction
forced between the log's open and its read (the case its docstring argues), and from a
log that ends in a torn record.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sqlq.bench.client.server import ServerProcess
from sqlq.cli import main
from sqlq.client import Client
from tests.helpers import spawn_server

pytestmark = pytest.mark.slow  # real servers

FAST_COMPACTION = ("--compact-floor-mb", "0.01", "--compact-ratio", "1.01",
                   "--compact-every", "0.05")  # fmt: skip


class Submitter:
    """Submits no-op jobs one after another on its own thread until stopped; ``acked``
    holds each job's id once the server acknowledged it (201: durable)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.acked: list[str] = []
        self.more = threading.Condition()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            with Client(self.url) as client:
                while not self.stopped.is_set():
                    job = client.submit("sleep", {"work_ms": 0})
                    with self.more:
                        self.acked.append(job.id)
                        self.more.notify_all()
        except BaseException as exc:  # (the test reads it; a thread's error is lost)
            self.error = exc
            with self.more:
                self.more.notify_all()

    def wait_for(self, count: int, within: float = 60.0) -> None:
        """Until ``count`` jobs are acknowledged in all."""
        with self.more:
            ok = self.more.wait_for(lambda: len(self.acked) >= count or self.error, within)
        assert self.error is None, self.error
        assert ok, f"fewer than {count} acknowledged"

    def so_far(self) -> set[str]:
        with self.more:
            return set(self.acked)

    def __enter__(self) -> Submitter:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stopped.set()
        self.thread.join(30)


@pytest.fixture
def running(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    store: str = request.param
    flags = FAST_COMPACTION if store == "walq" else ()
    srv = spawn_server("--store", store, "--data", str(tmp_path / "data"), "--workers", "2",
                       "--log-level", "warning", *flags)  # fmt: skip
    srv.store = store
    try:
        srv.wait_ready(60)
        yield srv
    finally:
        srv.stop()


def _restored_ids(store: str, data: Path) -> set[str]:
    """Every job a server started on ``data`` lists (its recovery accepted the files)."""
    srv = spawn_server("--store", store, "--data", str(data), "--workers", "0",
                       "--log-level", "warning")  # fmt: skip
    try:
        srv.wait_ready(60)
        with Client(srv.url) as client:
            return {j.id for j in client.jobs()}
    finally:
        srv.stop()


def _private(out: Path) -> None:
    """Every directory of the backup 0700, every file 0600 (and nothing else)."""
    for path in [out, *out.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))


@pytest.mark.parametrize("running", ["walq", "sqlite"], indirect=True)
def test_a_backup_taken_under_load_restores_every_acknowledged_job(
    running: ServerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "backup"
    with Submitter(running.url) as load:
        load.wait_for(300)
        before = load.so_far()
        r = CliRunner().invoke(main, ["backup", "--store", running.store,
                                      "--data", str(tmp_path / "data"), str(out)])  # fmt: skip
        assert r.exit_code == 0, r.output
        assert r.output.startswith("backed up ")
        load.wait_for(len(before) + 50)  # the server went on acknowledging after it
    assert load.error is None
    _private(out)
    restored = _restored_ids(running.store, out)
    assert before <= restored
    assert restored <= load.so_far()  # nothing made up


class GatedFiles:
    """walq's ``FileOps`` whose ``read`` of the log opens it, then waits (before reading a
    byte) until ``gate`` returns: a compaction and more appends between the open and the
    read, as a slow copy of a big log would see them."""

    def __init__(self, gate: object) -> None:
        from sqlq.walq.files import OS_FILES

        self.os = OS_FILES
        self.gate = gate

    def __getattr__(self, name: str) -> object:
        return getattr(self.os, name)

    def read(self, path: str) -> bytes:
        if not path.endswith("walq.log"):
            return self.os.read(path)
        from sqlq.common.engine.datadir import open_private

        with open(open_private(path, os.O_RDONLY), "rb") as f:
            self.gate()  # type: ignore[operator]
            return f.read()


@pytest.mark.parametrize("running", ["walq"], indirect=True)
def test_walq_copies_a_log_that_is_compacted_while_it_is_read(
    running: ServerProcess, tmp_path: Path
) -> None:
    from sqlq.walq.backup import copy_store

    def compactions() -> int:
        with Client(running.url) as client:
            return int(client.stats()["store"]["compactions"])

    out = tmp_path / "backup" / "walq"
    out.mkdir(parents=True, mode=0o700)
    os.chmod(out.parent, 0o700)
    with Submitter(running.url) as load:
        load.wait_for(200)
        before = load.so_far()
        seen: list[int] = []

        def gate() -> None:  # a compaction renamed a new log over the one held open
            first = compactions()
            load.wait_for(len(load.so_far()) + 50)
            while compactions() < first + 2:  # (one may have been mid-way at `first`)
                load.wait_for(len(load.so_far()) + 1)
            seen.append(compactions() - first)

        copied = copy_store(str(tmp_path / "data" / "walq"), str(out),
                            GatedFiles(gate))  # type: ignore[arg-type]  # fmt: skip
        assert len(seen) == 1
        assert seen[0] >= 2
        assert copied.records > 0
    restored = _restored_ids("walq", tmp_path / "backup")
    assert before <= restored


def test_a_torn_tail_is_left_out_of_the_copy_and_recovery_cuts_it_anyway(
    tmp_path: Path,
) -> None:
    """A log read while a record was half written ends in a torn record: the copy keeps
    the valid prefix; and a copy that kept the torn bytes opens too (recovery cuts them)."""
    import asyncio

    from sqlq.common.models import Job
    from sqlq.walq import log
    from sqlq.walq.backup import copy_store
    from sqlq.walq.store import WalStore

    async def fill() -> list[str]:
        s = WalStore(tmp_path / "data" / "walq")
        await s.open()
        jobs = [Job.new(kind="sleep", args={"n": i}, now=1.7e9 + i) for i in range(5)]
        for job in jobs:
            await s.commit([job])
        await s.close()
        return [j.id for j in jobs]

    ids = asyncio.run(fill())
    src = tmp_path / "data" / "walq" / "walq.log"
    whole = src.read_bytes()
    torn = log.encode({"seq": 999, "ops": []})[:-7]
    src.write_bytes(whole + torn)
    (tmp_path / "out" / "walq").mkdir(parents=True)
    copied = copy_store(str(src.parent), str(tmp_path / "out" / "walq"))
    assert (tmp_path / "out" / "walq" / "walq.log").read_bytes() == whole
    assert copied.log_bytes == len(whole)

    async def reopen(directory: Path) -> tuple[list[str], list[str]]:
        s = WalStore(directory)
        recovery = await s.open()
        try:
            return sorted(j.id for j in recovery.jobs), list(recovery.notes)
        finally:
            await s.close()

    listed, notes = asyncio.run(reopen(tmp_path / "out" / "walq"))
    assert (listed, notes) == (sorted(ids), [])
    raw = tmp_path / "raw" / "walq"
    raw.mkdir(parents=True)
    (raw / "walq.log").write_bytes(whole + torn)  # a copy made without the cut
    listed, notes = asyncio.run(reopen(raw))
    assert listed == sorted(ids)
    assert any("torn" in n for n in notes), notes


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--store", "walq", "--data", "{data}", "{full}"), "{full} exists and is not an empty"),
        (("--store", "walq", "--data", "{data}", "{file}"), "'{file}' is a file"),
        (("--store", "sqlite", "--data", "{data}", "{out}"), "no sqlite store in {data}"),
        (("--store", "postgres", "--data", "{data}", "{out}"), "--store"),
        (("--store", "walq", "--data", "{out}/nowhere", "{out}"), "--data"),
    ],
)
def test_mistakes_are_one_line_messages_naming_what(
    tmp_path: Path, args: tuple[str, ...], says: str
) -> None:
    names = {"data": tmp_path / "data", "full": tmp_path / "full", "file": tmp_path / "file",
             "out": tmp_path / "out"}  # fmt: skip
    (tmp_path / "data" / "walq").mkdir(parents=True)
    (tmp_path / "data" / "walq" / "walq.log").write_bytes(b"")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "old").write_text("an older backup")
    (tmp_path / "file").write_text("x")
    r = CliRunner().invoke(main, ["backup", *(a.format(**names) for a in args)])
    assert r.exit_code == 2, r.output
    assert says.format(**names) in " ".join(r.output.split())
    assert "Traceback" not in r.output
    assert not (tmp_path / "out").exists()  # a failed backup leaves nothing behind
    assert (tmp_path / "full" / "old").read_text() == "an older backup"
