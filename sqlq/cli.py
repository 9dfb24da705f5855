"""The ``sqlq`` command line. Subcommands parse flags and delegate; nothing else."""

from __future__ import annotations

import click

from walq.repair import repair as repair_log


@click.group(context_settings={"auto_envvar_prefix": "SQLQ", "help_option_names": ["-h", "--help"]})
def main() -> None:
    """sqlq: a durable background-job queue with two comparable storage engines."""


@main.command()
def serve() -> None:
    """Run the job queue service (not yet: the service lands with the runtime issue)."""
    click.echo("sqlq serve: not yet")


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
    import os

    from common.errors import SqlqError

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
