"""The benchmark's commands: ``sqlq bench``, ``sqlq loadgen`` and ``sqlq crashcheck``.

They plug into the ``sqlq`` command through the ``sqlq.commands`` entry points
(``pyproject.toml``), so ``sqlq`` never imports ``bench``: the dependency points
one way, from the benchmark to what it measures.
"""

from __future__ import annotations

import sys

import click

from sqlq.bench.experiments import ORDER
from sqlq.engines.registry import DURABLE_CHOICES, NAMES, engine


def _need_bench_extra() -> None:
    try:
        import matplotlib  # noqa: F401
        import tqdm  # noqa: F401
    except ImportError as exc:
        raise click.ClickException(
            f"{exc.name} is missing: install the benchmark extra, pip install 'sqlq[bench]'"
        ) from exc


@click.command()
@click.option(
    "--only",
    multiple=True,
    type=click.Choice(ORDER),
    help="Run only this experiment (repeatable). Default: all.",
)
@click.option(
    "--stores",
    multiple=True,
    type=click.Choice([*NAMES, "postgres"]),
    help="Engines to compare (repeatable). Default: the three single-node ones. postgres: "
    "in the experiments that run on it (S: two nodes on a throwaway database).",
)
@click.option("--repeats", type=click.IntRange(1, 100), default=5, show_default=True)
@click.option(
    "--quick", is_flag=True, help="A smoke run of every experiment (1 repeat, tiny sizes)."
)
@click.option("--out", type=click.Path(file_okay=False), default="results", show_default=True)
@click.option(
    "--workers",
    "a_workers",
    multiple=True,
    type=click.IntRange(1, 4096),
    help="Experiment A: worker counts to run (repeatable).",
)
@click.option("--report-only", is_flag=True, help="Rebuild REPORT.md and plots from the jsonl.")
@click.option(
    "--with-before",
    is_flag=True,
    help="With --report-only: put OUT's *-before.jsonl (an older tree's runs) beside this "
    "tree's rows, for a comparison kept in a directory of its own; REPORT.md otherwise "
    "leaves them out, so that every section comes from one tree.",
)
@click.option("--progress/--no-progress", default=True, show_default=True)
def bench(
    only: tuple[str, ...],
    stores: tuple[str, ...],
    repeats: int,
    quick: bool,
    out: str,
    a_workers: tuple[int, ...],
    report_only: bool,
    with_before: bool,
    progress: bool,
) -> None:
    """Run the comparative benchmark suite into OUT and rebuild its report.

    Each run starts a fresh `sqlq serve` with a fresh data directory on a free
    port; engines alternate within each repeat. REPORT.md shows this tree's runs only: a
    comparison with an older tree is `python -m sqlq.bench.versus` (versus-*.md), or the
    older tree's `<X>-before.jsonl` beside `<X>.jsonl` in a directory of their own,
    built with `--report-only --with-before`. Experiments: A worker scaling,
    B retries, C hangs and the health check, D durability cost, E kill -9
    recovery, F CPU jobs, G recovery time and compaction, H latency under load,
    I emulated disk latency, J many nodes on PostgreSQL, K the machine's limits,
    L the dashboard's cost, M dispatch against the queues ever used, N schedules, O the
    store writes of progress, P remote workers (`sqlq worker`) against in-process and huey;
    `ceiling` is the client against a trivial endpoint.
    """
    from pathlib import Path

    _need_bench_extra()
    from sqlq.bench.experiments import build_report

    if with_before and not report_only:
        raise click.UsageError("--with-before: only with --report-only (a run is one tree)")
    if not report_only:
        from sqlq.bench.runner import run_suite

        run_suite(
            only=only or ORDER,
            stores=stores or NAMES,
            repeats=1 if quick else repeats,
            quick=quick,
            out=Path(out),
            extra={"A": {"workers": a_workers}} if a_workers else {},
            show_progress=progress,
        )
    build_report(Path(out), before=with_before)
    click.echo(f"report: {Path(out) / 'REPORT.md'}")


@click.command()
@click.option("--url", default="http://127.0.0.1:8080", show_default=True)
@click.option("--jobs", type=click.IntRange(1), default=2000, show_default=True)
@click.option("--concurrency", type=click.IntRange(1, 4096), default=32, show_default=True)
@click.option(
    "--batch",
    type=click.IntRange(1, 10_000),
    default=1,
    show_default=True,
    help="Jobs per request; above 1 uses POST /jobs/batch.",
)
@click.option(
    "--rate",
    type=click.FloatRange(0),
    default=0.0,
    show_default=True,
    help="Open loop at this many requests/s (0: closed loop).",
)
@click.option("--kind", type=click.Choice(["sleep", "cpu"]), default="sleep", show_default=True)
@click.option("--work-ms", type=click.IntRange(0, 600_000), default=20, show_default=True)
@click.option("--rounds", type=click.IntRange(1), default=500_000, show_default=True)
@click.option("--fail-prob", type=click.FloatRange(0, 1), default=0.0, show_default=True)
@click.option("--hang-prob", type=click.FloatRange(0, 1), default=0.0, show_default=True)
@click.option("--label", default="")
def loadgen(
    url: str,
    jobs: int,
    concurrency: int,
    batch: int,
    rate: float,
    kind: str,
    work_ms: int,
    rounds: int,
    fail_prob: float,
    hang_prob: float,
    label: str,
) -> None:
    """Submit jobs to a running server, wait for them to finish, print one JSON line."""
    import json

    _need_bench_extra()
    from sqlq.bench.client.loadgen import run

    try:
        result = run(
            url, jobs=jobs, kind=kind, work_ms=work_ms, fail_prob=fail_prob,
            hang_prob=hang_prob, rounds=rounds, concurrency=concurrency, batch=batch,
            rate=rate, label=label,
        )  # fmt: skip
    except OSError as exc:
        raise click.UsageError(f"--url: cannot reach {url}: {exc}") from exc
    result.pop("store_stats", None)
    click.echo(json.dumps(result))


@click.command()
@click.option("--store", type=click.Choice(DURABLE_CHOICES), required=True)
@click.option("--sync", type=click.Choice(["full", "os"]), default="full", show_default=True)
@click.option("--trials", type=click.IntRange(1), default=20, show_default=True)
@click.option(
    "--jobs",
    type=click.IntRange(1),
    default=5000,
    show_default=True,
    help="Most jobs submitted per trial (the kill usually comes first).",
)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--out", type=click.Path(file_okay=False), default="results", show_default=True)
@click.option(
    "--workload",
    type=click.Choice(["mixed", "plain", "schedules", "workflows", "fair"]),
    default="mixed",
    show_default=True,
    help="mixed: failing, long, hanging and delayed jobs with cancels, retries and pauses; "
    "plain: 2 ms jobs that always succeed; schedules: schedules ticking every second "
    "(no tick lost, none doubled); workflows: graphs of jobs, some with a member that dies "
    "(each child after its parents, released once, a dead member's cone cancelled); "
    "fair (--store postgres): five keys flood a queue with a per-key rate and concurrency, "
    "a sixth empties and refills (every start in every window within the rate, never more "
    "than the limit running, no refill waiting past a poll).",
)
@click.option(
    "--remote-workers",
    is_flag=True,
    help="Remote worker processes run the jobs over the pull protocol: per mode, a worker "
    "killed, the server killed while workers hold jobs, workers that stall and report late "
    "(postgres: two nodes, a node and a worker killed). Verified from the files and the "
    "workers' records: every stale outcome fenced.",
)
def crashcheck(
    store: str, sync: str, trials: int, jobs: int, seed: int, out: str, workload: str,
    remote_workers: bool,
) -> None:  # fmt: skip
    """Kill -9 a real server at random moments and verify nothing acknowledged was lost.

    Verification reads the files without the engine's code. With --store postgres:
    three nodes on a throwaway PostgreSQL, one node and (every other trial) the
    database killed, verified in plain SQL. Exits 1 on any loss.
    """
    from pathlib import Path

    _need_bench_extra()
    from sqlq.bench.crashcheck import run_trials
    from sqlq.bench.crashreport import write_report

    name = engine(store).name
    if workload == "fair" and (remote_workers or not engine(store).shared):
        raise click.UsageError("--workload fair runs on three nodes: it needs --store postgres "
                               "and no --remote-workers")  # fmt: skip
    if remote_workers:  # sqlq.bench.crashremote: its trials, report and output
        from sqlq.bench.crashremote import command

        sys.exit(command(store=name, sync=sync, trials=trials, jobs=jobs, seed=seed, out=out))
    if engine(store).shared:  # three nodes and a throwaway PostgreSQL, both killed
        from sqlq.bench.crashcheck_pg import run_pg_trials

        rows = run_pg_trials(trials=trials, jobs=jobs, seed=seed, out=Path(out), workload=workload)
    else:
        rows = run_trials(
            store=name, sync=sync, trials=trials, jobs=jobs, seed=seed, out=Path(out),
            workload=workload,
        )  # fmt: skip
    write_report(Path(out))
    bad = [r for r in rows if not r["ok"]]
    acked = sum(r.get("acknowledged", r.get("ticks", 0)) for r in rows)
    lost = sum(r.get("lost", r.get("missing", 0) + r.get("doubled", 0)) for r in rows)
    restarts = sum(1 for r in rows if not r.get("first_restart_ok", True))
    click.echo(
        f"{name} --sync {sync} --workload {workload}: {trials} trials, {acked} acknowledged, "
        f"{lost} lost, {restarts} first restarts failed"
    )
    for r in bad:
        click.echo(f"  trial {r['trial']}: {'; '.join(r['problems'])}", err=True)
    if bad:
        sys.exit(1)
