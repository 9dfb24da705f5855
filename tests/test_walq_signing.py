"""walq's signing key (``walq.signing``): a 0600 file beside the log, made once and
durably (temporary file, sync, rename, directory sync: through ``FileOps``, so a power
cut at any of those calls leaves no key or the whole one, and a key handed out survives),
read on later opens, never shown. And the other small file beside the log, the paused
queues, whose write a cancelled caller cannot leave behind the set in memory."""

from __future__ import annotations

import asyncio
import logging
import random
import stat
import threading
from pathlib import Path

import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.errors import StoreError
from sqlq.common.models import Job
from sqlq.common.tokens import KEY_BYTES
from sqlq.walq.signing import KEY_NAME
from sqlq.walq.store import WalStore
from tests.helpers import NOW
from tests.powerloss import TAIL_MODES, PowerCut, SimDisk
from tests.walq_helpers import FaultyFiles, NoSyncFiles


async def _key_of(data: Path, **options: object) -> bytes:
    store = WalStore(data, clock=FakeClock(NOW), **options)  # type: ignore[arg-type]
    await store.open()
    try:
        return await store.signing_key()
    finally:
        await store.close()


async def test_the_key_is_a_0600_file_made_once_and_read_after_a_reopen(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    store = WalStore(tmp_path, clock=FakeClock(NOW))
    await store.open()
    try:
        key = await store.signing_key()
        assert await store.signing_key() == key  # the same, without touching the file again
    finally:
        await store.close()
    path = tmp_path / KEY_NAME
    assert len(key) == KEY_BYTES
    assert path.read_bytes() == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not (tmp_path / (KEY_NAME + ".tmp")).exists()
    assert await _key_of(tmp_path) == key
    assert key.hex() not in caplog.text
    assert repr(key) not in caplog.text


async def test_two_first_calls_at_once_get_one_key(tmp_path: Path) -> None:
    store = WalStore(tmp_path, clock=FakeClock(NOW))
    await store.open()
    try:
        keys = await asyncio.gather(*(store.signing_key() for _ in range(4)))
    finally:
        await store.close()
    assert len(set(keys)) == 1
    assert (tmp_path / KEY_NAME).read_bytes() == keys[0]


async def test_a_leftover_temporary_file_is_removed_and_never_the_key(tmp_path: Path) -> None:
    tmp = tmp_path / (KEY_NAME + ".tmp")
    tmp_path.chmod(0o700)
    tmp.write_bytes(b"x" * KEY_BYTES)  # a crash before the rename
    key = await _key_of(tmp_path)
    assert key != b"x" * KEY_BYTES
    assert not tmp.exists()
    tmp.write_bytes(b"half")  # again, once the key is there
    assert await _key_of(tmp_path) == key
    assert not tmp.exists()


async def test_a_key_file_of_the_wrong_length_is_refused_naming_the_file_not_its_bytes(
    tmp_path: Path,
) -> None:
    tmp_path.chmod(0o700)
    (tmp_path / KEY_NAME).write_bytes(b"secret-bytes")
    (tmp_path / KEY_NAME).chmod(0o600)
    with pytest.raises(StoreError) as caught:
        await _key_of(tmp_path)
    assert KEY_NAME in str(caught.value)
    assert "secret" not in str(caught.value)


async def test_the_key_is_written_through_file_ops_in_the_durable_order(tmp_path: Path) -> None:
    disk = SimDisk()
    store = WalStore(tmp_path, clock=FakeClock(NOW), fs=disk)
    await store.open()
    try:
        before = len(disk.calls)
        key = await store.signing_key()
        made = disk.calls[before:]
    finally:
        await store.close()
    assert made == ["open_new", "write", "fdatasync", "replace", "fsync_dir"]
    assert disk.read(str(tmp_path / KEY_NAME)) == key


@pytest.mark.parametrize("mode", TAIL_MODES)
async def test_a_power_cut_while_the_key_is_made_leaves_none_or_the_whole_one(
    tmp_path: Path, mode: str
) -> None:
    """At every I/O call of the key's making: after the cut, the next open finds the key
    whole, or none (and makes one); a key that was handed out is the one found."""
    rng = random.Random(23)
    opened = SimDisk()
    store = WalStore(tmp_path, clock=FakeClock(NOW), fs=opened)
    await store.open()
    await store.close()
    base = len(opened.calls)
    for cut in range(base, base + 8):
        disk = SimDisk(cut_after=cut)
        store = WalStore(tmp_path, clock=FakeClock(NOW), fs=disk)
        handed: bytes | None = None
        try:
            await store.open()
            handed = await store.signing_key()
        except (PowerCut, StoreError):
            pass
        finally:
            await store.close()
        after = disk.after_cut(mode, rng)
        path = str(tmp_path / KEY_NAME)
        if after.exists(path):
            assert len(after.read(path)) == KEY_BYTES
        found = await _key_of(tmp_path, fs=after)
        if handed is not None:
            assert found == handed, cut


async def test_a_failed_store_makes_no_key(tmp_path: Path) -> None:
    """After a failed write nothing more may become durable: the key neither."""
    store = WalStore(tmp_path, clock=FakeClock(NOW), fs=FaultyFiles("fdatasync", "walq.log"))
    await store.open()
    try:
        with pytest.raises(StoreError):
            await store.commit([Job.new(kind="k", args=None, now=NOW)])
        with pytest.raises(StoreError):
            await store.signing_key()
    finally:
        await store.close()
    assert not (tmp_path / KEY_NAME).exists()
    assert len(await _key_of(tmp_path, fs=NoSyncFiles())) == KEY_BYTES


async def test_an_io_error_making_the_key_fails_that_call_only(tmp_path: Path) -> None:
    """A key that could not be made durable is never handed out; the store goes on, and the
    next call makes one (the temporary file left behind is removed first)."""
    fs = FaultyFiles("fdatasync", KEY_NAME + ".tmp")
    store = WalStore(tmp_path, clock=FakeClock(NOW), fs=fs)
    await store.open()
    try:
        with pytest.raises(StoreError, match="injected failure"):
            await store.signing_key()
        assert not (tmp_path / KEY_NAME).exists()
        job = Job.new(kind="k", args=None, now=NOW)
        await store.commit([job])  # the store has not failed
        key = await store.signing_key()
    finally:
        await store.close()
    assert (tmp_path / KEY_NAME).read_bytes() == key
    assert not (tmp_path / (KEY_NAME + ".tmp")).exists()


async def test_a_pause_whose_caller_was_cancelled_is_in_memory_as_on_disk(tmp_path: Path) -> None:
    """The pause file's write runs even if its caller is cancelled (the I/O thread never
    skips a call asked for), so the set the store serves must follow it, not stay behind
    until the next pause writes the file from it."""
    store = WalStore(tmp_path, clock=FakeClock(NOW))
    await store.open()
    held, release = asyncio.Event(), threading.Event()
    loop = asyncio.get_running_loop()
    try:
        blocker = asyncio.ensure_future(
            store.on_io(lambda: (loop.call_soon_threadsafe(held.set), release.wait(10)))
        )
        await held.wait()  # the I/O thread is busy: the pause's write waits in its queue
        pausing = asyncio.ensure_future(store.set_queue_paused("mail", True))
        await asyncio.sleep(0)
        pausing.cancel()
        release.set()
        await blocker
        with pytest.raises(asyncio.CancelledError):
            await pausing
        await store.set_queue_paused("reports", True)  # built on the set in memory
    finally:
        await store.close()
    again = WalStore(tmp_path, clock=FakeClock(NOW))
    assert (await again.open()).paused_queues == ["mail", "reports"]
    await again.close()
