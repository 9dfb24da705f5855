"""Operator commands: ``sqlq jobs ...``, ``sqlq schedules ...`` and ``sqlq submit``, over
``sqlq.Client``.

They talk to a running server at ``--url`` (``SQLQ_URL``) with ``--token``
(``SQLQ_TOKEN``), print a table for people and JSON with ``--json`` for
scripts, and turn the server's errors into one-line messages (exit 1), never a
traceback.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from functools import wraps
from typing import Any, TypeVar

import click
import msgspec

from sqlq.client import DEFAULT_URL, ApiError, Client
from sqlq.common.errors import ValidationError
from sqlq.common.models import Job
from sqlq.common.schedule import check_name
from sqlq.common.wire import ScheduleView

F = TypeVar("F", bound=Callable[..., Any])
COLUMNS = ("id", "kind", "queue", "state", "attempts", "updated", "last_error")


def connection(fn: F) -> F:
    """--url, --token and --json, and a Client built from them as the first argument."""

    @click.option("--url", envvar="SQLQ_URL", default=DEFAULT_URL, show_default=True)
    @click.option("--token", envvar="SQLQ_TOKEN", default=None, help="Or SQLQ_TOKEN.")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON, for scripts.")
    @wraps(fn)
    def run(url: str, token: str | None, as_json: bool, **kwargs: Any) -> Any:
        try:
            with Client(url, token=token, retries=1) as client:
                return fn(client, as_json, **kwargs)
        except ApiError as exc:
            where = f" ({exc.field})" if exc.field else ""
            raise click.ClickException(f"{exc.message}{where}") from exc

    return run  # type: ignore[return-value]


def _row(job: Job) -> list[str]:
    when = datetime.fromtimestamp(job.updated_at, UTC).strftime("%Y-%m-%d %H:%M:%S")
    error = (job.last_error or "").replace("\n", " ")
    return [job.id, job.kind, job.queue, job.state.value, str(job.attempts), when, error[:50]]


def _table(rows: Iterable[list[str]], columns: tuple[str, ...] = COLUMNS) -> str:
    rows = [list(columns), *rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def _show(jobs: list[Job], as_json: bool) -> None:
    if as_json:
        click.echo(msgspec.json.encode([msgspec.to_builtins(j) for j in jobs]).decode())
    elif jobs:
        click.echo(_table(_row(j) for j in jobs))
    else:
        click.echo("no jobs")


def _detail(job: Job, as_json: bool) -> None:
    if as_json:
        click.echo(msgspec.json.encode(job).decode())
        return
    for name, value in msgspec.structs.asdict(job).items():
        click.echo(f"{name:>16}  {json.dumps(value) if not isinstance(value, str) else value}")


@click.group()
def jobs() -> None:
    """List, inspect, retry and cancel jobs on a running server."""


@jobs.command("list")
@connection
@click.option(
    "--state", type=click.Choice(["scheduled", "running", "completed", "dead", "cancelled"])
)
@click.option("--kind")
@click.option("--queue")
@click.option("--schedule", help="Only the jobs this schedule made.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True)
def list_jobs(
    client: Client,
    as_json: bool,
    state: str | None,
    kind: str | None,
    queue: str | None,
    schedule: str | None,
    limit: int,
) -> None:
    """Jobs in id order (oldest first), filtered; e.g. --state dead."""
    found: list[Job] = []
    for job in client.jobs(state=state, kind=kind, queue=queue, schedule=schedule):
        found.append(job)
        if len(found) >= limit:
            break
    _show(found, as_json)


@jobs.command("get")
@connection
@click.argument("job_id")
def get_job(client: Client, as_json: bool, job_id: str) -> None:
    """One job: its state, args, result, last error and every timestamp."""
    _detail(client.get(job_id), as_json)


@jobs.command("retry")
@connection
@click.argument("job_id", required=False)
@click.option("--all-dead", is_flag=True, help="Retry every dead job (with --kind/--queue).")
@click.option("--kind")
@click.option("--queue")
def retry_jobs(
    client: Client,
    as_json: bool,
    job_id: str | None,
    all_dead: bool,
    kind: str | None,
    queue: str | None,
) -> None:
    """Put a dead or cancelled job back with a fresh attempt budget (or --all-dead)."""
    if (job_id is None) == (not all_dead):
        raise click.UsageError("give a JOB_ID or --all-dead, not both and not neither")
    if job_id is not None:
        _detail(client.retry(job_id), as_json)
        return
    n = client.retry_all(state="dead", kind=kind, queue=queue)
    click.echo(json.dumps({"retried": n}) if as_json else f"retried {n} dead jobs")


@jobs.command("cancel")
@connection
@click.argument("job_id")
def cancel_job(client: Client, as_json: bool, job_id: str) -> None:
    """Cancel a job that has not started."""
    _detail(client.cancel(job_id), as_json)


@click.command()
@connection
@click.argument("kind")
@click.option("--args", "args_json", default="{}", help="The job's args as a JSON object.")
@click.option("--delay-ms", type=click.IntRange(0), default=None)
@click.option("--priority", type=int, default=None)
@click.option("--queue", default=None)
@click.option("--max-attempts", type=click.IntRange(1), default=None)
@click.option("--key", "idempotency_key", default=None, help="An idempotency key.")
def submit(client: Client, as_json: bool, kind: str, args_json: str, **options: Any) -> None:
    """Submit one job of KIND and print it."""
    try:
        args = json.loads(args_json)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--args") from exc
    if not isinstance(args, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--args")
    _detail(client.submit(kind, args, **options), as_json)


# -- schedules ----------------------------------------------------------------------------

SCHEDULE_COLUMNS = ("name", "when", "tz", "kind", "next", "last_tick", "last_job", "paused")


def _stamp(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _when(view: ScheduleView) -> str:
    spec = view.spec
    return spec.cron if spec.cron is not None else f"every {spec.every_s} s"


def _schedule_row(view: ScheduleView) -> list[str]:
    last = view.last_job
    job = "-" if last is None else f"{last.id} ({last.state.value if last.state else 'pruned'})"
    spec = view.spec
    return [view.name, _when(view), spec.tz, spec.kind, _stamp(view.next_at),
            _stamp(view.last_tick), job, "yes" if spec.paused else "no"]  # fmt: skip


def _show_schedule(view: ScheduleView, as_json: bool) -> None:
    if as_json:
        click.echo(msgspec.json.encode(view).decode())
        return
    for name, value in zip(SCHEDULE_COLUMNS, _schedule_row(view), strict=True):
        click.echo(f"{name:>16}  {value}")
    for name, value in msgspec.structs.asdict(view.spec).items():
        if name not in ("cron", "every_s", "tz", "kind", "paused"):
            click.echo(f"{name:>16}  {json.dumps(value) if not isinstance(value, str) else value}")


def _schedule_name(_: click.Context, __: click.Parameter, value: str) -> str:
    """NAME, checked here as the server checks it: a message, not a round trip."""
    try:
        return check_name(value)
    except ValidationError as exc:
        raise click.BadParameter(exc.message) from None


NAME = click.argument("name", callback=_schedule_name)


@click.group()
def schedules() -> None:
    """List, inspect, pause, resume, trigger and remove schedules on a running server."""


@schedules.command("list")
@connection
def list_schedules(client: Client, as_json: bool) -> None:
    """Every schedule: its expression, next and last tick, and the last tick's job."""
    found = client.schedules()
    if as_json:
        click.echo(msgspec.json.encode(found).decode())
    elif found:
        click.echo(_table((_schedule_row(v) for v in found), SCHEDULE_COLUMNS))
    else:
        click.echo("no schedules")


@schedules.command("get")
@connection
@NAME
def get_schedule(client: Client, as_json: bool, name: str) -> None:
    """One schedule: its whole spec, next and last tick."""
    _show_schedule(client.schedule(name), as_json)


@schedules.command("pause")
@connection
@NAME
def pause_schedule(client: Client, as_json: bool, name: str) -> None:
    """Enqueue none of its ticks until it is resumed (durable, on every node)."""
    _show_schedule(client.pause_schedule(name), as_json)


@schedules.command("resume")
@connection
@NAME
def resume_schedule(client: Client, as_json: bool, name: str) -> None:
    """Enqueue its ticks again, from now."""
    _show_schedule(client.pause_schedule(name, paused=False), as_json)


@schedules.command("trigger")
@connection
@NAME
def trigger_schedule(client: Client, as_json: bool, name: str) -> None:
    """Enqueue one job of it now, outside its ticks, and print the job."""
    _detail(client.trigger(name), as_json)


@schedules.command("rm")
@connection
@NAME
def remove_schedule(client: Client, as_json: bool, name: str) -> None:
    """Delete it (the jobs it made stay)."""
    view = client.delete_schedule(name)
    click.echo(msgspec.json.encode(view).decode() if as_json else f"removed schedule {name}")
