"""Server CPU per no-op job, this tree against another tree, side by side in one run.

A refactor's bar is "no slower than before": this measures it the way the house
asks, as a ratio of two servers run alternately on the same machine in the same
minutes, so the load the machine carries from elsewhere falls on both. Each repeat
runs, for every engine, both trees (in alternating order) on a fresh server: N
no-op jobs by single POST from 32 clients, 64 workers, ``--sync full`` (K's cpu
part). The server's own CPU (all threads, from ``/stats``) over the jobs is the
figure; the ratio is taken within a repeat, and the table shows medians.

    python -m sqlq.bench.versus --baseline d0c6235 --instructions --floor --out results

``--baseline COMMIT`` is the other tree: a commit of this repository, checked out
(``git worktree``) with an environment of its own under ``BASELINES`` the first time
it is named, and reused after. A change is judged against a fixed baseline, not the
commit before it: each capability's "within 5 % of before" passed, and their sum did
not (#35 keeps ``BASELINE``, d0c6235). ``--other`` is the interpreter of any other
tree's environment (an editable install of it) instead; this tree's is the one
running this script. Writes ``versus.jsonl`` and ``versus.md``.

``--floor`` adds the bare POST on the same stack (``sqlq.bench.trivial``: uvicorn,
uvloop and httptools answering 201, no framework, no work), measured the same way,
so each engine's row also reads as a multiple of what any request costs here.

``--instructions`` counts instructions instead of seconds: each server runs under
valgrind's callgrind, whose counters are zeroed after ``WARM_JOBS`` jobs and read
after the measured ones (all threads), so the figure is the server's instructions
per job. A count does not drift with what else the machine runs, as CPU seconds on a
shared machine do by 5-10 % between runs; it is no measure of time either (a cache
miss counts as one instruction), so it says whether a change added work, and the
seconds say what it costs. The count still holds work that grows with wall time (the
load's ``/stats`` polls, the server's timers), so it is not free of the machine's speed
entirely; on PostgreSQL it counts ``sqlq serve`` only, not the database. Writes
``versus-instructions.jsonl`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sqlq.bench import meta
from sqlq.bench.client.loadgen import run
from sqlq.bench.client.server import ServerProcess
from sqlq.bench.pgcluster import Cluster, make_cluster
from sqlq.engines.registry import ALL, engine

THIS, OTHER, FLOOR = "this", "other", "floor"
BASELINE = "d0c6235"  # #35's: the tree before schedules, the running job and remote workers
BASELINES = Path(tempfile.gettempdir()) / "sqlq-baselines"  # a worktree and venv each
REPO = Path(__file__).resolve().parent.parent
FIGURE = {False: "cpu_us_per_job", True: "instructions_per_job"}  # a row's figure, by mode
UNIT = {False: "us/job", True: "instructions/job"}


def tree_commit(python: str) -> str:
    """The git commit of the tree that ``python``'s environment runs sqlq from."""
    code = "import pathlib, sqlq; print(pathlib.Path(sqlq.__file__).resolve().parent.parent)"
    root = subprocess.run([python, "-P", "-c", code], capture_output=True, text=True, check=True)
    out = subprocess.run(
        ["git", "-C", root.stdout.strip(), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() or "unknown"


WARM_JOBS = 2000  # --instructions: run before the counters are zeroed (imports, caches, and
# SQLite's prepared statements: one per batch size, each parsed the first time it is seen)
CALLGRIND_READY_S = 300.0  # a server under callgrind starts ~50x slower
CALLGRIND_DRAIN_S = 1200.0  # and drains ~50x slower


def _all_done(result: dict[str, Any], jobs: int, drain: bool = True) -> None:
    """A count is divided by ``jobs``: every one must have been taken (and, with ``drain``,
    finished)."""
    done = int(result["done"]) + int(result["dead"])
    if result["submit_errors"] or result["acknowledged"] != jobs or (drain and done != jobs):
        raise RuntimeError(f"{jobs} jobs asked: {result['acknowledged']} acknowledged, "
                           f"{done} finished, {result['submit_errors']} submit errors")  # fmt: skip


def callgrind_total(path: Path) -> int:
    """The instructions a callgrind dump counted (its ``summary:`` or ``totals:`` line)."""
    for line in path.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise ValueError(f"{path}: no totals in this callgrind dump")


def one(
    python: str,
    store: str,
    jobs: int,
    cluster: Cluster | None,
    instructions: bool = False,
    warm: int = WARM_JOBS,
) -> float:
    """Server CPU (us) per no-op job on a fresh ``store`` server run by ``python``; with
    ``instructions``, its instructions per job under callgrind instead, after ``warm``."""
    flags: tuple[str, ...] = ()
    if engine(store).shared:
        assert cluster is not None
        # Empty, then migrated by the tree that runs on it: a database at this tree's schema
        # is newer than an older tree's, which refuses it.
        name = cluster.create_database().rsplit("/", 1)[1]
        dsn = cluster.recycle(name, migrated=False)
        subprocess.run([python, "-m", "sqlq", "migrate", "--dsn", dsn], check=True,
                       capture_output=True, env={**os.environ, "PYTHONSAFEPATH": "1"})  # fmt: skip
        flags = ("--dsn", dsn)
    ready = CALLGRIND_READY_S if instructions else 120.0
    srv = ServerProcess.engine(store=store, workers=64, flags=flags, ready_within=ready)
    srv.cmd = [python, *srv.cmd[1:]]
    srv.env["PYTHONSAFEPATH"] = "1"  # the tree its environment installs, not the one in cwd
    if not instructions:
        with srv:
            result = run(srv.url, jobs=jobs, work_ms=0, concurrency=32, batch=1, label=store)
        return 1e6 * float(result["server_cpu_s"]) / jobs
    return counted(srv, jobs, warm)


def counted(srv: ServerProcess, jobs: int, warm: int, *, drain: bool = True) -> float:
    """``srv`` under callgrind: its instructions per no-op job over ``jobs`` single POSTs
    from 32 clients, counted after ``warm`` (``drain``: each job also run to its end, as
    the server's workers take them; without, a job is its POST and its commit)."""
    with tempfile.TemporaryDirectory(prefix="sqlq-callgrind-") as d:
        out = Path(d) / "callgrind.out"
        srv.cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *srv.cmd]
        with srv:
            assert srv.proc is not None
            pid = str(srv.proc.pid)
            load: dict[str, Any] = {"concurrency": 32, "batch": 1, "label": srv.store,
                                    "fetch_jobs": False, "drain": drain,
                                    "drain_timeout": CALLGRIND_DRAIN_S}  # fmt: skip
            _all_done(run(srv.url, jobs=warm, work_ms=0, **load), warm, drain)
            subprocess.run(["callgrind_control", "-z", pid], check=True, capture_output=True)
            _all_done(run(srv.url, jobs=jobs, work_ms=0, **load), jobs, drain)
            subprocess.run(["callgrind_control", "-d", pid], check=True, capture_output=True)
        return callgrind_total(Path(f"{out}.1")) / jobs


def baseline_python(commit: str) -> str:
    """The interpreter of ``commit``'s own environment: its tree checked out under
    ``BASELINES`` and installed (``.[bench]``) the first time, reused after."""
    full = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{commit}^{{commit}}"],
                          capture_output=True, text=True)  # fmt: skip
    if full.returncode != 0:
        raise SystemExit(f"--baseline {commit}: no such commit in {REPO}")
    tree = BASELINES / full.stdout.strip()[:12]
    python = tree / ".venv" / "bin" / "python"
    if python.exists():
        return str(python)
    BASELINES.mkdir(parents=True, exist_ok=True)
    if not tree.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree),
                        full.stdout.strip()], check=True, capture_output=True)  # fmt: skip
    subprocess.run([sys.executable, "-m", "venv", str(tree / ".venv")], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", f"{tree}[bench]"],
                   check=True)  # fmt: skip
    return str(python)


def floor_one(jobs: int, instructions: bool, warm: int = WARM_JOBS) -> float:
    """The bare POST (``sqlq.bench.trivial``) as ``one`` measures a job: its CPU (us) or,
    with ``instructions``, its instructions per request under callgrind after ``warm``."""
    import uvloop

    from sqlq.bench.client.loadgen import job_body, run_load
    from sqlq.bench.client.server import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    body = job_body(0, 0.0, 0.0, "sleep", 0)
    load: dict[str, Any] = {"concurrency": 32, "body": body, "drain": False}
    with tempfile.TemporaryDirectory(prefix="sqlq-floor-") as d:
        out = Path(d) / "callgrind.out"
        cmd = [sys.executable, "-m", "sqlq.bench.trivial", str(port)]
        if instructions:
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *cmd]
        proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
        try:
            _answering(url, CALLGRIND_READY_S if instructions else 60.0)
            if instructions:
                uvloop.run(run_load(url, jobs=warm, **load))
                subprocess.run(["callgrind_control", "-z", str(proc.pid)], check=True,
                               capture_output=True)  # fmt: skip
            else:
                cpu0 = _cpu_s(proc.pid)
            got = uvloop.run(run_load(url, jobs=jobs, **load))
            if got["acknowledged"] != jobs:
                raise RuntimeError(f"the floor answered {got['acknowledged']} of {jobs}")
            if instructions:
                subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True,
                               capture_output=True)  # fmt: skip
                return callgrind_total(Path(f"{out}.1")) / jobs
            return 1e6 * (_cpu_s(proc.pid) - cpu0) / jobs
        finally:
            proc.terminate()
            proc.wait()


def _answering(url: str, within: float) -> None:
    import time
    import urllib.request

    deadline = time.monotonic() + within
    while True:
        try:
            urllib.request.urlopen(urllib.request.Request(url + "/jobs", b"{}"), timeout=5)
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _cpu_s(pid: int) -> float:
    """A process's CPU seconds so far (user + system, all threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    other: str,
    stores: list[str],
    jobs: int,
    repeats: int,
    instructions: bool = False,
    floor: bool = False,
) -> list[dict[str, Any]]:
    cluster = make_cluster() if any(engine(s).shared for s in stores) else None
    pythons = {THIS: sys.executable, OTHER: other}
    rows: list[dict[str, Any]] = []
    try:
        for repeat in range(repeats):
            if floor:
                got = floor_one(jobs, instructions)
                rows.append({"store": FLOOR, "tree": FLOOR, "repeat": repeat, "jobs": jobs,
                             FIGURE[instructions]: round(got, 2)})  # fmt: skip
                print(f"repeat {repeat} {FLOOR:8} {'':5} {got:10.1f} {UNIT[instructions]}",
                      flush=True)  # fmt: skip
            for store in stores:
                order = (THIS, OTHER) if repeat % 2 == 0 else (OTHER, THIS)
                for tree in order:
                    got = one(pythons[tree], store, jobs, cluster, instructions)
                    row = {"store": store, "tree": tree, "repeat": repeat, "jobs": jobs}
                    row[FIGURE[instructions]] = round(got, 2)
                    rows.append(row)
                    print(f"repeat {repeat} {store:8} {tree:5} {got:10.1f} {UNIT[instructions]}",
                          flush=True)  # fmt: skip
    finally:
        if cluster is not None:
            cluster.end()
    return rows


def report(rows: list[dict[str, Any]]) -> str:
    runs = {json.dumps(r["meta"], sort_keys=True): r["meta"] for r in rows}
    counted = FIGURE[True] in rows[0]
    figure, unit = FIGURE[counted], UNIT[counted]
    lines = [
        "# Server " + ("instructions" if counted else "CPU") + " per no-op job: this tree "
        "against another, side by side",
        "",
        "Produced by `python -m sqlq.bench.versus"
        + (" --instructions" if counted else "")
        + "`; do not edit by hand. Each repeat runs "
        f"both trees on every engine, in alternating order: {rows[0]['jobs']:,} no-op jobs "
        "by single POST from 32 clients, 64 workers, `--sync full`, a fresh server each. "
        + (
            f"Counted by callgrind over every thread of the server, after {WARM_JOBS} jobs "
            "that are not counted; a count, not a time (how group commit batches still moves "
            "it by a few per cent between runs). "
            if counted
            else ""
        )
        + "`this / other` is the median of the per-repeat ratios.",
        "",
    ]
    for info in runs.values():
        engines = sorted({r["store"] for r in rows if r["meta"] == info})
        lines += [
            f"- {', '.join(engines)}: this tree {info['this']}, other tree {info['other']}; "
            f"{info['repeats']} repeats; Python {info['python']} on {info['platform']}; "
            f"CPU: {info['cpu']}, {info['cores']} cores; data disk: {info['disk']}",
        ]
    floors = {r["repeat"]: r[figure] for r in rows if r["store"] == FLOOR}
    lines += [
        "",
        f"| engine | this {unit} | other {unit} | this / other |"
        + (" this / floor | other / floor |" if floors else ""),
        "|---|---:|---:|---:|" + ("---:|---:|" if floors else ""),
    ]
    if floors:
        lines.append(
            f"| floor: the bare POST (`sqlq.bench.trivial`) | {_spread(floors)} | | | 1.00 | |"
        )
    for store in dict.fromkeys(r["store"] for r in rows if r["store"] != FLOOR):
        mine = {r["repeat"]: r[figure] for r in rows if r["store"] == store
                and r["tree"] == THIS}  # fmt: skip
        theirs = {r["repeat"]: r[figure] for r in rows if r["store"] == store
                  and r["tree"] == OTHER}  # fmt: skip
        ratio = statistics.median(mine[k] / theirs[k] for k in mine if k in theirs)
        line = f"| {store} | {_spread(mine)} | {_spread(theirs)} | {ratio:.3f} |"
        if floors:  # each a multiple of the floor measured in the same repeat
            over = [mine[k] / floors[k] for k in mine if k in floors]
            under = [theirs[k] / floors[k] for k in theirs if k in floors]
            line += f" {statistics.median(over):.2f} | {statistics.median(under):.2f} |"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _spread(by_repeat: dict[int, float]) -> str:
    """A median with its range, as every row shows it."""
    values = list(by_repeat.values())
    return f"{statistics.median(values):.1f} [{min(values):.1f}-{max(values):.1f}]"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--other", help="the other tree's environment's python")
    which.add_argument(
        "--baseline",
        metavar="COMMIT",
        help=f"the other tree: this repository at COMMIT (#35's: {BASELINE}), checked out and "
        f"installed under {BASELINES} once",
    )
    p.add_argument("--floor", action="store_true", help="add the bare POST's row")
    p.add_argument("--engines", nargs="+", default=list(ALL), choices=list(ALL))
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None, help="write versus.jsonl and versus.md here")
    p.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions per job under callgrind (versus-instructions.*)",
    )
    args = p.parse_args()
    if args.jobs < 1 or args.repeats < 1:
        p.error("--jobs and --repeats take a whole number of at least 1")
    other = args.other or baseline_python(args.baseline)
    info = meta.collect()
    info.update(this=tree_commit(sys.executable), other=tree_commit(other),
                repeats=args.repeats)  # fmt: skip
    measured = measure(other, args.engines, args.jobs, args.repeats, args.instructions,
                       args.floor)  # fmt: skip
    rows = [{**r, "meta": info} for r in measured]
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        name = "versus-instructions" if args.instructions else "versus"
        path = out / f"{name}.jsonl"
        if path.exists():  # the engines this run left out keep their last rows
            kept = [json.loads(line) for line in path.read_text().splitlines() if line]
            redone = {*args.engines, *([FLOOR] if args.floor else [])}
            rows = [r for r in kept if r["store"] not in redone] + rows
        with open(path, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        (out / f"{name}.md").write_text(report(rows))
    print(report(rows))


if __name__ == "__main__":
    main()
