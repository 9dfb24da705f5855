"""``python -m sqlq.bench.crashworker``: the crash trials' remote worker, a process of its own
that speaks the pull protocol over HTTP (httpx) and records all it did and was told
(``sqlq.bench.crashrecords``), so the verdict can hold the server to every answer.

It is a driver, not ``sqlq worker``: its handlers are the trials' (``r.*`` kinds, by
their ``args``), and it misbehaves on purpose where a trial needs it to:

- ``r.sleep``: works ``work_ms``, fails with ``fail_prob`` (sometimes naming
  ``retry_in_s``), stops and fails when a heartbeat says a cancel was asked for;
  ``r.stubborn``: the same, deaf to a cancel; ``r.bury``: fails with ``retry: false``;
  ``r.snooze``: snoozes until the job has snoozed ``snoozes`` times; ``r.checkpoint``:
  saves ``{"epoch", "read"}`` through ``/claims/checkpoint`` (noted in the handlers'
  ledger once accepted), then fails its first ``fail_first`` attempts. A result names
  the epoch, the worker and the execution (``run``), so the verdict knows whose stood.
- ``args.stall`` on a job's first attempt: the worker stops heartbeating it, works, and
  reports only once its lease has surely run out (the latest any call could have renewed
  it to, plus a margin): that outcome must be fenced.
- ``--release-prob``: a claimed job given back unstarted.

Every lease is renewed in one heartbeat each ``lease_s / 5`` until its outcome is
answered; outcomes go in batches (``/claims/outcomes``) or one by one (the single forms)
at random, and each is kept and sent again, with backoff, until the server answers it:
accepted, or fenced (any node will do, with several ``--url``). SIGTERM: no more
claims; finish, report, exit.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import msgspec
import uvloop

from sqlq.bench.crashrecords import TIMEOUT, UNANSWERED, RecordFile
from sqlq.common.protocol import ClaimAnswer, HeartbeatAnswer, OutcomesAnswer, Reported

KINDS = ("r.sleep", "r.stubborn", "r.bury", "r.snooze", "r.checkpoint")
PATHS = {w: f"/claims/{w}" for w in ("complete", "fail", "snooze", "checkpoint", "release")}


@dataclass
class Held:
    """A job this worker holds, from its claim until its outcome is answered."""

    run: str
    token: str
    job: dict[str, Any]
    lease_s: float
    hi: float  # the latest its lease can run to, by the calls that have returned
    stalled: bool = False
    cancel: bool = False
    fenced: bool = False
    percent: float | None = None
    done: bool = False  # its outcome was answered


@dataclass
class Pending:
    held: Held
    what: str
    body: dict[str, Any]
    answer: asyncio.Future[Reported]


class CrashWorker:
    def __init__(self, opts: argparse.Namespace) -> None:
        self.urls: list[str] = opts.url
        self.name: str = opts.name
        self.queues: list[str] = opts.queue
        self.lease_s: float = opts.lease
        self.concurrency: int = opts.concurrency
        self.release_prob: float = opts.release_prob
        self.rng = random.Random(opts.seed)
        self.rec = RecordFile(Path(opts.records) / f"{self.name}.rec")
        self.saved: Path | None = Path(opts.saved) if opts.saved else None
        self.held: dict[str, Held] = {}
        self.outbox: list[Pending] = []
        self.wake = asyncio.Event()
        self.stopping = asyncio.Event()
        self.down: dict[str, float] = {}  # a node that failed a call, until when it is avoided
        self.tasks: set[asyncio.Task[None]] = set()

    # -- HTTP ------------------------------------------------------------------

    def _pick(self) -> str:
        now = time.monotonic()
        up = [u for u in self.urls if self.down.get(u, 0.0) <= now] or self.urls
        return self.rng.choice(up)

    async def post(self, path: str, body: Any) -> tuple[int, bytes] | str:
        """One call to a node picked at random (one that failed lately avoided): the status
        and body, or ``UNANSWERED`` (the request was not taken, or the server died) or
        ``TIMEOUT`` (it may still be applied)."""
        url = self._pick()
        try:
            r = await self.http.post(
                url + path, content=msgspec.json.encode(body),
                headers={"content-type": "application/json"},
            )  # fmt: skip
        except (httpx.ConnectTimeout, httpx.PoolTimeout):
            self.down[url] = time.monotonic() + 0.5
            return UNANSWERED
        except httpx.TimeoutException:
            return TIMEOUT
        except httpx.TransportError:
            self.down[url] = time.monotonic() + 0.5
            return UNANSWERED
        return r.status_code, r.content

    # -- claiming ----------------------------------------------------------------

    async def claim_loop(self) -> None:
        backoff = 0.05
        while not self.stopping.is_set():
            free = self.concurrency - len(self.held)
            if free <= 0:
                await asyncio.sleep(0.01)
                continue
            body = {"queues": self.queues, "worker": self.name, "max": free, "wait_s": 0.5,
                    "lease_s": self.lease_s}  # fmt: skip
            t0 = time.time()
            got = await self.post("/claims", body)
            t = time.time()
            if isinstance(got, str) or got[0] != 200:
                await asyncio.sleep(backoff)
                backoff = min(0.5, backoff * 2)
                continue
            backoff = 0.05
            for g in msgspec.json.decode(got[1], type=ClaimAnswer).claims:
                job = msgspec.to_builtins(g.job)
                h = Held(uuid.uuid4().hex[:12], g.token, job, self.lease_s, g.lease_until)
                self.held[h.run] = h
                self.rec.write(ev="claim", job=job["id"], epoch=job["epoch"], w=self.name,
                               run=h.run, attempt=job["attempts"], lease_s=self.lease_s,
                               t0=t0, t=t, lease_until=g.lease_until)  # fmt: skip
                task = asyncio.create_task(self.execute(h))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    # -- heartbeats ----------------------------------------------------------------

    async def beat_loop(self) -> None:
        while not (self.stopping.is_set() and not self.held):
            await asyncio.sleep(self.lease_s / 5)
            beating = [h for h in self.held.values() if not (h.stalled or h.done or h.fenced)]
            if not beating:
                continue
            items = [{"token": h.token, **({} if h.percent is None else
                      {"progress": {"percent": h.percent}})} for h in beating]  # fmt: skip
            t0 = time.time()
            got = await self.post("/claims/heartbeat", {"items": items})
            t = time.time()
            answers: dict[str, Any] = {}
            if not isinstance(got, str) and got[0] == 200:
                answers = {b.token: b for b in
                           msgspec.json.decode(got[1], type=HeartbeatAnswer).items}  # fmt: skip
            for h in beating:
                job = h.job
                b = answers.get(h.token)
                if b is None:
                    error = got if isinstance(got, str) else f"http {got[0]}"
                    self.rec.write(ev="beat", job=job["id"], epoch=job["epoch"], run=h.run,
                                   t0=t0, t=t, error=error)  # fmt: skip
                    h.hi = math.inf if error == TIMEOUT else max(h.hi, t + h.lease_s)
                    continue
                self.rec.write(ev="beat", job=job["id"], epoch=job["epoch"], run=h.run, t0=t0,
                               t=t, lease_until=b.lease_until, cancel=b.cancel_requested,
                               error=b.error)  # fmt: skip
                if b.error is not None:
                    h.fenced = h.fenced or b.error == "fenced"
                else:
                    h.hi = max(h.hi, t + h.lease_s)
                    h.cancel = h.cancel or b.cancel_requested

    # -- executing ----------------------------------------------------------------

    async def execute(self, h: Held) -> None:
        job = h.job
        ids = {"job": job["id"], "epoch": job["epoch"], "run": h.run}
        try:
            if self.rng.random() < self.release_prob:
                self.rec.write(ev="release", **ids, t=time.time())
                await self.report(h, "release", {})
                return
            args = job["args"] if isinstance(job["args"], dict) else {}
            if args.get("stall") and job["attempts"] == 1:
                h.stalled = True
                self.rec.write(ev="stall", **ids, t=time.time(), lease_hi=h.hi)
            self.rec.write(ev="start", **ids, t=time.time())
            what, body = await self.handle(h, args)
            self.rec.write(ev="end", **ids, t=time.time(), what=what)
            if h.stalled:  # report only once the lease has surely run out
                margin = self.rng.uniform(0.3, 2.5)  # no heartbeat moves ``hi`` now
                await asyncio.sleep(max(0.0, h.hi + margin - time.time()))
            await self.report(h, what, body)
        finally:
            h.done = True
            self.held.pop(h.run, None)

    async def _work(self, h: Held, ms: float, *, deaf: bool = False) -> bool:
        """Work ``ms``; False if it stopped early (a cancel asked for, or fenced)."""
        end = time.monotonic() + ms / 1000
        while (left := end - time.monotonic()) > 0:
            if h.fenced or (h.cancel and not deaf):
                return False
            await asyncio.sleep(min(0.01, left))
        return True

    async def handle(self, h: Held, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """What the job's kind does: the outcome and its body."""
        job, rng = h.job, self.rng
        mine = {"epoch": job["epoch"], "worker": self.name, "run": h.run}
        kind = job["kind"]
        if kind == "r.bury":
            return "fail", {"error": "buried on purpose", "retry": False}
        if kind == "r.snooze":
            if job["snoozes"] < int(args.get("snoozes", 1)):
                return "snooze", {"delay_s": float(args.get("delay_ms", 20)) / 1000}
            return "complete", {"result": {**mine, "snoozes": job["snoozes"]}}
        if kind == "r.checkpoint":
            read = (job["checkpoint"] or {}).get("epoch")
            saved = await self.report(h, "checkpoint", {"data": {"epoch": job["epoch"],
                                                                "read": read}})  # fmt: skip
            if saved.state == "running" and self.saved is not None:
                await asyncio.to_thread(_append, self.saved, f"{job['id']} {job['epoch']}\n")
            h.percent = 50.0
            await self._work(h, float(args.get("work_ms", 50)))
            if job["attempts"] <= int(args.get("fail_first", 1)):
                return "fail", {"error": f"attempt {job['attempts']} fails after its checkpoint"}
            return "complete", {"result": {**mine, "read": read}}
        finished = await self._work(h, float(args.get("work_ms", 2)), deaf=kind == "r.stubborn")
        if not finished:
            why = "fenced" if h.fenced else "cancelled while it ran"
            return "fail", {"error": f"stopped: {why}"}
        if rng.random() < float(args.get("fail_prob", 0.0)):
            body: dict[str, Any] = {"error": "fails on purpose"}
            if rng.random() < 0.3:
                body["retry_in_s"] = round(rng.uniform(0, 0.2), 3)
            return "fail", body
        return "complete", {"result": mine}

    # -- reporting ----------------------------------------------------------------

    async def report(self, h: Held, what: str, body: dict[str, Any]) -> Reported:
        """Queue an outcome; its final answer (accepted, fenced or refused)."""
        p = Pending(h, what, body, asyncio.get_running_loop().create_future())
        self.outbox.append(p)
        self.wake.set()
        answer = await p.answer
        if answer.error == "fenced":
            h.fenced = True
        return answer

    async def report_loop(self) -> None:
        while not (self.stopping.is_set() and not self.held and not self.outbox):
            if not self.outbox:
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), 0.1)
                except TimeoutError:
                    pass
                continue
            batch, self.outbox = self.outbox[:100], self.outbox[100:]
            if self.rng.random() < 0.5:
                again = await self._send_batch(batch)
            else:
                again = [p for p in await asyncio.gather(*(self._send_one(p) for p in batch))
                         if p is not None]  # fmt: skip
            if again:
                await asyncio.sleep(self.rng.uniform(0.05, 0.3))
                self.outbox[:0] = again

    def _sent(self, p: Pending, form: str) -> float:
        t0 = time.time()
        job = p.held.job
        self.rec.write(ev="send", job=job["id"], epoch=job["epoch"], run=p.held.run,
                       what=p.what, t=t0, form=form)  # fmt: skip
        return t0

    def _answered(self, p: Pending, t0: float, status: int | None, got: Reported | None,
                  error: str | None = None) -> bool:  # fmt: skip
        """Note an answer; True if it is final (the outcome is not sent again)."""
        job = p.held.job
        if got is not None:
            error = got.error
        self.rec.write(ev="answer", job=job["id"], epoch=job["epoch"], run=p.held.run,
                       what=p.what, t0=t0, t=time.time(), status=status,
                       state=None if got is None else got.state, error=error)  # fmt: skip
        final = got is not None or (status is not None and 400 <= status < 500)
        if final:
            p.answer.set_result(got or Reported(token=p.held.token, error=error))
        return final

    async def _send_batch(self, batch: list[Pending]) -> list[Pending]:
        t0s = [self._sent(p, "batch") for p in batch]
        items = [{"token": p.held.token, p.what: p.body} for p in batch]
        got = await self.post("/claims/outcomes", {"outcomes": items})
        if isinstance(got, str) or got[0] != 200:
            status, error = (None, got) if isinstance(got, str) else (got[0], f"http {got[0]}")
            return [p for p, t0 in zip(batch, t0s, strict=True)
                    if not self._answered(p, t0, status, None, error)]  # fmt: skip
        answers = msgspec.json.decode(got[1], type=OutcomesAnswer).outcomes
        for p, t0, a in zip(batch, t0s, answers, strict=True):
            self._answered(p, t0, 200, a)
        return []

    async def _send_one(self, p: Pending) -> Pending | None:
        t0 = self._sent(p, "single")
        got = await self.post(PATHS[p.what], {"token": p.held.token, **p.body})
        if isinstance(got, str):
            return None if self._answered(p, t0, None, None, got) else p
        status, raw = got
        if status in (200, 409, 422):
            try:
                answer = msgspec.json.decode(raw, type=Reported)
            except msgspec.DecodeError:  # a 409/422 body not a Reported: the error named
                answer = Reported(token=p.held.token, error=_error_of(raw) or f"http {status}")
            if status == 409 and answer.error is None:
                answer = Reported(token=p.held.token, error=f"409 without an error: {raw[:80]!r}")
            return None if self._answered(p, t0, status, answer) else p
        return None if self._answered(p, t0, status, None, f"http {status}") else p

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.stopping.set)
        timeout = httpx.Timeout(10.0, connect=1.0, pool=5.0)
        limits = httpx.Limits(max_connections=self.concurrency + 4)
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as self.http:
            self.rec.write(ev="hello", w=self.name, t=time.time())  # the trial waits for it
            await asyncio.gather(self.claim_loop(), self.beat_loop(), self.report_loop())
            await asyncio.gather(*self.tasks)
        self.rec.close()


def _append(path: Path, line: str) -> None:
    """A line of the handlers' ledger (``sqlq.bench.crashload.SAVED_NAME``): a checkpoint
    the server accepted, so durable."""
    with open(path, "a") as f:
        f.write(line)


def _error_of(raw: bytes) -> str | None:
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None
    return str(body.get("error")) if isinstance(body, dict) and "error" in body else None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="crashworker", description=__doc__.split("\n")[0])
    p.add_argument("--url", action="append", required=True, help="a node (repeatable)")
    p.add_argument("--name", required=True)
    p.add_argument("--queue", action="append", required=True)
    p.add_argument("--lease", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--release-prob", type=float, default=0.03)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--records", required=True, help="the folder of the workers' side files")
    p.add_argument("--saved", default=os.environ.get("SQLQ_CRASH_SAVED", ""))
    uvloop.run(CrashWorker(p.parse_args(argv)).run())


if __name__ == "__main__":
    main()
