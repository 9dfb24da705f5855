"""The runtime's bounds and counts: max queues and queued, the census, metrics series."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sqlq.common.backoff import RetryPolicy
from sqlq.common.clock import FakeClock
from sqlq.common.models import State
from sqlq.common.store import JobQuery
from tests.helpers import NOW, ServiceFactory, final, submit, wait_for
from tests.runtime_helpers import _http


async def test_max_queues_counts_names_with_live_jobs_and_never_default(
    services: ServiceFactory,
) -> None:
    rt = services(max_queues=3)
    await rt.start()
    async with await _http(rt) as c:
        later = {"kind": "sleep", "delay_ms": 3_600_000}
        a = await c.post("/jobs", json={**later, "queue": "a"})
        assert a.status_code == 201
        assert (await c.post("/jobs", json={**later, "queue": "b"})).status_code == 201
        # a pause of a name that holds nothing is kept, but it takes no queue's room
        assert (await c.post("/queues/p/pause")).status_code == 200
        assert (await c.post("/jobs", json={**later, "queue": "c"})).status_code == 201
        r = await c.post("/jobs", json={**later, "queue": "d"})
        assert (r.status_code, r.json()["field"]) == (422, "queue")
        assert "--max-queues (3)" in r.json()["message"]
        r = await c.post("/jobs", json={**later, "queue": "p"})  # a job makes it count
        assert (r.status_code, r.json()["field"]) == (422, "queue")
        r = await c.post("/jobs/batch", json={"jobs": [{**later, "queue": "a"},
                                                        {**later, "queue": "d"}]})  # fmt: skip
        assert (r.status_code, r.json()["field"]) == (422, "jobs[1].queue")
        assert (await c.post("/jobs", json=later)).status_code == 201  # default: never counted
        assert (await c.post("/jobs", json={**later, "queue": "a"})).status_code == 201
        assert (await c.post("/queues/a/pause")).status_code == 200
        assert rt.stats()["queues_used"] == 3
        for job in await rt.list_jobs(JobQuery(queue="b")):
            await rt.cancel(job.id)  # b has no live job left: a slot is free
        assert (await c.post("/jobs", json={**later, "queue": "d"})).status_code == 201
        assert (await c.post("/queues/p/resume")).status_code == 200


async def test_retries_count_against_max_queues_and_max_queued(services: ServiceFactory) -> None:
    """A retry makes jobs live again, perhaps in queues nothing else uses: the same bounds
    as a submission hold (review found six queues and six live jobs past limits of 2 and 3)."""
    rt = services(max_queues=2, max_queued=3, workers=0)  # a retried job is due: none runs
    await rt.start()
    later = {"kind": "sleep", "delay_ms": 3_600_000}
    async with await _http(rt) as c:
        ids = {}
        for q in "abcdef":
            ids[q] = (await c.post("/jobs", json={**later, "queue": q})).json()["id"]
            assert (await c.delete(f"/jobs/{ids[q]}")).status_code == 200
        r = await c.post("/jobs/retry", json={"state": "cancelled"})  # six live: past 3
        assert r.status_code == 429
        assert (await c.post(f"/jobs/{ids['a']}/retry")).status_code == 200
        assert (await c.post(f"/jobs/{ids['b']}/retry")).status_code == 200
        r = await c.post(f"/jobs/{ids['c']}/retry")  # a third queue
        assert (r.status_code, r.json()["field"]) == (422, "queue")
        assert (await c.post("/jobs", json={**later, "queue": "a"})).status_code == 201
        assert len(rt.live) == 3
        r = await c.post("/jobs/retry", json={"state": "cancelled", "queue": "a"})
        assert (r.status_code, r.json()["retried"]) == (200, 0)  # nothing left to retry in a
        r = await c.post("/jobs", json={**later, "queue": "b"})
        assert r.status_code == 429
    assert rt.stats()["queues_used"] == 2
    assert len(rt.live) == 3


async def test_the_census_is_kept_as_jobs_move_with_no_entry_for_an_empty_queue(
    services: ServiceFactory,
) -> None:
    rt = services(workers=2, retry=RetryPolicy(base_s=0.001), max_attempts=2)
    await rt.start()

    def walked() -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        for job in rt.live.jobs.values():
            out[job.state.value, job.queue] = out.get((job.state.value, job.queue), 0) + 1
        return out

    jobs = []
    for i in range(30):
        args = {"work_ms": 2, "fail_prob": 1.0 if i % 3 == 0 else 0.0}
        jobs.append(await submit(rt, queue=f"q{i % 4}", args=args))
    later = await submit(rt, delay_ms=3_600_000, queue="later")
    assert rt.view.census() == walked()
    for job in jobs:
        await final(rt, job.id)
        assert rt.view.census() == walked()
    assert rt.view.census() == {("scheduled", "later"): 1}
    assert set(rt.live.queues) == {"later"}
    await rt.cancel(later.id)
    assert rt.view.census() == {}
    assert not rt.live.queues


async def test_metrics_series_of_an_idle_queue_last_until_the_bound_needs_their_room(
    services: ServiceFactory,
) -> None:
    """A queue that drains between jobs keeps its counters across scrapes (dropping them at
    every scrape reset them, and ``increase`` lost each first increment); only past the
    bound (2 x --max-queues queues) do idle queues' series go, live ones never."""
    rt = services(max_queues=10)  # series for 20 queues at most
    await rt.start()
    stays = await submit(rt, delay_ms=3_600_000, queue="stays")
    for _ in range(3):
        await final(rt, (await submit(rt, queue="bursty")).id)

    def series() -> list[str]:
        text = rt.metrics.exposition().decode()
        return [
            ln for ln in text.splitlines() if ln.startswith(("sqlq_jobs_total", "sqlq_jobs_live"))
        ]

    for _ in range(3):  # idle between scrapes, and still counted whole
        done = [ln for ln in series() if 'queue="bursty"' in ln and 'event="completed"' in ln]
        assert done
        assert done[0].endswith(" 3.0")
    for i in range(40):
        await final(rt, (await submit(rt, queue=f"once{i}")).id)
    again = series()
    assert len(rt.events.queues()) <= 20
    assert any('queue="stays"' in ln and 'event="submitted"' in ln for ln in again)
    assert any(ln.startswith("sqlq_jobs_live") and 'queue="stays"' in ln for ln in again)
    await rt.cancel(stays.id)


async def test_metrics_series_stay_bounded_when_nobody_scrapes(services: ServiceFactory) -> None:
    rt = services(max_queues=10)  # series for 20 queues at most
    await rt.start()
    for i in range(200):
        await final(rt, (await submit(rt, queue=f"once{i}")).id)
    assert len(rt.events.queues()) <= 20


def test_the_max_queues_flag_reaches_the_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    import sqlq.serve
    from sqlq.cli import main

    seen: dict[str, Any] = {}

    async def fake_serve(runtime: Any, opts: Any) -> None:
        seen["runtime"] = runtime

    monkeypatch.setattr(sqlq.serve, "serve", fake_serve)
    r = CliRunner().invoke(main, ["serve", "--store", "memory", "--max-queues", "7"])
    assert r.exit_code == 0, r.output
    assert seen["runtime"].config.max_queues == 7
    r = CliRunner().invoke(main, ["serve", "--store", "memory", "--max-queues", "0"])
    assert r.exit_code == 2
    assert "--max-queues" in r.output


async def test_a_queue_that_ran_jobs_leaves_no_running_entry(services: ServiceFactory) -> None:
    """Queue names are a bound: a queue whose jobs all ended is held nowhere, not even as a
    zero in the running counts (review found one entry left per queue ever run)."""
    rt = services(workers=2)
    await rt.start()
    jobs = [await submit(rt, "sleep", queue=f"q{i}") for i in range(20)]
    for job in jobs:
        await final(rt, job.id)
    await wait_for(lambda: rt.view.backlog() == 0, 10, "every job to leave the view")
    assert not rt.view.running_here()  # the leak lived here


async def test_a_hang_on_the_last_attempt_is_dead_not_requeued_in_stats_and_metrics(
    services: ServiceFactory,
) -> None:
    """ "Requeued" means one thing in /stats and /metrics alike: put back, scheduled. A job
    whose only attempt hangs is dead (review found it counted requeued in both, and dead)."""
    clock = FakeClock(NOW)
    rt = services(clock=clock, workers=1, healthcheck=False, hb_timeout_s=0.2, max_attempts=1)
    await rt.start()
    job = await submit(rt, args={"hang_prob": 1.0})
    await wait_for(lambda: rt.pool.busy() == 1, 5, "the job to start, and hang")
    clock.advance(0.201)
    assert len(rt.pool.check(clock.monotonic())) == 1
    assert (await final(rt, job.id)).state is State.DEAD
    stats = rt.stats()
    assert (stats["requeued_hung"], stats["retried"], stats["jobs"]["dead"]) == (0, 0, 1)
    events = {
        line.split('event="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in rt.metrics.exposition().decode().splitlines()
        if line.startswith("sqlq_jobs_total{")
    }
    assert events == {"submitted": 1.0, "dead": 1.0}


def test_the_principals_that_may_submit_share_max_queues(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--token`` and the token file's admin and submit lines are the shares (#37)."""
    from click.testing import CliRunner

    import sqlq.serve
    from sqlq.cli import main

    seen: dict[str, Any] = {}

    async def fake_serve(runtime: Any, opts: Any) -> None:
        seen["runtime"] = runtime

    monkeypatch.setattr(sqlq.serve, "serve", fake_serve)
    tokens = tmp_path / "tokens"
    tokens.write_text("submit a secret-of-a-0123456\nsubmit b secret-of-b-0123456\n"
                      "worker w secret-of-w-0123456\nread r secret-of-r-0123456\n")  # fmt: skip
    tokens.chmod(0o600)
    r = CliRunner().invoke(main, ["serve", "--store", "memory", "--token-file", str(tokens),
                                  "--token", "admin-secret-0123456789"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert seen["runtime"].config.principals == 3
    r = CliRunner().invoke(main, ["serve", "--store", "memory"])
    assert r.exit_code == 0, r.output
    assert seen["runtime"].config.principals == 1
