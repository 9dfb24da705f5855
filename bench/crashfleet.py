"""The remote crash trials' workers (``sqlq.bench.crashremote`` on one server,
``crashremote_pg`` on two PostgreSQL nodes): the worker processes (``Fleet``), who holds
running jobs (``holders``), a restarted server on the address the workers know
(``same_port``), and the leases both kinds of trial run them with."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlq.bench.client.http import HttpPool
from sqlq.bench.client.server import ServerError, ServerProcess
from sqlq.bench.crashjudge import Death
from sqlq.bench.crashload import QUEUES, SAVED_NAME

WORKERS = 3  # worker processes at a time
LEASE_S = 5.0  # the protocol's shortest lease: a killed worker's jobs wait this long
CANCEL_GRACE_S = 1.0  # a forced cancel's lease, from the request


class Fleet:
    """The worker processes of a trial: started, killed, stopped; what was killed, when."""

    def __init__(self, urls: list[str], workdir: Path, lease_s: float, seed: int) -> None:
        self.urls, self.workdir, self.lease_s, self.seed = urls, workdir, lease_s, seed
        self.records = workdir / "records"
        self.records.mkdir(exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.deaths: list[Death] = []
        self.problems: list[str] = []
        self.n = 0
        self.downtime_s = 0.0  # a killed server's, from the kill until ready again

    def spawn(self) -> str:
        name = f"w{self.n}"
        self.n += 1
        argv = [sys.executable, "-m", "sqlq.bench.crashworker", "--name", name,
                "--lease", str(self.lease_s), "--seed", str(self.seed + self.n),
                "--records", str(self.records), "--saved", str(self.workdir / SAVED_NAME),
                *(a for q in QUEUES for a in ("--queue", q)),
                *(a for u in self.urls for a in ("--url", u))]  # fmt: skip
        log = open(self.workdir / f"{name}.log", "ab")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return name

    def wait_ready(self, within: float = 30.0) -> None:
        """Until every worker has said ``hello`` (so a kill lands on one that works)."""
        deadline = time.monotonic() + within
        for name, proc in self.procs.items():
            path = self.records / f"{name}.rec"
            while not (path.exists() and b'"hello"' in path.read_bytes()[:200]):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise ServerError(f"worker {name} did not start")
                time.sleep(0.01)

    def alive(self) -> bool:
        """Whether any worker still runs."""
        return any(proc.poll() is None for proc in self.procs.values())

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        proc.kill()
        self.deaths.append(Death("worker", name, time.time()))
        proc.wait()

    def stop(self, within: float = 30.0) -> None:
        """SIGTERM each (they report what they hold, then exit); a worker that does not exit
        in time, or exits with an error, fails the trial (and a late one is killed)."""
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + within
        for name, proc in self.procs.items():
            try:
                code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                self.deaths.append(Death("worker", name, time.time()))
                self.problems.append(f"worker {name} did not stop within {within:.0f} s")
                continue
            if code != 0:
                tail = (self.workdir / f"{name}.log").read_text(errors="replace")[-400:]
                self.problems.append(f"worker {name} exited with {code}: {tail}")
        self.procs.clear()


async def holders(pool: HttpPool) -> list[str]:
    """The workers holding running jobs now, by name (``holder`` ``worker:<name>``)."""
    status, page = await pool.json("GET", "/jobs?state=running&limit=100")
    if status != 200:
        return []
    return [str(j["holder"]).removeprefix("worker:") for j in page.get("jobs", [])
            if str(j.get("holder") or "").startswith("worker:")]  # fmt: skip


def same_port(srv: ServerProcess, old: ServerProcess) -> ServerProcess:
    """``srv`` on ``old``'s port: the workers and the clients know that one address."""
    srv.port, srv.url = old.port, old.url
    srv.cmd[srv.cmd.index("--port") + 1] = str(old.port)
    return srv
