"""The top of callgrind dumps, side by side: where a no-op job's instructions go.

    python -m sqlq.bench.cgtop --jobs 2000 NAME=DUMP[.gz] ... > results/profile-X.md

Each dump is a server counted over ``--jobs`` jobs (``versus`` zeroes the counters after
a warm-up and dumps after the measured jobs); the table gives each one's instructions
per job, by shared object (Python's interpreter, SQLite, libc, msgspec, ...) and by the
functions that cost most in the first dump and the last, each an exclusive count (what
the function itself ran, not what it called). Python functions are not named here:
callgrind sees the interpreter's C functions. It is read as the calls' parser reads it,
from the format's ``ob=``/``fn=`` lines and cost lines, a call's inclusive cost left out.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import re
from pathlib import Path

_NAMED = re.compile(r"\((\d+)\)(?: (.*))?")


def exclusive(path: Path) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """A dump's exclusive instructions by shared object and by ``object:function``."""
    opener = gzip.open if path.suffix == ".gz" else open
    names: dict[str, dict[str, str]] = {"ob": {}, "fn": {}}
    ob = fn = "?"
    by_ob: collections.Counter[str] = collections.Counter()
    by_fn: collections.Counter[str] = collections.Counter()
    call_cost_next = False

    def named(kind: str, value: str) -> str:
        m = _NAMED.match(value)
        if m is None:
            return value
        if m.group(2):
            names[kind][m.group(1)] = m.group(2)
        return names[kind].get(m.group(1), m.group(1))

    with opener(path, "rt") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            head = line.split("=", 1)[0]
            if head == "ob":
                ob = named("ob", line[3:])
            elif head == "fn":
                fn = named("fn", line[3:])
            elif head in ("cob", "cfn"):
                named(head[1:], line[4:])
            elif head == "calls":
                call_cost_next = True
            elif line[0].isdigit() or line[0] in "+-*":
                parts = line.split()
                if call_cost_next:  # a call's inclusive cost: the callee's, not this one's
                    call_cost_next = False
                    continue
                if len(parts) >= 2:
                    cost = int(parts[1])
                    short = ob.rsplit("/", 1)[-1]
                    by_ob[short] += cost
                    by_fn[f"{short}:{fn}"] += cost
    return by_ob, by_fn


def table(dumps: list[tuple[str, Path]], jobs: int, top: int) -> str:
    counted = [(name, *exclusive(path)) for name, path in dumps]
    names = [name for name, _, _ in counted]
    lines = [
        f"Instructions per job (callgrind, exclusive), over {jobs:,} jobs each. "
        "Produced by `python -m sqlq.bench.cgtop`; do not edit by hand.",
        "",
        "| | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
        "| **total** | "
        + " | ".join(f"{sum(ob.values()) / jobs:,.0f}" for _, ob, _ in counted)
        + " |",
    ]
    objects = collections.Counter[str]()
    for _, ob, _ in counted:
        objects.update(ob)
    for obj, _ in objects.most_common(8):
        lines.append(f"| {obj} | " + " | ".join(f"{ob[obj] / jobs:,.0f}" for _, ob, _ in counted)
                     + " |")  # fmt: skip
    lines += ["", "| function | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    chosen = dict.fromkeys(
        [f for f, _ in counted[0][2].most_common(top)]
        + [f for f, _ in counted[-1][2].most_common(top)]
    )
    for f in chosen:
        lines.append(f"| `{f}` | " + " | ".join(f"{fns[f] / jobs:,.0f}" for _, _, fns in counted)
                     + " |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("dumps", nargs="+", metavar="NAME=DUMP")
    p.add_argument("--jobs", type=int, required=True, help="the jobs each dump counted")
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args()
    dumps = []
    for given in args.dumps:
        name, sep, path = given.partition("=")
        if not sep:
            p.error(f"{given}: give NAME=DUMP")
        dumps.append((name, Path(path)))
    print(table(dumps, args.jobs, args.top), end="")


if __name__ == "__main__":
    main()
