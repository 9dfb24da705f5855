"""The frame of ``results/REPORT.md``: header, bars, answer, then each experiment's section.

Every number in the report is computed from the JSON lines; nothing is typed
in by hand. Each experiment module (``sqlq.bench.experiments``) writes its own
section through a ``Report`` and may leave a typed summary in
``report.summaries`` for the cross-experiment answer. This module imports no
experiment: ``build`` is handed them.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from sqlq.bench.experiments.rows import CodedRow, Row, load

BEFORE = "-before"  # an older tree's run of an experiment: ``<name>-before.jsonl``
R = TypeVar("R", bound=Row)
RB = TypeVar("RB", bound=CodedRow)
K = TypeVar("K")


def med(values: Iterable[float | None]) -> float:
    v = [x for x in values if x is not None]
    return statistics.median(v) if v else float("nan")


def cell(values: Sequence[float | None], fmt: str = "{:,.0f}") -> str:
    """The median, with [min-max] when there are repeats."""
    v = [x for x in values if x is not None]
    if not v:
        return "-"
    if len(v) == 1:
        return fmt.format(v[0])
    return f"{fmt.format(med(v))} [{fmt.format(min(v))}-{fmt.format(max(v))}]"


def group(rows: Iterable[R], key: Callable[[R], K]) -> dict[K, list[R]]:
    out: dict[K, list[R]] = defaultdict(list)
    for r in rows:
        out[key(r)].append(r)
    return out


class Experiment(Protocol):
    """What an experiment module provides (see ``sqlq.bench.experiments``)."""

    NAME: str

    def section(self, rep: Report) -> None: ...


class Report:
    """One build of a report from ``out``'s JSON lines.

    ``before``: also read ``<name>-before.jsonl``, an older tree's run of an experiment,
    into the sections that compare with one (D, K, M). ``REPORT.md`` leaves them out, so
    that every section of it comes from one tree; ``sqlq bench --report-only
    --with-before`` builds a comparison in a directory of its own (see ``bench/cli.py``).
    """

    def __init__(self, out: Path, *, before: bool = False) -> None:
        self.out = out
        self.before = before
        self.plots = out / "plots"
        self.lines: list[str] = []
        self.checks: list[str] = []
        self.summaries: dict[str, Any] = {}  # experiment name -> its typed summary
        self.meta: dict[str, Any] | None = None
        self.metas: dict[str, dict[str, Any]] = {}  # experiment name -> its run's meta

    def rows(self, name: str, row: type[R]) -> list[R]:
        if name.endswith(BEFORE) and not self.before:
            return []
        rows = load(self.out, name, row)
        if rows and self.meta is None and not name.endswith(BEFORE):  # this tree's run
            self.meta = rows[0].meta
        if rows:
            self.metas.setdefault(name, rows[0].meta)
        return rows

    def before_after(self, name: str, row: type[RB]) -> tuple[list[RB], list[str]]:
        """``name``'s rows with those of ``<name>-before`` (the same experiment run on the
        tree before a change, its code set to "before"), and the codes, "before" first."""
        before = self.rows(f"{name}-before", row)
        for r in before:
            r.code = "before"
        rows = before + self.rows(name, row)
        return rows, sorted({r.code for r in rows}, key=lambda c: (c != "before", c))

    def add(self, *lines: str) -> None:
        self.lines.extend(lines)

    def check(self, what: str, value: str, met: bool, bar: str) -> None:
        self.checks.append(f"{what}: {value} ({bar}: {'met' if met else 'NOT met'})")

    def plot(self, name: str, draw: Callable[[Any], None]) -> None:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return
        self.plots.mkdir(exist_ok=True)
        fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
        draw(ax)
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(self.plots / f"{name}.png")
        plt.close(fig)
        self.add("", f"![{name}](plots/{name}.png)", "")

    @property
    def cores(self) -> str:
        return str(self.meta.get("cores", "?")) if self.meta else "?"

    def header(self) -> list[str]:
        lines = [
            "# sqlq benchmark report",
            "",
            "Produced by `sqlq bench` from the `*.jsonl` files beside it (`sqlq bench "
            "--report-only` rebuilds it); no number here was typed by hand. The machine is "
            "shared, so absolute numbers drift between runs: read the engines side by side "
            "within this run. Cells are medians with [min-max] over the repeats.",
            "",
        ]
        if self.meta is not None:
            m = self.meta
            pk = ", ".join(f"{k} {v}" for k, v in m["packages"].items())
            lines += [
                f"- machine: {m['cpu']}, {m['cores']} cores; data disk {m['disk']}; "
                f"{m['platform']}",
                f"- Python {m['python']}; "
                + (f"`sqlq serve` imports {pk}" if "engines" in m else pk),
            ]
            if "engines" in m:  # read from the code that ran (bench/meta.py)
                engines = "; ".join(
                    f"{k}: {', '.join(v) or 'none'}" for k, v in m["engines"].items()
                )
                bench = ", ".join(f"{k} {v}" for k, v in m.get("bench_packages", {}).items())
                lines += [f"- each engine's imports: {engines}", f"- bench and peers: {bench}"]
            lines += [
                f"- git commit {m['git_commit']}; repeats: {m.get('repeats', '?')}"
                f"{' (QUICK smoke run: sizes are tiny)' if m.get('quick') else ''}",
                f"- command: `{m['command']}`",
                "- every run: a fresh `sqlq serve` subprocess, a fresh data directory, "
                "`--sync full` unless stated; engines alternate within each repeat",
            ]
            apart = {n: o for n, o in self.metas.items() if not _same_run(o, m)}
            if not apart:
                lines.append(f"- every section below ran in this one run, on {m['git_commit']}")
            for name, other in apart.items():  # experiments run on their own since
                elsewhere = other.get("cpu") != m.get("cpu")  # (the machine of another day)
                lines.append(
                    f"- {name} ran on its own: git commit {other.get('git_commit', '?')}, "
                    f"repeats: {other.get('repeats', '?')}, `{other.get('command', '?')}`"
                    + (f", on {other.get('cpu', '?')}" if elsewhere else "")
                )
            left = sorted(p.name for p in self.out.glob(f"*{BEFORE}.jsonl"))
            if left and not self.before:
                lines.append(
                    f"- not in this report: {', '.join(left)}, older trees' runs (a "
                    "comparison with an older tree is built apart: `sqlq bench --report-only "
                    "--with-before`)"
                )
            lines.append("")
        return lines


def _same_run(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two rows' metadata from one ``sqlq bench`` invocation: the same tree and command."""
    return a.get("git_commit") == b.get("git_commit") and a.get("command") == b.get("command")


def build(
    out: Path,
    experiments: Sequence[Experiment],
    answer: Callable[[Report], list[str]],
    *,
    before: bool = False,
) -> str:
    """Write ``out/REPORT.md``: header, the bars, the answer, then every section
    (``before``: with older trees' runs beside, see ``Report``)."""
    rep = Report(out, before=before)
    for experiment in experiments:
        experiment.section(rep)
    body = rep.lines
    checks = ["## Against the bars", "", *(f"- {c}" for c in rep.checks), ""]
    text = "\n".join([*rep.header(), *checks, *answer(rep), *body]) + "\n"
    (out / "REPORT.md").write_text(text)
    return text
