"""The fair crash trial's audit (``sqlq.bench.fairaudit``) catches what it is there to catch:
a start past the rate in a window, a start that no fair round counted, a refill that
never started or waited past a poll, a key running past its limit. On a real PostgreSQL,
through the same trigger the crash trial installs, with the fair queue's own claims."""

from __future__ import annotations

import time

import asyncpg

from sqlq.bench import fairaudit
from sqlq.bench.fairaudit import CONCURRENCY, POLICY, QUEUE, RATE, most_in_window
from sqlq.common.fair import starts_bound
from sqlq.common.models import Job
from sqlq.engines.postgres.store import PostgresStore


def test_most_in_a_window_counts_closed_windows() -> None:
    assert most_in_window([], 1.0) == 0
    assert most_in_window([0.0, 0.5, 1.0, 1.01, 3.0], 1.0) == 3  # [0, 1] and [0.5, 1.5]
    assert most_in_window([0.0, 2.0, 4.0], 1.0) == 1


async def _starts(dsn: str, rows: list[tuple[str, str | None, float | None]]) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.executemany("INSERT INTO fair_starts (id, key, epoch, at) "
                               "VALUES ($1, $2, 1, $3)", rows)  # fmt: skip
    finally:
        await conn.close()


async def test_the_audit_records_a_fair_claims_starts_at_its_rounds_clock(pg_db: str) -> None:
    await fairaudit.install(pg_db)
    store = PostgresStore(pg_db)
    await store.open()
    try:
        await store.set_queue_policy(QUEUE, POLICY)
        jobs = [Job.new(kind="k", args=None, now=time.time(), queue=QUEUE, key="A")
                for _ in range(9)]  # fmt: skip
        await store.commit(jobs)
        before = time.time()
        got = await store.claim(9, time.time(), time.time() + 30, {}, policies={QUEUE: POLICY})
        after = time.time()
    finally:
        await store.close()
    assert len(got) == min(RATE.burst, CONCURRENCY)
    judged = await fairaudit.judge(pg_db, {"A": len(got)}, 1, [])
    assert judged["fair_problems"] == []
    assert judged["fair_starts"] == len(got)
    conn = await asyncpg.connect(pg_db)
    try:
        ats = [r[0] for r in await conn.fetch("SELECT at FROM fair_starts")]
    finally:
        await conn.close()
    assert all(before - 1 <= at <= after + 1 for at in ats)  # the database's clock, one round
    assert len(set(ats)) == 1


async def test_the_audit_finds_a_start_past_the_rate_and_a_start_outside_a_round(
    pg_db: str,
) -> None:
    await fairaudit.install(pg_db)
    bound = starts_bound(RATE, 1.0)
    await _starts(pg_db, [(f"a{i}", "A", 100.0 + i * 0.001) for i in range(bound + 1)])
    await _starts(pg_db, [("b", "B", None)])
    judged = await fairaudit.judge(pg_db, {"A": CONCURRENCY + 1}, 0, ["never"])
    problems = " | ".join(judged["fair_problems"])
    assert f"more than {bound} starts in a 1 s window: {{'A': {bound + 1}}}" in problems
    assert "1 starts of the fair queue outside a fair round" in problems
    assert f"more than {CONCURRENCY} of a key running at once" in problems
    assert "no sample" in problems
    assert "1 of key R's refills never started" in problems


async def test_the_audit_finds_a_refill_that_waited_past_a_poll(pg_db: str) -> None:
    await fairaudit.install(pg_db)
    store = PostgresStore(pg_db)
    await store.open()
    try:
        job = Job.new(kind="k", args=None, now=1000.0, queue=QUEUE, key="R")
        await store.commit([job])
    finally:
        await store.close()
    await _starts(pg_db, [(job.id, "R", 1000.0 + fairaudit.POLL_S + 0.5)])
    judged = await fairaudit.judge(pg_db, {}, 1, [job.id])
    assert judged["fair_problems"] == ["1 of key R's refills waited past a poll (1 s), "
                                       "the longest 1.500 s"]  # fmt: skip


def test_the_crash_report_shows_the_fair_trials_maxima_against_their_bounds() -> None:
    from sqlq.bench.crashreport import _fair_section

    def row(most_1s: int, peak: int, ok: bool, wait: float | None) -> dict[str, object]:
        return {"fair_policy": {"key_concurrency": 3, "rate": {"per_s": 100.0, "burst": 5}},
                "fair_starts_bound": {"1s": 105, "10s": 1005}, "fair_starts": 1000,
                "fair_most_starts": {"1s": {"A": most_1s, "R": 9}, "10s": {"A": 700}},
                "fair_peak_running": {"A": peak}, "fair_samples": 10, "fair_refills": 4,
                "fair_refill_wait_p50_s": wait, "fair_refill_wait_max_s": wait,
                "ok": ok}  # fmt: skip

    lines = _fair_section([[row(104, 3, True, 0.01), row(101, 2, False, None)]])
    table = [line for line in lines if line.startswith("| 2 |")]
    assert table == ["| 2 | 2,000 | 104 | 700 | 3 | 20 | 8 | 0.010 / 0.010 | 1 |"]
    assert "(bound 105)" in "\n".join(lines)
    assert _fair_section([]) == []


def test_the_fair_workload_on_one_node_is_refused_naming_the_flag() -> None:
    from click.testing import CliRunner

    from sqlq.bench.cli import crashcheck

    for args in (["--store", "walq"], ["--store", "postgres", "--remote-workers"]):
        result = CliRunner().invoke(crashcheck, [*args, "--workload", "fair"])
        assert result.exit_code == 2
        assert "--workload fair" in result.output
        assert "--store postgres" in result.output
        assert "Traceback" not in result.output
