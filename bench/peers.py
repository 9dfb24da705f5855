"""The PostgreSQL queues experiment J compares sqlq with, each driven through its own API.

``python -m sqlq.bench.peers PEER worker|enqueue|install --dsn DSN ...`` runs one side
of one peer in its own process, so the benchmark can start two workers, kill
one with SIGKILL and count in plain SQL, as it does for sqlq's nodes. Each
peer's defaults are its own; only what the issue names is set (PgQueuer's
``batch_size``; procrastinate's concurrency, which is 1 by default, is set to
sqlq's workers per node).

- PgQueuer 1.6 (``pgqueuer``): ``QueueManager`` on an asyncpg connection,
  ``Queries.enqueue`` with lists for a batch; a finished job leaves the
  ``pgqueuer`` table. A worker's jobs are re-picked once its heartbeat is older
  than ``heartbeat_timeout`` (30 s by default).
- procrastinate 3.10: ``App`` on ``PsycopgConnector``, ``batch_defer_async``,
  ``run_worker_async``; a finished job is ``succeeded``. A dead worker's jobs
  stay ``doing`` until the application retries them (``retry_stalled_jobs``).
- procrastinate's periodic tasks (experiment N): ``worker --periodic N --cron EXPR``
  registers one task ``tick`` N times under periodic ids ``s0`` .. (its registry is
  keyed by task and periodic id), so one worker process defers N jobs a tick, each
  with ``{"s": i, "timestamp": tick}``; ``PERIODIC_SQL`` reads them back.
- oban-py 0.7 needs Python >= 3.12; this machine runs 3.11, so it is not run.
- huey 3.5 (experiment P, not PostgreSQL): its process consumer on ``SqliteHuey`` runs the
  same CPU-bound handler as ``sqlq worker --processes``; its side is ``sqlq.bench.hueyspin``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any


@dataclass(frozen=True)
class Peer:
    name: str  # the label in the report
    package: str
    pending_sql: str  # jobs not yet finished, in plain SQL
    held_sql: str  # jobs a worker is running
    options: tuple[str, ...] = ()  # worker flags


PEERS = {
    p.name: p
    for p in (
        Peer("pgqueuer", "pgqueuer", "SELECT count(*) FROM pgqueuer",
             "SELECT count(*) FROM pgqueuer WHERE status = 'picked'"),
        Peer("pgqueuer-b100", "pgqueuer", "SELECT count(*) FROM pgqueuer",
             "SELECT count(*) FROM pgqueuer WHERE status = 'picked'", ("--batch", "100")),
        Peer("procrastinate", "procrastinate",
             "SELECT count(*) FROM procrastinate_jobs WHERE status <> 'succeeded'",
             "SELECT count(*) FROM procrastinate_jobs WHERE status = 'doing'"),
    )
}  # fmt: skip
HUEY = "huey"  # experiment P's peer: a package, not a PostgreSQL queue
NOT_INSTALLABLE = {"oban-py": "oban 0.7.0 requires Python >= 3.12; this machine has 3.11"}


def installed(peer: Peer | str) -> str | None:
    """The peer's (or the package's) installed version, or None."""
    try:
        return version(peer if isinstance(peer, str) else peer.package)
    except PackageNotFoundError:
        return None


# -- PgQueuer ------------------------------------------------------------------------------


async def _pgq(dsn: str) -> Any:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver

    return AsyncpgDriver(await asyncpg.connect(dsn))


async def pgq_install(dsn: str) -> None:
    from pgqueuer.queries import Queries

    await Queries(await _pgq(dsn)).install()


async def pgq_enqueue(dsn: str, n: int, sleep_s: float) -> float:
    from pgqueuer.queries import Queries

    q = Queries(await _pgq(dsn))
    payload = str(sleep_s).encode()
    t0 = time.perf_counter()
    for i in range(0, n, 1000):  # its batch API, a thousand per call
        k = min(1000, n - i)
        await q.enqueue(["work"] * k, [payload] * k, [0] * k)
    return time.perf_counter() - t0


async def pgq_worker(dsn: str, batch: int) -> None:
    from pgqueuer import PgQueuer
    from pgqueuer.models import Job

    pgq = PgQueuer(await _pgq(dsn))

    async def work(job: Job) -> None:
        seconds = float(job.payload or b"0")
        if seconds:
            await asyncio.sleep(seconds)

    pgq.entrypoint("work")(work)  # called, not a decorator: mypy sees the peers as Any
    await pgq.run(batch_size=batch)


# -- procrastinate ---------------------------------------------------------------------------


def _proc_app(dsn: str) -> Any:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    async def work(sleep_s: float = 0.0) -> None:
        if sleep_s:
            await asyncio.sleep(sleep_s)

    app.task(name="work")(work)
    return app


async def proc_install(dsn: str) -> None:
    app = _proc_app(dsn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def proc_enqueue(dsn: str, n: int, sleep_s: float) -> float:
    app = _proc_app(dsn)
    async with app.open_async():
        task = app.tasks["work"]
        t0 = time.perf_counter()
        for i in range(0, n, 1000):
            k = min(1000, n - i)
            await task.batch_defer_async(*[{"sleep_s": sleep_s}] * k)
        return time.perf_counter() - t0


# N's read of the ticks a periodic run made, as (s, tick, lateness in seconds): the
# trigger writes a ``deferred`` event at each job's insert, in the defer's own
# transaction (``now()``), and the deferrer puts the tick in the job's args. The table
# of periodic defers cannot serve: it keeps only the newest tick per periodic id.
PERIODIC_SQL = """
SELECT (j.args->>'s')::int, (j.args->>'timestamp')::bigint,
       extract(epoch FROM e.at)::float8 - (j.args->>'timestamp')::bigint
FROM procrastinate_jobs j JOIN procrastinate_events e ON e.job_id = j.id AND e.type = 'deferred'
WHERE j.task_name = 'tick'
"""


def _proc_periodic(app: Any, n: int, cron: str) -> None:
    """``n`` periodic registrations of one no-op task, ``tick``, each its own periodic id."""

    async def tick(timestamp: int, s: int) -> None:
        return None

    task = app.task(name="tick")(tick)
    for i in range(n):
        app.periodic(cron=cron, periodic_id=f"s{i}", task_kwargs={"s": i})(task)


async def proc_worker(dsn: str, concurrency: int, periodic: int = 0, cron: str = "") -> None:
    app = _proc_app(dsn)
    if periodic:
        _proc_periodic(app, periodic, cron)
    async with app.open_async():
        await app.run_worker_async(concurrency=concurrency)


# -- the command line ---------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m sqlq.bench.peers")
    p.add_argument("peer", choices=PEERS)
    p.add_argument("action", choices=["install", "enqueue", "worker"])
    p.add_argument("--dsn", required=True)
    p.add_argument("--jobs", type=int, default=0)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--periodic", type=int, default=0, help="procrastinate: periodic tasks")
    p.add_argument("--cron", default="* * * * *", help="their cron (a 6th field: seconds)")
    a = p.parse_args()
    pgq = a.peer.startswith("pgqueuer")
    if a.action == "install":
        asyncio.run(pgq_install(a.dsn) if pgq else proc_install(a.dsn))
    elif a.action == "enqueue":
        enqueue = pgq_enqueue if pgq else proc_enqueue
        print(asyncio.run(enqueue(a.dsn, a.jobs, a.sleep)))
    else:
        import uvloop

        uvloop.run(pgq_worker(a.dsn, a.batch) if pgq
                   else proc_worker(a.dsn, a.concurrency, a.periodic, a.cron))  # fmt: skip


if __name__ == "__main__":
    main()
