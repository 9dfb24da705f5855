"""The report's frame and metadata: the packages read from the code that ran, one tree per
report (older trees' ``*-before.jsonl`` only when asked for), and a run that starts every
file it was asked for afresh. No server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sqlq.bench import meta, runner
from sqlq.bench.experiments import k_limits
from sqlq.bench.report import Report
from sqlq.engines.registry import ENGINES


def test_each_engine_lists_what_its_code_imports() -> None:
    engines = meta.engine_packages()
    assert set(engines) == set(ENGINES)
    assert "aiosqlite" in engines["sqlite"]
    assert "asyncpg" in engines["postgres"]
    for name in ("memory", "walq"):
        assert not {"aiosqlite", "asyncpg"} & set(engines[name]), engines[name]
    assert all("msgspec" in v for v in engines.values())  # the models every engine stores


def test_the_server_packages_are_what_sqlq_imports_not_the_bench() -> None:
    found = meta.versions()
    for name in ("starlette", "uvicorn", "uvloop", "httptools", "msgspec", "aiosqlite"):
        assert name in found, name
    assert found["sqlite"]
    assert "matplotlib" not in found  # the benchmark's own: listed apart
    assert "matplotlib" in meta.bench_packages()


def _meta(commit: str, command: str = "sqlq bench --repeats 3") -> dict[str, Any]:
    return {"git_commit": commit, "command": command, "repeats": 3, "cpu": "cpu", "cores": 2,
            "disk": "disk", "platform": "linux", "python": "3.11.7",
            "packages": {"msgspec": "0.23.0", "sqlite": "3.40.1"},
            "engines": {"walq": ["msgspec"], "sqlite": ["aiosqlite", "msgspec"]},
            "bench_packages": {"matplotlib": "3.11.2"}}  # fmt: skip


def _k(commit: str, cpu_us: float) -> dict[str, Any]:
    return {"experiment": "K", "store": "walq", "label": "K/cpu/walq/batch1", "part": "cpu",
            "jobs": 1000, "cpu_us_per_job": cpu_us, "meta": _meta(commit)}  # fmt: skip


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_report_leaves_older_trees_out_unless_asked(tmp_path: Path) -> None:
    _write(tmp_path / "K.jsonl", [_k("new1234", 100.0)])
    _write(tmp_path / "K-before.jsonl", [_k("old5678", 150.0)])
    rep = Report(tmp_path)
    k_limits.section(rep)
    head = rep.header()
    assert "- every section below ran in this one run, on new1234" in head
    assert any(ln.startswith("- not in this report: K-before.jsonl") for ln in head)
    assert "- each engine's imports: walq: msgspec; sqlite: aiosqlite, msgspec" in head
    assert not any(ln.startswith("| before") for ln in rep.lines)
    assert any(ln.startswith("This tree's run") for ln in rep.lines)

    rep = Report(tmp_path, before=True)
    k_limits.section(rep)
    assert any(ln.startswith("| before |") for ln in rep.lines)
    assert "- K-before ran on its own: git commit old5678, repeats: 3, " \
        "`sqlq bench --repeats 3`" in rep.header()  # fmt: skip


def test_a_section_from_another_run_is_named_in_the_header(tmp_path: Path) -> None:
    from sqlq.bench.experiments import m_queues

    _write(tmp_path / "K.jsonl", [_k("new1234", 100.0)])
    m = {"experiment": "M", "store": "memory", "label": "M", "used": 0, "busy": 1, "jobs": 10,
         "cpu_s": 0.01, "meta": _meta("new1234", "sqlq bench --only M")}  # fmt: skip
    _write(tmp_path / "M.jsonl", [m])
    rep = Report(tmp_path)
    k_limits.section(rep)
    m_queues.section(rep)
    head = rep.header()
    assert not any(ln.startswith("- every section below") for ln in head)
    assert "- M ran on its own: git commit new1234, repeats: 3, `sqlq bench --only M`" in head


def test_a_run_starts_every_file_it_was_asked_for_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stale = tmp_path / "P.jsonl"
    _write(stale, [{"experiment": "P", "meta": _meta("old5678")}])
    monkeypatch.setattr(runner, "plan", lambda *args: [])  # P has no runs this time
    runner.run_suite(only=("P",), stores=("walq",), repeats=1, quick=True, out=tmp_path,
                     show_progress=False)  # fmt: skip
    assert stale.read_text() == ""
