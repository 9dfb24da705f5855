"""The Redis queues experiment Q compares sqlq with: how each one's worker is started and
how its enqueuing side is run, and the mark every job leaves when it runs.

    python -m sqlq.bench.redispeers enqueue PEER JOBS SLEEP_S [--go]

enqueues in a process of its own with the peer's batch API (each peer's module,
``sqlq.bench.redis_<peer>``, says which call). With ``--go`` it first enqueues one
warm-up job, prints ``ready`` and waits for a line on stdin, so that neither its
interpreter start nor the worker's is inside the measured span; it then prints the
seconds its enqueue took. Without, it enqueues and prints the jobs it enqueued.

Every job, whatever the peer, ends by appending its number to the file ``DONE_ENV`` names
(``mark``): one ``write`` on an ``O_APPEND`` descriptor, a line of ``LINE`` bytes, so the
bench counts completions from any process, forked or not, without asking the broker (a
counter in Redis would add a command a job to the broker being measured). Each peer's
defaults are its own; what the bench sets is the concurrency, and Celery's acks.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from sqlq.bench.peers import installed

REDIS_ENV = "SQLQ_BENCH_REDIS"  # the broker's URL, for the workers and the enqueuer
DONE_ENV = "SQLQ_BENCH_DONE"  # the file every job appends its number to
CONCURRENCY_ENV = "SQLQ_BENCH_CONCURRENCY"  # arq's max_jobs (its CLI has no flag for it)
ACKS_LATE_ENV = "SQLQ_BENCH_ACKS_LATE"  # "1": Celery acks late and rejects on worker loss
WARM = 99_999_999  # the warm-up job's number
LINE = 9  # b"%08d\n"
BATCH = 1000  # jobs per batch call, every peer


@dataclass(frozen=True)
class RedisPeer:
    name: str  # the label in the report
    package: str
    module: str  # its tasks and its enqueue: sqlq.bench.redis_<...>
    env: dict[str, str] = field(default_factory=dict)  # for its workers and its enqueuer

    def worker(self, concurrency: int, url: str) -> list[str]:
        """The peer's usual worker process on the broker at ``url`` (the others read it from
        ``REDIS_ENV``), running ``concurrency`` jobs at once."""
        py, n = sys.executable, str(concurrency)
        if self.package == "celery":
            return [py, "-m", "celery", "-A", self.module, "worker", "--pool", "prefork",
                    "--concurrency", n, "--loglevel", "WARNING"]  # fmt: skip
        if self.package == "rq":  # ``rq worker`` forks a work horse a job; a pool of them
            bin_rq = str(Path(py).parent / "rq")
            return [bin_rq, "worker-pool", "--num-workers", n, "--url",
                    url, "--logging-level", "WARNING",
                    "--worker-class", f"{self.module}.Worker", "q"]  # fmt: skip
        if self.package == "dramatiq":  # its default is a process a core, 8 threads each
            procs = max(1, min(os.cpu_count() or 1, concurrency))
            return [py, "-m", "dramatiq", self.module, "--processes", str(procs),
                    "--threads", str(max(1, concurrency // procs))]  # fmt: skip
        if self.package == "arq":  # max_jobs from CONCURRENCY_ENV
            return [py, "-m", "arq", f"{self.module}.WorkerSettings"]
        raise ValueError(f"no worker for {self.package}")


PEERS = {
    p.name: p
    for p in (
        RedisPeer("celery", "celery", "sqlq.bench.redis_celery"),
        RedisPeer("celery-acks-late", "celery", "sqlq.bench.redis_celery",
                  {ACKS_LATE_ENV: "1"}),
        RedisPeer("rq", "rq", "sqlq.bench.redis_rq"),
        RedisPeer("dramatiq", "dramatiq", "sqlq.bench.redis_dramatiq"),
        RedisPeer("arq", "arq", "sqlq.bench.redis_arq"),
    )
}  # fmt: skip
THROUGHPUT = ("celery", "rq", "dramatiq", "arq")  # Celery's acks change its crash, not its rate


def available() -> dict[str, str]:
    """The peers installed here, with their versions (``pip install -e '.[redis-peers]'``)."""
    out = {}
    for name, peer in PEERS.items():
        v = installed(peer.package)
        if v is not None:
            out[name] = v
    return out


_fd: int | None = None


def mark(i: int) -> None:
    """Record that job ``i`` ran (see the module's docstring)."""
    global _fd
    if _fd is None:
        _fd = os.open(os.environ[DONE_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, b"%08d\n" % i)


def stamp() -> None:
    """Record when a job started, on the wall clock (experiment S's rate-limited peer):
    one ``write`` of a fixed-width line to the file ``DONE_ENV`` names, as ``mark``."""
    global _fd
    if _fd is None:
        _fd = os.open(os.environ[DONE_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_fd, b"%17.6f\n" % time.time())


def stamps(path: Path) -> list[float]:
    """The start times ``stamp`` recorded, sorted."""
    return sorted(float(x) for x in path.read_bytes().split()) if path.exists() else []


def marks(path: Path) -> list[int]:
    """The numbers of the jobs that ran, in the order they ran (the warm-up left out)."""
    if not path.exists():
        return []
    return [int(x) for x in path.read_bytes().split() if int(x) != WARM]


def marked(path: Path) -> int:
    """How many marks the file holds (the warm-up's too), from its size alone."""
    try:
        return path.stat().st_size // LINE
    except FileNotFoundError:
        return 0


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m sqlq.bench.redispeers")
    p.add_argument("action", choices=["enqueue"])
    p.add_argument("peer", choices=PEERS)
    p.add_argument("jobs", type=int)
    p.add_argument("sleep", type=float)
    p.add_argument("--go", action="store_true", help="warm up, print ready, wait for stdin")
    a = p.parse_args()
    module = importlib.import_module(PEERS[a.peer].module)
    if a.go:
        module.enqueue(range(WARM, WARM + 1), 0.0)
        print("ready", flush=True)
        sys.stdin.readline()
        t0 = time.perf_counter()
        module.enqueue(range(a.jobs), a.sleep)
        print(time.perf_counter() - t0, flush=True)
    else:
        module.enqueue(range(a.jobs), a.sleep)
        print(a.jobs, flush=True)


if __name__ == "__main__":
    main()
