"""The crash trials' client side: what a trial is, the mixed workload (``mixed_spec`` for
the server's own workers, ``remote_spec`` for remote ones), the client's fsynced ledger
of what it was told, and the operator who cancels, retries and pauses
(``sqlq.bench.crashcheck`` runs the trials; ``crashcheck_pg`` and ``crashremote`` use
these too).

The mixed workload uses what a running job carries (issue 22) too: long jobs the
operator cancels while they run (a 202 is noted with the attempt it was asked of),
jobs that checkpoint and fail their first attempts, and jobs that snooze
(``sqlq.bench.crashtasks``, which the server imports: ``SERVER_FLAGS``)."""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from sqlq.bench.client.http import HTTPError, HttpPool
from sqlq.bench.crashtasks import IMPORT, SAVED_ENV
from sqlq.bench.verdict import (
    BURY_TAG,
    CANCEL_TAG,
    CHECKPOINT_TAG,
    FORCE,
    SNOOZE_TAG,
    ClientRecord,
)

QUEUES = ("default", "mail")  # mixed: "mail" is the one the operator pauses
PLAIN: dict[str, Any] = {"kind": "sleep", "args": {"work_ms": 2}}
SERVER_FLAGS = ("--import", IMPORT)  # the mixed workload's own kinds
SAVED_NAME = "saved.txt"  # the handlers' ledger, beside the clients'
Spec = Callable[[random.Random], tuple[dict[str, Any], bool, str]]  # what mixed_spec is


def server_env(workdir: Path) -> dict[str, str]:
    """The environment of a trial's server: where its handlers note durable checkpoints."""
    return {SAVED_ENV: str(workdir / SAVED_NAME)}


@dataclass(frozen=True)
class Trial:
    store: str
    sync: str
    jobs: int
    clients: int
    kill_after_s: float
    compact_floor_mb: float | None
    workload: str = "mixed"
    seed: int = 0  # the mixed workload's choices


def mixed_spec(rng: random.Random) -> tuple[dict[str, Any], bool, str]:
    """One submission of the mixed workload, whether it may fail (or hang), and its tag
    (``sqlq.bench.verdict``: what the verdict holds it to besides)."""
    roll = rng.random()
    queue = "mail" if rng.random() < 0.3 else "default"
    if roll < 0.35:  # plain
        return {**PLAIN, "queue": queue}, False, ""
    attempts = rng.randint(1, 3)
    args: dict[str, float]
    if roll < 0.41:  # long and unfailing: the operator cancels it while it runs
        args = {"work_ms": rng.randint(300, 2000)}
        kind = "sleep" if rng.random() < 0.5 else "crash.stubborn"  # stops, or ignores it
        return {"kind": kind, "args": args, "max_attempts": 3, "queue": queue}, False, CANCEL_TAG
    if roll < 0.47:  # checkpoints, then fails its first attempts
        fail_first = rng.randint(1, 2)
        args = {"work_ms": rng.randint(5, 300), "fail_first": fail_first}
        spec = {"kind": "crash.checkpoint", "args": args, "max_attempts": fail_first + 3}
        return {**spec, "queue": queue}, True, CHECKPOINT_TAG
    if roll < 0.51:  # snoozes a few times, then completes
        args = {"snoozes": rng.randint(1, 3), "delay_ms": rng.randint(5, 100)}
        return {"kind": "crash.snooze", "args": args, "queue": queue}, False, SNOOZE_TAG
    if roll < 0.70:  # fails at random
        args = {"work_ms": rng.randint(1, 5), "fail_prob": 0.5}
        return {"kind": "sleep", "args": args, "max_attempts": attempts, "queue": queue}, True, ""
    if roll < 0.80:  # long, on its last attempt: a kill often lands on it
        args = {"work_ms": rng.randint(200, 1500)}
        if rng.random() < 0.3:
            args["fail_prob"] = 0.3
        return {"kind": "sleep", "args": args, "max_attempts": 1, "queue": queue}, True, ""
    if roll < 0.85:  # hangs: the health check cuts it off
        args = {"work_ms": 2, "hang_prob": 0.5}
        return {"kind": "sleep", "args": args, "max_attempts": attempts, "queue": queue}, True, ""
    # delayed: what the operator cancels
    spec = {**PLAIN, "queue": queue, "delay_ms": rng.randint(100, 800), "max_attempts": attempts}
    return spec, False, ""


def remote_spec(rng: random.Random, stall: float = 0.0) -> tuple[dict[str, Any], bool, str]:
    """One submission of the remote mixed workload, whether it may fail, and its tag (the
    in-process ``mixed_spec``'s shape, with the remote worker's kinds,
    ``sqlq.bench.crashworker``): ``stall`` of them stall on their first attempt."""
    roll = rng.random()
    queue = "mail" if rng.random() < 0.3 else "default"
    spec: dict[str, Any]
    args: dict[str, Any]
    can_fail, tag = False, ""
    if roll < 0.35:  # plain
        spec = {"kind": "r.sleep", "args": {"work_ms": 2}}
    elif roll < 0.41:  # long: the operator cancels it while it runs (a stubborn one ignores it)
        kind = "r.sleep" if rng.random() < 0.5 else "r.stubborn"
        spec = {"kind": kind, "args": {"work_ms": rng.randint(300, 2000)}, "max_attempts": 3}
        tag = CANCEL_TAG
    elif roll < 0.47:  # checkpoints, then fails its first attempts
        fail_first = rng.randint(1, 2)
        args = {"work_ms": rng.randint(5, 300), "fail_first": fail_first}
        spec = {"kind": "r.checkpoint", "args": args, "max_attempts": fail_first + 3}
        can_fail, tag = True, CHECKPOINT_TAG
    elif roll < 0.51:  # snoozes a few times, then completes
        args = {"snoozes": rng.randint(1, 3), "delay_ms": rng.randint(5, 100)}
        spec, tag = {"kind": "r.snooze", "args": args}, SNOOZE_TAG
    elif roll < 0.55:  # fails with retry: false
        spec, can_fail, tag = {"kind": "r.bury", "args": {}, "max_attempts": 3}, True, BURY_TAG
    elif roll < 0.72:  # fails at random
        args = {"work_ms": rng.randint(1, 5), "fail_prob": 0.5}
        spec, can_fail = {"kind": "r.sleep", "args": args, "max_attempts": rng.randint(1, 3)}, True
    elif roll < 0.80:  # long, on its last attempt: a kill often lands on it
        args = {"work_ms": rng.randint(200, 1500)}
        if rng.random() < 0.3:
            args["fail_prob"] = 0.3
        spec, can_fail = {"kind": "r.sleep", "args": args, "max_attempts": 1}, True
    elif roll < 0.85:  # long, attempts to spare: a kill means it runs again
        spec = {"kind": "r.sleep", "args": {"work_ms": rng.randint(200, 1200)}}
    else:  # delayed: what the operator cancels
        delay = rng.randint(100, 800)
        spec = {"kind": "r.sleep", "args": {"work_ms": 2}, "delay_ms": delay,
                "max_attempts": rng.randint(1, 3)}  # fmt: skip
    if tag not in (BURY_TAG, SNOOZE_TAG) and rng.random() < stall:
        spec["args"]["stall"] = True
    return {**spec, "queue": queue}, can_fail, tag


class Ledger:
    """What the clients did and were told, appended (and fsynced in groups) to a file as
    it happens: ``ack <id> <max_attempts or -> <0|1 may fail> [<tag>[:<snoozes>]]``,
    ``<event> <id>``, ``cancel202 <id> <attempts>``. Beside it, the handlers' ledger
    (``SAVED_NAME``: ``<id> <epoch>`` per durable checkpoint) is read back with it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: dict[str, ClientRecord] = {}
        self.acked: list[str] = []
        self.delayed: list[str] = []  # acknowledged delayed jobs: the operator's cancels
        self.long: list[str] = []  # acknowledged long jobs: cancelled while they run
        self._lines: list[str] = []

    def ack(
        self, job_id: str, max_attempts: int | None, can_fail: bool, tag: str = "",
        snoozes: int = 0,
    ) -> None:  # fmt: skip
        self.records[job_id] = ClientRecord(max_attempts, can_fail, tag=tag, snoozes=snoozes)
        self.acked.append(job_id)
        suffix = "" if not tag else f" {tag}:{snoozes}" if snoozes else f" {tag}"
        self._lines.append(f"ack {job_id} {max_attempts or '-'} {int(can_fail)}{suffix}\n")

    def note(self, job_id: str, event: str) -> None:
        self.records.setdefault(job_id, ClientRecord()).events.append(event)
        self._lines.append(f"{event} {job_id}\n")

    def requested(self, job_id: str, attempts: int) -> None:
        """A running job's cancel was acknowledged (202) during attempt ``attempts``."""
        rec = self.records.setdefault(job_id, ClientRecord())
        rec.events.append("cancel202")
        rec.requested_at = attempts
        self._lines.append(f"cancel202 {job_id} {attempts}\n")

    def take(self) -> bytes:
        lines, self._lines = self._lines, []
        return "".join(lines).encode()

    @classmethod
    def read(cls, path: Path) -> Ledger:
        """The ledger as the file has it (what was fsynced is all that counts)."""
        ledger = cls(path)
        text = path.read_text() if path.exists() else ""
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 1:  # an id alone: the plain workload's old format
                ledger.ack(parts[0], None, False)
            elif parts and parts[0] == "ack":
                tag, _, snoozes = (parts[4] if len(parts) > 4 else "").partition(":")
                ledger.ack(
                    parts[1], None if parts[2] == "-" else int(parts[2]), parts[3] == "1",
                    tag, int(snoozes or 0),
                )  # fmt: skip
            elif len(parts) == 3 and parts[0] == "cancel202":
                ledger.requested(parts[1], int(parts[2]))
            elif len(parts) == 2:
                ledger.note(parts[1], parts[0])
        ledger._lines = []
        ledger.read_saved()
        return ledger

    def read_saved(self) -> None:
        """The handlers' ledger, read (again: the restarted server's handlers add to it)."""
        saved = self.path.with_name(SAVED_NAME)
        for rec in self.records.values():
            rec.saved = []
        for line in (saved.read_text() if saved.exists() else "").splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] in self.records:  # a torn last line: ignored
                self.records[parts[0]].saved.append(int(parts[1]))

    def acknowledged(self, job_id: str, spec: dict[str, Any], can_fail: bool, tag: str) -> None:
        """A submission answered 201: noted, and offered to the operator if it is one of
        those it cancels."""
        snoozes = int(spec["args"].get("snoozes", 0)) if tag == SNOOZE_TAG else 0
        self.ack(job_id, spec.get("max_attempts"), can_fail, tag, snoozes)
        if "delay_ms" in spec:
            self.delayed.append(job_id)
        elif tag == CANCEL_TAG:
            self.long.append(job_id)


async def _running_long(pool: HttpPool, ledger: Ledger, rng: random.Random) -> str | None:
    """One of the long jobs that runs now (taken off the list), else one of the newest."""
    status, page = await pool.json("GET", "/jobs?state=running&limit=100")
    running = {j["id"] for j in page.get("jobs", [])} if status == 200 else set()
    candidates = [i for i in ledger.long if i in running] or ledger.long[-5:]
    job_id = candidates[rng.randrange(len(candidates))] if candidates else None
    if job_id is not None:
        ledger.long.remove(job_id)
    return job_id


async def operate(
    pools: Callable[[], HttpPool | None], ledger: Ledger, rng: random.Random,
    stop: asyncio.Event, *, gone: Callable[[HttpPool], None] | None = None,
    force: float = 0.0,
) -> None:  # fmt: skip
    """The mixed workload's operator: cancels, retries, pauses and resumes until stopped,
    on the server ``pools()`` names. When that one stops answering it gives up, or with
    ``gone`` (many nodes) tells it and goes on with the next. ``force``: how often a cancel
    of a running job says ``?force=1`` (noted ``FORCE``: its lease is cut short)."""
    paused = False
    while not stop.is_set():
        await asyncio.sleep(rng.uniform(0.005, 0.03))
        pool = pools()
        if pool is None:
            continue
        roll = rng.random()
        try:
            if roll < 0.45 and (ledger.delayed or ledger.long):
                # a delayed job (still scheduled), or one of the newest long ones (running)
                if ledger.long and (rng.random() < 0.5 or not ledger.delayed):
                    job_id = await _running_long(pool, ledger, rng)
                    if job_id is None:
                        continue
                else:
                    job_id = ledger.delayed.pop(rng.randrange(len(ledger.delayed)))
                ledger.note(job_id, "cancel?")
                query = ""
                if force and rng.random() < force:
                    ledger.note(job_id, FORCE)
                    query = "?force=1"
                status, job = await pool.json("DELETE", f"/jobs/{job_id}{query}")
                # 200: cancelled; 202: running, the cancel asked for (told by the job's
                # state too, so the ledger says what the server said it did)
                if status in (200, 202) and job["state"] == "cancelled":
                    ledger.note(job_id, "cancel")
                elif status in (200, 202) and job["state"] == "running":
                    ledger.requested(job_id, int(job["attempts"]))
            elif roll < 0.8:
                state = "dead" if rng.random() < 0.7 else "cancelled"
                status, page = await pool.json("GET", f"/jobs?state={state}&limit=20")
                ids = [j["id"] for j in page.get("jobs", [])] if status == 200 else []
                if ids:
                    job_id = rng.choice(ids)
                    ledger.note(job_id, "retry?")
                    status, _ = await pool.json("POST", f"/jobs/{job_id}/retry")
                    if status == 200:
                        ledger.note(job_id, "retry")
            else:
                paused = not paused
                await pool.json("POST", f"/queues/mail/{'pause' if paused else 'resume'}")
        except (HTTPError, OSError, TimeoutError):
            if gone is None:
                return  # the server is gone
            gone(pool)


async def load(
    url: str, trial: Trial, ledger: Ledger, stop: asyncio.Event, *, spec: Spec | None = None,
    force: float = 0.0,
) -> int:  # fmt: skip
    """Submit until stopped; every acked id goes to the ledger, fsynced in groups. ``spec``:
    the mixed workload's submissions (``mixed_spec`` unless given); ``force``: the
    operator's (``operate``)."""
    rng = random.Random(trial.seed)
    pick = spec or mixed_spec
    fd = os.open(ledger.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    loop = asyncio.get_running_loop()
    mixed = trial.workload == "mixed"

    def append(data: bytes) -> None:
        os.write(fd, data)
        os.fsync(fd)

    async def flush() -> None:
        chunk = ledger.take()
        if chunk:
            await loop.run_in_executor(None, append, chunk)

    try:
        async with HttpPool(url, trial.clients + 1) as pool:

            async def client() -> None:
                while not stop.is_set() and len(ledger.acked) < trial.jobs:
                    body, can_fail, tag = pick(rng) if mixed else (PLAIN, False, "")
                    try:
                        status, reply = await pool.json("POST", "/jobs", msgspec.json.encode(body))
                    except (HTTPError, OSError):
                        return
                    if status == 201:
                        ledger.acknowledged(reply["id"], body, can_fail, tag)

            async def ledger_writer() -> None:
                while not stop.is_set():
                    await flush()
                    await asyncio.sleep(0.01)

            writer = asyncio.create_task(ledger_writer())
            clients = [client() for _ in range(trial.clients)]
            if mixed:
                rng_op = random.Random(trial.seed + 1)
                clients.append(operate(lambda: pool, ledger, rng_op, stop, force=force))
            await asyncio.gather(*clients)
            stop.set()
            await writer
            await flush()
    finally:
        os.close(fd)
    return len(ledger.acked)
