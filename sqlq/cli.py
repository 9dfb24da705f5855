"""The ``sqlq`` command line. Subcommands parse flags and delegate; nothing else.

Every option can also be set from the environment as ``SQLQ_<OPTION>``
(``SQLQ_STORE=walq``, ``SQLQ_WORKERS=64``); a flag on the command line wins.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from common.errors import SqlqError

STORES = ["sqlite", "wal", "walq", "memory"]
F = TypeVar("F", bound=Callable[..., Any])


def _env(name: str) -> str:
    return "SQLQ_" + name.upper().replace("-", "_")


def setting(*decls: str, **options: Any) -> Callable[[F], F]:
    """A ``serve`` option: its default shown in --help, and settable as SQLQ_<NAME>.

    The variable's name comes from the flag (``--hb-timeout`` is ``SQLQ_HB_TIMEOUT``,
    ``--retries/--no-retries`` is ``SQLQ_RETRIES``), so the two cannot drift apart.
    """
    flag = decls[0].split("/")[0]
    options.setdefault("show_default", True)
    return click.option(*decls, envvar=_env(flag.removeprefix("--")), **options)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def main() -> None:
    """sqlq: a durable background-job queue with two comparable storage engines.

    Start a server with `sqlq serve`, submit jobs with POST /jobs, and watch
    GET /stats. See `sqlq COMMAND --help` for each command.
    """


@main.command()
@setting(
    "--store",
    type=click.Choice(STORES),
    default="sqlite",
    help="Storage engine (wal is walq).",
)
@setting(
    "--data",
    "data_dir",
    type=click.Path(file_okay=False),
    default="./sqlq-data",
    help="Data directory.",
)
@setting(
    "--sync",
    type=click.Choice(["full", "os"]),
    default="full",
    help="full: acknowledged means on stable storage (fdatasync); "
    "os: handed to the OS (survives kill -9, not power loss).",
)
@setting(
    "--workers",
    type=click.IntRange(1, 4096),
    default=16,
    help="Worker tasks.",
)
@setting(
    "--max-attempts",
    type=click.IntRange(1, 1000),
    default=5,
    help="Attempts before a job is dead-lettered.",
)
@setting(
    "--retries/--no-retries",
    default=True,
    help="--no-retries dead-letters a job at its first failure.",
)
@setting(
    "--retry-base-ms",
    type=click.FloatRange(0, 3_600_000),
    default=10.0,
    help="Backoff base: base * 2^(attempt-1), plus up to 50% jitter.",
)
@setting(
    "--retry-cap-ms",
    type=click.FloatRange(0, 86_400_000),
    default=5000.0,
    help="Backoff cap.",
)
@setting(
    "--hb-timeout",
    "hb_timeout_ms",
    type=click.FloatRange(1, 3_600_000),
    default=200.0,
    metavar="MS",
    help="A worker silent this many milliseconds is declared hung.",
)
@setting(
    "--healthcheck/--no-healthcheck",
    default=True,
    help="Run the loop that replaces hung workers.",
)
@setting(
    "--grace",
    type=click.FloatRange(0, 3600),
    default=10.0,
    help="Seconds running jobs get to finish on SIGTERM/SIGINT.",
)
@setting(
    "--retention",
    type=click.FloatRange(0),
    default=3600.0,
    help="Seconds finished jobs stay readable.",
)
@setting(
    "--compact-every",
    type=click.FloatRange(0),
    default=300.0,
    metavar="S",
    help="Prune finished jobs past --retention and compact every S seconds (0: never).",
)
@setting(
    "--group-commit/--no-group-commit",
    default=True,
    help="Benchmark knob: --no-group-commit syncs every transition on its own.",
)
@setting(
    "--emulate-sync-delay-ms",
    type=click.FloatRange(0, 1000),
    default=0.0,
    metavar="MS",
    help="Benchmark knob: add MS of emulated disk latency to every sync "
    "(reported as emulated in /stats).",
)
@setting(
    "--compact-floor-mb",
    type=click.FloatRange(0.01),
    default=64.0,
    help="walq compacts once its log exceeds this and 4x its live size.",
)
@setting(
    "--compact-ratio",
    type=click.FloatRange(1.01),
    default=4.0,
    help="walq compacts once its log exceeds this many times its live size (and the floor).",
)
@setting(
    "--cpu-beat-while-queued/--no-cpu-beat-while-queued",
    default=True,
    help="Benchmark knob: whether a cpu job heartbeats while it waits for a core.",
)
@setting(
    "--host",
    default="127.0.0.1",
    help="Address to bind. Anything but loopback needs --token (or --allow-no-token).",
)
@setting(
    "--port",
    type=click.IntRange(0, 65535),
    default=8080,
)
@setting(
    "--token",
    default=None,
    show_default=False,
    help="Require 'Authorization: Bearer TOKEN' on every endpoint but /healthz and /readyz. "
    "Prefer SQLQ_TOKEN: a flag shows in the process list.",
)
@setting(
    "--allow-no-token",
    is_flag=True,
    default=False,
    help="Serve a non-loopback --host without a token (only behind something that authenticates).",
)
@setting(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    help="On loopback, also answer requests whose Host header is NAME (repeatable); "
    "others get 421.",
)
@setting(
    "--max-queued",
    type=click.IntRange(1),
    default=1_000_000,
    help="Live jobs the queue holds; a submission past it gets 429 with Retry-After.",
)
@setting(
    "--max-connections",
    type=click.IntRange(1),
    default=2048,
    help="Concurrent connections and requests; past it uvicorn answers 503.",
)
@setting(
    "--keep-alive",
    type=click.IntRange(1, 3600),
    default=5,
    metavar="S",
    help="Close idle keep-alive connections after S seconds.",
)
@setting(
    "--fault-injection/--no-fault-injection",
    default=False,
    help="Accept the sleep kind's fail_prob and hang_prob (tests and benchmarks only).",
)
@setting(
    "--max-abandoned",
    type=click.IntRange(0),
    default=100,
    help="Cut-off handlers (hung or timed out) still running before /readyz says 503.",
)
@setting(
    "--handler-threads",
    type=click.IntRange(1, 4096),
    default=None,
    show_default=False,
    help="Threads for plain (sync) @task handlers. Default: one per worker.",
)
@setting(
    "--import",
    "imports",
    multiple=True,
    metavar="MODULE",
    help="Import MODULE so its @task handlers register (repeatable).",
)
@setting(
    "--seed",
    type=int,
    default=None,
    help="Seed the retry jitter and fault-injection RNG.",
)
@setting(
    "--access-log/--no-access-log",
    default=False,
    help="uvicorn's access log (costs ~45% throughput).",
)
@setting("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info")
def serve(
    store: str,
    data_dir: str,
    sync: str,
    workers: int,
    max_attempts: int,
    retries: bool,
    retry_base_ms: float,
    retry_cap_ms: float,
    hb_timeout_ms: float,
    healthcheck: bool,
    grace: float,
    retention: float,
    compact_every: float,
    group_commit: bool,
    emulate_sync_delay_ms: float,
    compact_floor_mb: float,
    compact_ratio: float,
    cpu_beat_while_queued: bool,
    host: str,
    port: int,
    token: str | None,
    allow_no_token: bool,
    allowed_hosts: tuple[str, ...],
    max_queued: int,
    max_connections: int,
    keep_alive: int,
    fault_injection: bool,
    max_abandoned: int,
    handler_threads: int | None,
    imports: tuple[str, ...],
    seed: int | None,
    access_log: bool,
    log_level: str,
) -> None:
    """Run the job queue service: recover, then serve HTTP on HOST:PORT."""
    import uvloop

    from common.backoff import RetryPolicy
    from common.http.guard import Security, is_loopback
    from common.runtime.config import RuntimeConfig, RuntimeState
    from common.runtime.service import Service
    from sqlq.engines import make_store
    from sqlq.serve import ServeOptions, import_handlers, install_default_signals
    from sqlq.serve import serve as run_server

    if token is not None and not token.strip():
        raise click.BadParameter("must not be empty", param_hint="--token")
    if not is_loopback(host) and token is None and not allow_no_token:
        raise click.UsageError(
            f"--host {host} is reachable from other machines: set --token (or SQLQ_TOKEN), "
            "or pass --allow-no-token if something in front of sqlq authenticates"
        )
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if store == "memory":
        logging.getLogger("sqlq").warning(
            "--store memory: nothing survives a restart; every job, acknowledged or not, "
            "is lost when this process stops"
        )
    try:
        import_handlers(imports)
    except ImportError as exc:
        raise click.BadParameter(str(exc), param_hint="--import") from exc
    config = RuntimeConfig(
        workers=workers,
        max_attempts=max_attempts,
        retry=RetryPolicy(base_s=retry_base_ms / 1000, cap_s=retry_cap_ms / 1000, retries=retries),
        hb_timeout_s=hb_timeout_ms / 1000,
        healthcheck=healthcheck,
        seed=seed,
        compact_every_s=compact_every,
        cpu_beat_while_queued=cpu_beat_while_queued,
        fault_injection=fault_injection,
        max_queued=max_queued,
        max_abandoned=max_abandoned,
        handler_threads=handler_threads,
    )
    options: dict[str, object] = {"retention": retention}
    if store != "memory":
        options.update(group_commit=group_commit, sync_delay_s=emulate_sync_delay_ms / 1000)
    if store in ("wal", "walq"):
        options["compact_floor_bytes"] = int(compact_floor_mb * (1 << 20))
        options["compact_ratio"] = compact_ratio
    try:
        engine = make_store(store, data_dir, sync=sync, **options)  # type: ignore[arg-type]
    except SqlqError as exc:
        raise click.ClickException(str(exc)) from exc
    runtime = Service(engine, config)
    opts = ServeOptions(
        host=host,
        port=port,
        grace_s=grace,
        access_log=access_log,
        log_level=log_level,
        security=Security.for_binding(host, token, allowed_hosts),
        max_connections=max_connections,
        keep_alive_s=keep_alive,
    )
    install_default_signals()
    try:
        uvloop.run(run_server(runtime, opts))
    except SqlqError as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        # uvicorn re-raises the signal it handled; after a clean stop that is success.
        sys.exit(0 if runtime.state is RuntimeState.STOPPED else 130)


EXPERIMENT_NAMES = ["ceiling", "A", "B", "C", "D", "E", "F", "G", "H", "I"]


def _need_bench_extra() -> None:
    try:
        import matplotlib  # noqa: F401
        import tqdm  # noqa: F401
    except ImportError as exc:
        raise click.ClickException(
            f"{exc.name} is missing: install the benchmark extra, pip install -e '.[bench]'"
        ) from exc


@main.command()
@click.option(
    "--only",
    multiple=True,
    type=click.Choice(EXPERIMENT_NAMES),
    help="Run only this experiment (repeatable). Default: all.",
)
@click.option(
    "--stores",
    multiple=True,
    type=click.Choice(["memory", "walq", "sqlite"]),
    help="Engines to compare (repeatable). Default: all three.",
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
@click.option("--progress/--no-progress", default=True, show_default=True)
def bench(
    only: tuple[str, ...],
    stores: tuple[str, ...],
    repeats: int,
    quick: bool,
    out: str,
    a_workers: tuple[int, ...],
    report_only: bool,
    progress: bool,
) -> None:
    """Run the comparative benchmark suite into OUT and rebuild its report.

    Each run starts a fresh `sqlq serve` with a fresh data directory on a free
    port; engines alternate within each repeat. Experiments: A worker scaling,
    B retries, C hangs and the health check, D durability cost, E kill -9
    recovery, F CPU jobs, G recovery time and compaction, H latency under load,
    I emulated disk latency; `ceiling` is the client against a trivial endpoint.
    """
    from pathlib import Path

    _need_bench_extra()
    from bench.report import build

    if not report_only:
        from bench.runner import ORDER, STORES, run_suite

        run_suite(
            only=only or ORDER,
            stores=stores or STORES,
            repeats=1 if quick else repeats,
            quick=quick,
            out=Path(out),
            extra={"A": {"workers": a_workers}} if a_workers else {},
            show_progress=progress,
        )
    build(Path(out))
    click.echo(f"report: {Path(out) / 'REPORT.md'}")


@main.command()
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
    from bench.client.loadgen import run

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


@main.command()
@click.option("--store", type=click.Choice(["wal", "walq", "sqlite"]), required=True)
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
def crashcheck(store: str, sync: str, trials: int, jobs: int, seed: int, out: str) -> None:
    """Kill -9 a real server at random moments and verify nothing acknowledged was lost.

    Verification reads the files without the engine's code. Exits 1 on any loss.
    """
    from pathlib import Path

    _need_bench_extra()
    from bench.crashcheck import run_trials, write_report

    name = "walq" if store in ("wal", "walq") else "sqlite"
    rows = run_trials(store=name, sync=sync, trials=trials, jobs=jobs, seed=seed, out=Path(out))
    write_report(Path(out))
    bad = [r for r in rows if not r["ok"]]
    acked = sum(r["acknowledged"] for r in rows)
    lost = sum(r["lost"] for r in rows)
    click.echo(f"{name} --sync {sync}: {trials} trials, {acked} acknowledged, {lost} lost")
    for r in bad:
        click.echo(f"  trial {r['trial']}: {'; '.join(r['problems'])}", err=True)
    if bad:
        sys.exit(1)


@main.command()
@click.option(
    "--data",
    "data_dir",
    type=click.Path(file_okay=False, exists=True),
    default="./sqlq-data",
    show_default=True,
    help="The data directory the walq engine uses (its log lives in DATA/walq).",
)
def repair(data_dir: str) -> None:
    """Cut a damaged walq log at its first bad record; the rest is kept aside, never deleted."""
    from walq.repair import repair as repair_log

    try:
        report = repair_log(os.path.join(data_dir, "walq"))
    except FileNotFoundError as exc:
        raise click.UsageError(f"--data: no walq log in {data_dir} ({exc.filename})") from exc
    except SqlqError as exc:
        raise click.ClickException(str(exc)) from exc
    if report.moved_to is None:
        click.echo(f"{report.path}: no damage found; nothing changed")
    else:
        click.echo(
            f"{report.path}: kept {report.kept_bytes} bytes; moved {report.moved_bytes} bytes "
            f"({report.reason}) to {report.moved_to}"
        )
