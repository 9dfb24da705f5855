"""The experiments of ``sqlq bench``: one module each, its runs beside its report section.

Every module has ``NAME``, ``ROW`` (the type of its result rows),
``runs(quick, stores, **extra)`` (the runs of one repeat; engines alternate
within it) and ``section(report)``. Adding an experiment is one module and one
line in ``MODULES``.
"""

from __future__ import annotations

from pathlib import Path

from sqlq.bench import report
from sqlq.bench.experiments import (
    a_scaling,
    b_retries,
    c_hangs,
    ceiling,
    d_durability,
    e_crash,
    f_cpu,
    g_recovery,
    h_latency,
    i_disk,
    j_scaleout,
    k_limits,
    l_dashboard,
    m_queues,
    n_schedules,
    o_progress,
    p_remote,
    q_redis,
    r_release,
    s_fair,
)
from sqlq.bench.experiments.answer import answer
from sqlq.bench.experiments.base import BenchRun

MODULES = (
    ceiling, a_scaling, b_retries, c_hangs, d_durability, e_crash, f_cpu, g_recovery, h_latency,
    i_disk,
    j_scaleout,
    k_limits,
    l_dashboard,
    m_queues,
    n_schedules,
    o_progress,
    p_remote,
    q_redis,
    r_release,
    s_fair,
)  # fmt: skip
EXPERIMENTS = {m.NAME: m for m in MODULES}
ORDER = tuple(EXPERIMENTS)  # the suite runs them in this order; the report shows them so

__all__ = ["EXPERIMENTS", "ORDER", "BenchRun", "build_report"]


def build_report(out: Path, *, before: bool = False) -> str:
    """Rebuild ``out/REPORT.md`` and its plots from ``out/*.jsonl`` (``before``: with the
    older trees' ``*-before.jsonl`` beside this tree's rows, see ``report.Report``)."""
    return report.build(out, MODULES, answer, before=before)
