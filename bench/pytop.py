"""The Python side of a no-op job, side by side: calls per job, from cProfile dumps.

    python -m sqlq.bench.pytop --jobs 20000 NAME=PSTATS ... > results/profile-X-python.md

``cgtop`` counts instructions, but callgrind sees only the interpreter's C functions, so
it cannot say which Python function spent them. cProfile can, at the price of slowing
every call alike: its times are skewed toward code that makes many calls, but its call
counts are exact. Each dump is a server (``python -m cProfile -o PSTATS -m sqlq serve``)
that ran ``--jobs`` no-op jobs; the table gives, per job, the calls to each function of
sqlq's own (and the frameworks' under it) in the first dump and the last, and the share
of the profiled time each spent itself. A function a change removed reads 0.
"""

from __future__ import annotations

import argparse
import pstats
from collections import Counter
from pathlib import Path


def where(file: str) -> str:
    """``file`` as the table names it: its last folder and its name (``runtime/live.py``),
    the same in every tree whatever its layout (an older tree's package root was
    ``common/``; this one's is ``sqlq/``), so one function's rows line up across trees."""
    if file == "~":
        return "builtins"
    return "/".join(file.rsplit("/", 2)[-2:])


def per_job(path: Path, jobs: int) -> tuple[Counter[str], Counter[str], float]:
    """Calls per job and own seconds by ``file:function``, and the profile's total time."""
    stats = pstats.Stats(str(path))
    calls: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for (file, _line, name), (_, ncalls, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        key = f"{where(file)}:{name}"
        calls[key] += ncalls / jobs
        own[key] += tottime
    return calls, own, float(stats.total_tt)  # type: ignore[attr-defined]


def table(dumps: list[tuple[str, Path]], jobs: int, top: int) -> str:
    read = [(name, *per_job(path, jobs)) for name, path in dumps]
    lines = [
        "Calls per job (cProfile, exact) and each function's own share of the profiled time "
        f"(skewed toward many small calls), over {jobs:,} jobs each. Produced by "
        "`python -m sqlq.bench.pytop`; do not edit by hand.",
        "",
        "| | " + " | ".join(name for name, *_ in read) + " |",
        "|---|" + "---:|" * len(read),
        "| **Python calls a job** | "
        + " | ".join(f"{sum(c.values()):,.1f}" for _, c, _, _ in read)
        + " |",
    ]
    first, last = read[0], read[-1]
    chosen: list[str] = []  # the costliest of the first dump, then of the last
    for _, calls, own, _total in (first, last):
        picked = [key for key, _ in own.most_common() if calls[key] >= 0.5][:top]
        chosen += [key for key in picked if key not in chosen]
    lines += [
        "",
        "| function | " + " | ".join(f"{name} calls/job (time %)" for name, *_ in read) + " |",
        "|---|" + "---:|" * len(read),
    ]
    for key in chosen:
        cells = [
            f"{calls[key]:.2f} ({100 * own[key] / total:.1f})" if calls[key] else "0"
            for _, calls, own, total in read
        ]
        lines.append(f"| `{key}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--jobs", type=int, required=True, help="the jobs each dump ran")
    parser.add_argument("--top", type=int, default=30, help="functions in the table")
    parser.add_argument("dumps", nargs="+", metavar="NAME=PSTATS")
    args = parser.parse_args()
    dumps = []
    for item in args.dumps:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            parser.error(f"a dump is NAME=PSTATS, not {item!r}")
        dumps.append((name, Path(path)))
    print(table(dumps, args.jobs, args.top), end="")


if __name__ == "__main__":
    main()
