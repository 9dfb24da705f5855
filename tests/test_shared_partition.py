"""A node cut off from its PostgreSQL by a partition (a proxy the test silences), on a real
database: the lease bounds execution, not only writes.

Node A reaches the database through ``Proxy``; node B directly. While A runs a job, the
link is cut for longer than the lease. Then:
- every call of A's has a deadline: a submission is answered 503, within 5 s;
- A's ``/readyz`` says not ready, within 5 s;
- A's handler is cancelled by A itself within its lease (+1 s) of its last renewal, and
  A reports nothing of that attempt (counted ``lease_lost``), so the job never runs on two
  nodes past A's lease;
- B rescues the job and runs it to completion; after the heal, nothing acknowledged is lost
  and A's late attempt changes nothing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from sqlq.common.models import State
from sqlq.http.app import create_app
from sqlq.runtime.events import Event
from sqlq.runtime.kinds import JobContext, Registry, task
from sqlq.runtime.shared import SharedClaims
from tests import shared_helpers
from tests.helpers import final, wait_for
from tests.proxy import proxy_to
from tests.shared_helpers import Node, submit

nodes = shared_helpers.nodes  # the fixture, by its name

LEASE_S = 2.0
CUT_S = 10.0


def through(dsn: str, port: int) -> str:
    """``dsn`` with its port replaced (the proxy's)."""
    parts = urlsplit(dsn)
    host = parts.netloc.rsplit(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{host}:{port}"))


@pytest.mark.slow
async def test_a_partitioned_node_stops_its_handlers_within_its_lease(
    nodes: Node, pg_db: str
) -> None:
    runs: list[int] = []  # the attempt number of every run that started
    cancelled_at: list[float] = []  # monotonic, when A's handler saw its cancel
    started: dict[int, float] = {}  # monotonic, when the held job's attempt N started
    reg = Registry()

    @task(registry=reg, name="work", hb_timeout=None)
    async def work(args: Any, ctx: JobContext) -> Any:
        runs.append(ctx.job.attempts)
        if args.get("hold"):
            started[ctx.job.attempts] = time.monotonic()
        if not args.get("hold") or ctx.job.attempts > 1:
            return "done on the rescuer"
        try:
            await asyncio.Event().wait()  # the first attempt runs until it is cut off
        except asyncio.CancelledError:
            cancelled_at.append(time.monotonic())
            raise
        return "never"

    host, port = urlsplit(pg_db).hostname or "127.0.0.1", urlsplit(pg_db).port or 5432
    async with proxy_to(host, port) as proxy:
        a = nodes(workers=1, kinds_=reg, lease_s=LEASE_S, dsn=through(pg_db, proxy.port))
        await a.start()
        assert isinstance(a.claims, SharedClaims)
        [job] = await submit(a, args={"hold": True})
        await wait_for(lambda: runs == [1], 10, "node A to start the job")
        b = nodes(workers=1, kinds_=reg, lease_s=LEASE_S)
        await b.start()

        api = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(a, start_runtime=False)),
            base_url="http://localhost",
        )
        async with api:
            assert (await api.get("/readyz")).status_code == 200
            proxy.cut()
            cut = time.monotonic()

            t0 = time.monotonic()
            refused = await api.post("/jobs", json={"kind": "work", "args": {}})
            assert refused.status_code == 503, refused.text
            assert time.monotonic() - t0 <= 5.0
            assert "Retry-After" in refused.headers

            async def not_ready() -> bool:
                return (await api.get("/readyz")).status_code == 503

            await wait_for(not_ready, 5.0 - (time.monotonic() - cut), "/readyz to say 503")

            await wait_for(lambda: bool(cancelled_at), LEASE_S + 1.0, "A to cut its handler off")
            renewed = a.claims.renewed_at  # the last renewal the database granted A
            assert renewed <= cut
            assert cancelled_at[0] - renewed <= LEASE_S + 1.0
            assert a.events.totals[Event.LEASE_LOST] == 1
            assert a.stats()["lease_lost"] == 1  # (what /stats shows of it)

            # B rescues it once A's lease runs out, and runs it to completion.
            done = await final(b, job.id, within=CUT_S)
            assert (done.state, done.attempts, done.result) == (
                State.COMPLETED, 2, "done on the rescuer",
            )  # fmt: skip
            await asyncio.sleep(max(0.0, CUT_S - (time.monotonic() - cut)))  # the cut lasts
            proxy.heal()

            async def ready() -> bool:
                return (await api.get("/readyz")).status_code == 200

            await wait_for(ready, 15, "A to be ready again after the heal")
            [again] = await submit(a, args={})
            settled = await final(a, again.id, within=15)
            assert settled.state is State.COMPLETED

    assert runs[:2] == [1, 2]  # A's one attempt, B's rerun
    assert started[2] >= cancelled_at[0]  # B started it only after A had stopped it
    assert (await b.store.get(job.id)) == done  # A's late attempt wrote nothing
