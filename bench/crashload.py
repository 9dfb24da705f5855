"""The crash trials' client side: what a trial is, the mixed workload, the client's
fsynced ledger of what it was told, and the operator who cancels, retries and pauses
(``sqlq.bench.crashcheck`` runs the trials; ``crashcheck_pg`` uses these too)."""

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
from sqlq.bench.offline import ClientRecord

QUEUES = ("default", "mail")  # mixed: "mail" is the one the operator pauses
PLAIN: dict[str, Any] = {"kind": "sleep", "args": {"work_ms": 2}}


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


def mixed_spec(rng: random.Random) -> tuple[dict[str, Any], bool]:
    """One submission of the mixed workload, and whether it may fail (or hang)."""
    roll = rng.random()
    queue = "mail" if rng.random() < 0.3 else "default"
    if roll < 0.45:  # plain
        return {**PLAIN, "queue": queue}, False
    attempts = rng.randint(1, 3)
    if roll < 0.70:  # fails at random
        args = {"work_ms": rng.randint(1, 5), "fail_prob": 0.5}
        return {"kind": "sleep", "args": args, "max_attempts": attempts, "queue": queue}, True
    if roll < 0.80:  # long, on its last attempt: a kill often lands on it
        args = {"work_ms": rng.randint(200, 1500)}
        if rng.random() < 0.3:
            args["fail_prob"] = 0.3
        return {"kind": "sleep", "args": args, "max_attempts": 1, "queue": queue}, True
    if roll < 0.85:  # hangs: the health check cuts it off
        args = {"work_ms": 2, "hang_prob": 0.5}
        return {"kind": "sleep", "args": args, "max_attempts": attempts, "queue": queue}, True
    # delayed: what the operator cancels
    spec = {**PLAIN, "queue": queue, "delay_ms": rng.randint(100, 800), "max_attempts": attempts}
    return spec, False


class Ledger:
    """What the clients did and were told, appended (and fsynced in groups) to a file as
    it happens: ``ack <id> <max_attempts or -> <0|1 may fail>``, ``<event> <id>``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: dict[str, ClientRecord] = {}
        self.acked: list[str] = []
        self.delayed: list[str] = []  # acknowledged delayed jobs: the operator's cancels
        self._lines: list[str] = []

    def ack(self, job_id: str, max_attempts: int | None, can_fail: bool) -> None:
        self.records[job_id] = ClientRecord(max_attempts, can_fail)
        self.acked.append(job_id)
        self._lines.append(f"ack {job_id} {max_attempts or '-'} {int(can_fail)}\n")

    def note(self, job_id: str, event: str) -> None:
        self.records.setdefault(job_id, ClientRecord()).events.append(event)
        self._lines.append(f"{event} {job_id}\n")

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
                ledger.ack(parts[1], None if parts[2] == "-" else int(parts[2]), parts[3] == "1")
            elif len(parts) == 2:
                ledger.note(parts[1], parts[0])
        ledger._lines = []
        return ledger


async def operate(
    pools: Callable[[], HttpPool | None], ledger: Ledger, rng: random.Random,
    stop: asyncio.Event, *, gone: Callable[[HttpPool], None] | None = None,
) -> None:  # fmt: skip
    """The mixed workload's operator: cancels, retries, pauses and resumes until stopped,
    on the server ``pools()`` names. When that one stops answering it gives up, or with
    ``gone`` (many nodes) tells it and goes on with the next."""
    paused = False
    while not stop.is_set():
        await asyncio.sleep(rng.uniform(0.005, 0.03))
        pool = pools()
        if pool is None:
            continue
        roll = rng.random()
        try:
            if roll < 0.45 and ledger.delayed:
                job_id = ledger.delayed.pop(rng.randrange(len(ledger.delayed)))
                ledger.note(job_id, "cancel?")
                status, _ = await pool.json("DELETE", f"/jobs/{job_id}")
                if status == 200:
                    ledger.note(job_id, "cancel")
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


async def load(url: str, trial: Trial, ledger: Ledger, stop: asyncio.Event) -> int:
    """Submit until stopped; every acked id goes to the ledger, fsynced in groups."""
    rng = random.Random(trial.seed)
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
                    spec, can_fail = mixed_spec(rng) if mixed else (PLAIN, False)
                    try:
                        status, reply = await pool.json("POST", "/jobs", msgspec.json.encode(spec))
                    except (HTTPError, OSError):
                        return
                    if status == 201:
                        ledger.ack(reply["id"], spec.get("max_attempts"), can_fail)
                        if "delay_ms" in spec:
                            ledger.delayed.append(reply["id"])

            async def ledger_writer() -> None:
                while not stop.is_set():
                    await flush()
                    await asyncio.sleep(0.01)

            writer = asyncio.create_task(ledger_writer())
            clients = [client() for _ in range(trial.clients)]
            if mixed:
                rng_op = random.Random(trial.seed + 1)
                clients.append(operate(lambda: pool, ledger, rng_op, stop))
            await asyncio.gather(*clients)
            stop.set()
            await writer
            await flush()
    finally:
        os.close(fd)
    return len(ledger.acked)
