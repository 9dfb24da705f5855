"""The ``sqlq`` command line. Subcommands parse flags and delegate; nothing else.

Every ``serve`` option can also be set from the environment as ``SQLQ_<OPTION>``
(``SQLQ_STORE=walq``, ``SQLQ_WORKERS=64``); a flag on the command line wins.
``serve``'s options are the fields of ``sqlq.settings.ServeSettings``. More
commands plug in through the ``sqlq.commands`` entry points (the benchmark's
``bench``, ``loadgen`` and ``crashcheck``), loaded only when used.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import sys
from collections.abc import Callable
from importlib.metadata import EntryPoint, PackageNotFoundError, entry_points, requires
from typing import Any, TypeVar

import click

from sqlq import __version__, ops, ops_queues, ops_schedules, ops_workflows
from sqlq.common.errors import SqlqError
from sqlq.settings import ServeSettings, options

PLUGIN_GROUP = "sqlq.commands"
BENCH_EXTRA = "bench"  # what sqlq's own plugin commands (the benchmark's) need
_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")


def brings(extra: str, dist: str = "sqlq") -> set[str]:
    """The distributions ``dist[extra]`` brings, through the extras of ``dist`` it names in
    turn (``sqlq[test]`` names ``sqlq[bench]``, which names ``sqlq[postgres]``); none if
    ``dist`` has no metadata (a bare tree). Read from the installed metadata's
    requirements, with no parser beyond this one (the base install has no ``packaging``)."""
    try:
        wanted = requires(dist) or []
    except PackageNotFoundError:
        return set()
    found: set[str] = set()
    todo, seen = [extra], set()
    while todo:
        e = todo.pop()
        if e in seen:
            continue
        seen.add(e)
        for req in wanted:
            spec, _, marker = req.partition(";")
            named = _REQUIREMENT.match(spec)
            if named is None or f'extra == "{e}"' not in marker.replace("'", '"'):
                continue
            name, extras = named.group(1), named.group(2) or ""
            if name.lower() == dist:
                todo.extend(x.strip() for x in extras.split(",") if x.strip())
            else:
                found.add(name)
    return found


def missing_from(extra: str, dist: str = "sqlq") -> list[str]:
    """What ``dist[extra]`` brings that cannot be imported here (a bare tree: none, and the
    import itself is the test). Import names are the distributions' (true of every one the
    bench extra brings)."""
    return sorted(n for n in brings(extra, dist) if _absent(n.lower().replace("-", "_")))


def _absent(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is None
    except (ImportError, ValueError):
        return True


def _needs(name: str, missing: str) -> click.ClickException:
    return click.ClickException(
        f"sqlq {name} is a benchmark command: it needs the {BENCH_EXTRA} extra, which this "
        f"install lacks ({missing}): pip install 'sqlq[{BENCH_EXTRA}]'"
    )


class Commands(click.Group):
    """The built-in commands, plus those other packages declare as ``sqlq.commands``.

    ``--help`` lists the plugins under a heading of their own, apart from the commands a
    user runs day to day: sqlq's own (the benchmark's ``bench``, ``loadgen``,
    ``crashcheck``) under the extra that brings what they need, and listed without
    being loaded when that extra is missing. Asked for by name without it, one is a
    one-line message naming ``sqlq[bench]``, before its own code runs."""

    def _plugins(self) -> dict[str, EntryPoint]:
        return {ep.name: ep for ep in entry_points(group=PLUGIN_GROUP)}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._plugins()})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name)
        if command is not None:
            return command
        ep = self._plugins().get(name)
        if ep is None:
            return None
        if _ours(ep) and (missing := missing_from(BENCH_EXTRA)):
            raise _needs(name, ", ".join(missing))
        try:
            loaded = ep.load()
        except ImportError as exc:  # a command of an extra not installed: say which
            raise _needs(name, str(exc.name or exc)) from None
        assert isinstance(loaded, click.Command), f"{ep.value} is not a click command"
        return loaded

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        own = [n for n in super().list_commands(ctx) if n not in self._plugins()]
        plugins = sorted(self._plugins().items())
        names = [*own, *(n for n, _ in plugins)]
        if not names:
            return
        limit = formatter.width - 6 - max(map(len, names))
        rows = []
        for name in own:
            cmd = super().get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)
        groups: dict[str, list[tuple[str, str]]] = {}
        lacking = missing_from(BENCH_EXTRA)
        for name, ep in plugins:
            heading = (
                f"Benchmark commands (the sqlq[{BENCH_EXTRA}] extra)"
                if _ours(ep)
                else f"Commands from {ep.dist.name if ep.dist else ep.module}"
            )
            groups.setdefault(heading, []).append((name, self._short_help(ep, limit, lacking)))
        for heading, listed in groups.items():
            with formatter.section(heading):
                formatter.write_dl(listed)

    @staticmethod
    def _short_help(ep: EntryPoint, limit: int, lacking: list[str]) -> str:
        """A plugin's line in --help; not loaded when what it needs is missing."""
        needs = f"(not installed: pip install 'sqlq[{BENCH_EXTRA}]')"
        if _ours(ep) and lacking:
            return needs
        try:
            loaded = ep.load()
        except ImportError:
            return needs
        return loaded.get_short_help_str(limit) if isinstance(loaded, click.Command) else ""


def _ours(ep: EntryPoint) -> bool:
    """Whether ``ep`` ships with sqlq (the benchmark's commands, which the extra serves)."""
    return ep.dist is None or ep.dist.name.lower() == "sqlq"


@click.group(
    cls=Commands,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, "--version", prog_name="sqlq", message="%(prog)s %(version)s")
def main() -> None:
    """sqlq: a durable background-job queue with comparable storage engines.

    Start a server with `sqlq serve`, submit jobs with POST /jobs, and watch
    GET /stats. See `sqlq COMMAND --help` for each command.
    """


main.add_command(ops.jobs)
main.add_command(ops_schedules.schedules)
main.add_command(ops_workflows.workflows)
main.add_command(ops_queues.queues)
main.add_command(ops.submit)


@main.command()
@options(ServeSettings)
def serve(**flags: Any) -> None:
    """Run the job queue service: recover, then serve HTTP on HOST:PORT."""
    import uvloop

    from sqlq.engines.registry import engine, make_store
    from sqlq.runtime.config import RuntimeState
    from sqlq.serve import ServeOptions, build_runtime, import_handlers, install_default_signals
    from sqlq.serve import serve as run_server
    from sqlq.ui.options import UiOptions

    s = ServeSettings(**flags)
    security = s.security()  # (a click error naming the flag, before anything opens)
    logging.basicConfig(
        level=s.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if s.store == "memory":
        logging.getLogger("sqlq").warning(
            "--store memory: nothing survives a restart; every job, acknowledged or not, "
            "is lost when this process stops"
        )
    try:
        import_handlers(s.imports)
    except ImportError as exc:
        raise click.BadParameter(str(exc), param_hint="--import") from exc
    shared = engine(s.store).shared
    if shared and not s.dsn:
        raise click.UsageError(
            f"--store {s.store} needs --dsn (or SQLQ_DSN): the database to share"
        )
    if (s.ui_read_only or s.ui_secure_cookie) and not s.ui:
        flag = "--ui-read-only" if s.ui_read_only else "--ui-secure-cookie"
        raise click.UsageError(f"{flag} is for the dashboard, which --no-ui removes")
    if s.dsn and not shared:
        raise click.UsageError(f"--dsn is for --store postgres; --store {s.store} keeps --data")
    try:
        store = make_store(s.store, s.data_dir, sync=s.sync, **s.store_options())  # type: ignore[arg-type]
    except SqlqError as exc:
        raise click.ClickException(str(exc)) from exc
    runtime = build_runtime(store, s.runtime_config())
    opts = ServeOptions(
        host=s.host,
        port=s.port,
        grace_s=s.grace,
        access_log=s.access_log,
        log_level=s.log_level,
        security=security,
        max_connections=s.max_connections,
        keep_alive_s=s.keep_alive,
        ui=UiOptions(read_only=s.ui_read_only, secure_cookie=s.ui_secure_cookie) if s.ui else None,
    )
    install_default_signals()
    try:
        uvloop.run(run_server(runtime, opts))
    except SqlqError as exc:
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        # uvicorn re-raises the signal it handled; after a clean stop that is success.
        sys.exit(0 if runtime.state is RuntimeState.STOPPED else 130)


@main.command()
@click.option(
    "--url",
    default="http://127.0.0.1:8080",
    show_default=True,
    envvar="SQLQ_URL",
    help="The sqlq server (or SQLQ_URL).",
)
@click.option(
    "--import",
    "imports",
    multiple=True,
    metavar="MODULE",
    help="A module whose @task handlers to run (repeatable).",
)
@click.option(
    "--queue",
    "queues",
    multiple=True,
    default=("default",),
    show_default=True,
    metavar="NAME",
    help="A remote queue to claim from (repeatable).",
)
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    metavar="K",
    help="Claim only jobs of this kind (repeatable; default: every kind it runs).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 10_000),
    default=None,
    help="Jobs held at once, claimed ones waiting for a process included "
    "[default: 10, or 4 x --processes if more].",
)
@click.option(
    "--processes",
    type=click.IntRange(0, 1024),
    default=0,
    show_default=True,
    help="Run plain (sync) handlers in this many worker processes; 0: in threads.",
)
@click.option(
    "--lease",
    type=click.FloatRange(5, 3600),
    default=30.0,
    show_default=True,
    help="Seconds a claim holds unrenewed; a heartbeat renews all every lease/3.",
)
@click.option(
    "--grace",
    type=click.FloatRange(0, 86_400),
    default=10.0,
    show_default=True,
    help="Seconds running jobs get to finish after SIGTERM.",
)
@click.option(
    "--wait",
    type=click.FloatRange(0, 30),
    default=5.0,
    show_default=True,
    help="Seconds a claim long-polls for work (an idle worker stops within this).",
)
@click.option("--name", default=None, help="What this worker calls itself (default host-pid).")
@click.option(
    "--token",
    envvar="SQLQ_TOKEN",
    default=None,
    show_default=False,
    help="The bearer token (or SQLQ_TOKEN); never printed.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
)
@click.option(
    "--fault-injection",
    is_flag=True,
    help="Let sleep jobs' fail_prob and hang_prob act (tests, benchmarks).",
)
def worker(**flags: Any) -> None:
    """Run @task handlers on jobs claimed from a server's remote queues.

    It claims in batches, renews every lease it holds in one heartbeat, reports outcomes
    in batches, and keeps each one until the server takes it (or fences it). SIGTERM:
    claim no more, finish within --grace, give back what has not started, exit 0.
    """  # fmt: skip
    from sqlq.worker_main import WorkerFlags, run

    run(WorkerFlags(**flags))


@main.command()
@click.option(
    "--dsn",
    envvar="SQLQ_DSN",
    required=True,
    help="postgresql://USER:PASSWORD@HOST:PORT/DATABASE (or SQLQ_DSN).",
)
def migrate(dsn: str) -> None:
    """Bring a PostgreSQL database's sqlq schema up to this version (safe to repeat)."""
    import asyncio

    from sqlq.engines.registry import engine

    engine("postgres")  # (asyncpg missing: one line naming the extra, exit code 2)
    from sqlq.engines.postgres.migrate import migrate as apply
    from sqlq.engines.postgres.migrate import where

    try:
        before, after = asyncio.run(apply(dsn))
    except SqlqError as exc:
        raise click.ClickException(str(exc)) from exc
    if before == after:
        click.echo(f"{where(dsn)}: schema already at version {after}")
    else:
        click.echo(f"{where(dsn)}: schema migrated from version {before} to {after}")


F = TypeVar("F", bound=Callable[..., Any])


def _data_dir(help_: str) -> Callable[[F], F]:
    """``--data``, an existing data directory, as the commands that read one take it."""
    return click.option("--data", "data_dir", type=click.Path(file_okay=False, exists=True),
                        default="./sqlq-data", show_default=True, help=help_)  # fmt: skip


@main.command()
@click.option(
    "--store",
    type=click.Choice(["sqlite", "walq"]),
    required=True,
    help="The engine whose files --data holds.",
)
@_data_dir("The data directory a server runs on (or ran on).")
@click.argument("out", type=click.Path(file_okay=False))
def backup(store: str, data_dir: str, out: str) -> None:
    """Copy a store's data directory into OUT, a new or empty directory, consistently,
    while a server keeps running on it. Every job acknowledged before the backup began is
    in the copy; `sqlq serve --store STORE --data OUT` restores it."""
    from sqlq.backup import OutNotEmpty, take
    from sqlq.engines.registry import engine

    subdir = engine(store).subdir
    assert subdir is not None
    copy: Callable[[str, str], object]
    if store == "walq":  # (each engine's copy imported only when asked for)
        from sqlq.walq.backup import copy_store as copy
    else:
        from sqlq.engines.sqlite.backup import copy_store as copy
    try:
        copied = take(data_dir, out, subdir, copy)
    except OutNotEmpty as exc:
        raise click.BadParameter(f"{exc}: a backup goes into a new or empty one",
                                 param_hint="OUT") from None  # fmt: skip
    except FileNotFoundError as exc:
        raise click.BadParameter(f"no {store} store in {data_dir} ({exc.filename})",
                                 param_hint="--data") from None  # fmt: skip
    except SqlqError as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(f"{exc.filename or out}: {exc.strerror or exc}") from exc
    what = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in _fields(copied).items())
    click.echo(f"backed up {os.path.join(data_dir, subdir)} to {os.path.join(out, subdir)}: "
               f"{what}")  # fmt: skip


def _fields(copied: Any) -> dict[str, Any]:
    """A copy's report as name: value, its file list apart (the names are the layout's)."""
    from dataclasses import asdict

    return {k: v for k, v in asdict(copied).items() if k != "files"}


@main.command()
@_data_dir("The data directory the walq engine uses (its log lives in DATA/walq).")
def repair(data_dir: str) -> None:
    """Cut a damaged walq log at its first bad record; the rest is kept aside, never deleted."""
    from sqlq.walq.repair import repair as repair_log

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
