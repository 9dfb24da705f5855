"""I/O errors: nothing is acknowledged that is not durable, and restart recovers all.

Injected through walq's FileOps (ENOSPC and EIO on write, a failing fsync, a
failing rename during compaction; once and persistently), and, for both
engines, by really filling a small filesystem.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from sqlq.common.engine.groupcommit import Pending
from sqlq.common.errors import StoreFailedError
from sqlq.common.specs import JobSpec
from sqlq.engines.registry import DURABLE, ENGINES, make_store
from sqlq.http.app import create_app
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.service import Service
from sqlq.walq.store import WalStore
from tests.helpers import spawn_server, unavailable
from tests.walq_helpers import FaultyFiles


@pytest.mark.parametrize("persistent", [False, True], ids=["once", "persistent"])
@pytest.mark.parametrize(
    ("op", "where", "err"),
    [
        ("write", "walq.log", errno.ENOSPC),
        ("write", "walq.log", errno.EIO),
        ("fdatasync", "walq.log", errno.EIO),
        ("replace", "walq.log.tmp", errno.EIO),
    ],
)
async def test_injected_io_error_is_a_503_and_restart_keeps_every_ack(
    tmp_path: Path, op: str, where: str, err: int, persistent: bool
) -> None:
    # nth: past open (which writes the header, and renames a fresh log into place)
    fs = FaultyFiles(op, where=where, nth=4 if op != "replace" else 2, err=err,
                     persistent=persistent)  # fmt: skip
    rt = Service(WalStore(tmp_path, fs=fs), RuntimeConfig(workers=2, compact_every_s=0))
    await rt.start()
    acked: list[str] = []
    statuses: list[int] = []
    app = create_app(rt, start_runtime=False)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as c:
        for i in range(12):
            if op == "replace" and i == 2:
                # The rename of a compaction fails: past that point nobody can tell
                # which file the directory names, so the store fails, loudly.
                with pytest.raises(StoreFailedError, match="compaction switch failed"):
                    await rt.store.compact()
            r = await c.post("/jobs", json={"kind": "sleep", "delay_ms": 60_000})
            statuses.append(r.status_code)
            if r.status_code == 201:
                acked.append(r.json()["id"])
            else:
                assert r.status_code == 503, r.text
                assert r.json()["error"] == "unavailable"
        assert 503 in statuses
        assert statuses.index(503) > 0
        # after the first failure, nothing more is acknowledged, even if the disk recovered
        assert all(s == 503 for s in statuses[statuses.index(503) :])
        r = await c.get("/readyz")
        assert r.status_code == 503
        assert "store failed" in r.json()["reason"]
    await rt.stop(0)
    again = Service(WalStore(tmp_path), RuntimeConfig(workers=2, compact_every_s=0))
    await again.start()
    try:
        for job_id in acked:
            assert await again.get(job_id) is not None, f"acknowledged {job_id} lost"
    finally:
        await again.stop(0)


@pytest.fixture
def tiny_fs(tmp_path: Path) -> object:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mnt)], capture_output=True
    )
    if r.returncode != 0:
        unavailable(f"cannot mount a small tmpfs here (needs root): {r.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.slow
@pytest.mark.parametrize("store", DURABLE)
def test_a_full_filesystem_is_a_503_and_space_back_recovers_every_ack(
    tiny_fs: Path, store: str
) -> None:
    server = spawn_server("--store", store, "--data", str(tiny_fs), "--workers", "1")
    acked: list[str] = []
    try:
        server.wait_ready()
        batch = {"jobs": [{"kind": "sleep", "delay_ms": 3_600_000}] * 500}
        with httpx.Client(base_url=server.url, timeout=30) as c:
            deadline = time.monotonic() + 60
            status = 201
            while status == 201 and time.monotonic() < deadline:
                r = c.post("/jobs/batch", json=batch)
                status = r.status_code
                if status == 201:
                    acked.extend(r.json()["ids"])
            assert status == 503, f"never filled the disk ({len(acked)} jobs)"
            assert r.json()["error"] == "unavailable"
            assert c.get("/readyz").status_code == 503
    finally:
        server.stop()
    assert acked
    subprocess.run(["mount", "-o", "remount,size=64m", str(tiny_fs)], check=True)  # space back
    again = spawn_server("--store", store, "--data", str(tiny_fs), "--workers", "1")
    try:
        again.wait_ready()
        with httpx.Client(base_url=again.url, timeout=30) as c:
            stats = c.get("/stats").json()
            assert stats["recovery"]["live_jobs"] >= len(acked)
            for job_id in acked[:: max(1, len(acked) // 200)] + acked[-5:]:
                assert c.get(f"/jobs/{job_id}").status_code == 200, f"acknowledged {job_id} lost"
    finally:
        again.stop()
    assert os.path.ismount(tiny_fs)


async def _client_views(rt: Service) -> list[str]:
    """What a client sees of the store: /stats, /readyz and the dashboard's overview."""
    app = create_app(rt, start_runtime=False)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as c:
        pages = [await c.get(p) for p in ("/stats", "/readyz", "/ui/")]
    assert pages[0].status_code == 200
    assert pages[2].status_code == 200
    return [p.text for p in pages]


def _no_absolute_path(text: str, tmp_path: Path) -> None:
    assert str(tmp_path) not in text
    assert "/tmp" not in text


async def test_a_torn_tail_is_reported_without_its_directory(tmp_path: Path) -> None:
    store = WalStore(tmp_path)
    await store.open()
    await store.close()
    with (tmp_path / "walq.log").open("ab") as f:
        f.write(b'{"seq":9,"ops":[{"put"')  # a torn last record
    rt = Service(WalStore(tmp_path), RuntimeConfig(workers=1, compact_every_s=0))
    await rt.start()
    try:
        stats, _, overview = await _client_views(rt)
        assert "walq.log.broken-1" in stats  # the file is named, by its base name
        assert "walq.log.broken-1" in overview
        for text in (stats, overview):
            _no_absolute_path(text, tmp_path)
    finally:
        await rt.stop(0)


async def test_a_failed_store_is_reported_without_its_directory(tmp_path: Path) -> None:
    fs = FaultyFiles("fdatasync", where="walq.log", nth=1)
    rt = Service(WalStore(tmp_path, fs=fs), RuntimeConfig(workers=1, compact_every_s=0))
    await rt.start()
    try:
        with pytest.raises(StoreFailedError):
            await rt.submit([JobSpec(kind="sleep")])
        stats, ready, overview = await _client_views(rt)
        assert "injected failure" in stats
        assert "injected failure" in overview
        for text in (stats, ready, overview):
            _no_absolute_path(text, tmp_path)
    finally:
        await rt.stop(0)


@pytest.mark.parametrize("engine", DURABLE)
async def test_no_write_gets_past_a_failed_store(
    tmp_path: Path, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pause (or a compaction) after a store failure is refused like a commit, and
    nothing of it is durable."""
    store = make_store(engine, tmp_path)

    async def failing_flush(batch: list[Pending]) -> list[BaseException | None]:
        raise OSError(errno.EIO, "injected I/O failure")

    monkeypatch.setattr(store, "_flush", failing_flush)
    rt = Service(store, RuntimeConfig(workers=1, compact_every_s=0))
    await rt.start()
    app = create_app(rt, start_runtime=False)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as c:
            assert (await c.post("/jobs", json={"kind": "sleep"})).status_code == 503
            r = await c.post("/queues/default/pause")
            assert r.status_code == 503, r.text
            assert r.json()["error"] == "unavailable"
        with pytest.raises(StoreFailedError):
            await store.compact()
    finally:
        await rt.stop(0)
    again = make_store(engine, tmp_path)
    recovery = await again.open()
    await again.close()
    assert recovery.paused_queues == []


@pytest.mark.parametrize("engine", DURABLE)
async def test_loose_modes_are_tightened_when_the_engine_opens(
    tmp_path: Path, engine: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Files left 0644 and directories 0755 (by an older sqlq, a restore, a umask) are the
    engine's own: it makes them 0600 and 0700 as it opens them, and says so in the log."""
    data = tmp_path / "data"
    store = make_store(engine, data)
    await store.open()
    await store.set_queue_paused("mail", True)  # walq keeps pauses in a file of their own
    await store.close()
    own = data / ENGINES[engine].subdir  # type: ignore[operator]
    if engine == "sqlite":
        for suffix in ("-wal", "-shm"):  # SQLite removed them at close; as a crash leaves them
            (own / f"sqlq.db{suffix}").touch()
    files = [p for p in own.iterdir() if p.is_file()]
    assert len(files) >= 3
    for p in files:
        p.chmod(0o644)
    for d in (data, own):
        d.chmod(0o755)
    caplog.set_level(logging.WARNING)
    again = make_store(engine, data)
    recovery = await again.open()
    try:
        assert recovery.paused_queues == ["mail"]
        for d in (data, own):
            assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
        for p in files:
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p.name
            assert any(p.name in r.getMessage() and "0600" in r.getMessage()
                       for r in caplog.records), p.name  # fmt: skip
    finally:
        await again.close()
