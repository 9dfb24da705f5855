"""Experiment Q, the Redis queues side by side: its quick run end to end against a real
``redis-server`` (started by the bench) with one peer, dramatiq, beside sqlq on walq; the
rows carry what the report reads, and the section shows each row's durability and ratio."""

from __future__ import annotations

import shutil
from pathlib import Path

from sqlq.bench.experiments import EXPERIMENTS, q_redis
from sqlq.bench.experiments.q_redis import QRow
from sqlq.bench.redispeers import available
from sqlq.bench.report import Report
from sqlq.bench.runner import run_suite
from tests.helpers import section_of


def test_q_is_registered() -> None:
    assert EXPERIMENTS["Q"] is q_redis


def test_quick_run_against_a_real_redis(tmp_path: Path) -> None:
    assert shutil.which("redis-server"), ".ci/run installs redis-server"
    assert "dramatiq" in available(), "the test extra brings sqlq[redis-peers]"
    run_suite(only=("Q",), stores=("walq",), repeats=1, quick=True, out=tmp_path,
              extra={"Q": {"peers": ("dramatiq",)}}, show_progress=False)  # fmt: skip
    rows = Report(tmp_path).rows("Q", QRow)
    got = {(r.store, r.part, r.level) for r in rows}
    assert got == {(s, p, lv) for s in ("walq", "dramatiq") for p in ("noop", "sleep")
                   for lv in ("full", "os")}  # fmt: skip
    for r in rows:
        assert r.completed == r.jobs, r.label  # every job ran, once counted
        assert r.span_s > 0, r.label
        assert r.jobs_per_s is not None, r.label
        assert r.cpu_s >= 0, r.label  # (sqlq's quick rows can be under a clock tick)
        assert r.meta["quick"] is True
        assert r.meta["git_commit"]
    peer = {r.level: r for r in rows if r.store == "dramatiq" and r.part == "noop"}
    assert "appendfsync always" in peer["full"].durability
    assert "appendfsync everysec" in peer["os"].durability
    assert peer["full"].cpu_s > 0  # the processes' CPU was read
    assert peer["full"].broker_cpu_s > 0
    assert peer["full"].version
    sq = {r.level: r for r in rows if r.store == "walq" and r.part == "noop"}
    assert sq["full"].durability.endswith("--sync full")
    assert sq["os"].durability.endswith("--sync os")
    rep = Report(tmp_path)
    q_redis.section(rep)
    text = "\n".join(rep.lines)
    assert "## Q. The Redis queues side by side" in text
    assert "| dramatiq " in text
    assert "| sqlq (walq) | " in text


def test_kill_rows_are_reported(tmp_path: Path) -> None:
    base = {"experiment": "Q", "part": "kill", "level": "full", "jobs": 1000,
            "acknowledged": 1000, "meta": {"git_commit": "abc1234"}}  # fmt: skip
    rows = [
        {**base, "store": "walq", "label": "Q/kill/walq", "target": "server",
         "durability": "sqlq serve --store walq --sync full", "completed": 1000},
        {**base, "store": "celery", "label": "Q/kill/celery/worker", "target": "worker",
         "durability": "redis", "completed": 970, "lost": 30, "held": 64},
    ]  # fmt: skip
    rep = section_of(tmp_path, q_redis, rows)
    text = "\n".join(rep.lines)
    assert "| sqlq (walq) | server | 1,000 | 1,000 | 0 | 0 | 0 | 0 |" in text
    assert "| celery | worker | 1,000 | 970 | 30 | 64 | 0 | 0 |" in text
