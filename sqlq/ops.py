"""Operator commands: ``sqlq jobs ...`` and ``sqlq submit`` over ``sqlq.Client``
(``sqlq schedules ...`` is ``sqlq.ops_schedules``, on the same footing).

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

from sqlq.client import DEFAULT_URL, ApiError, Client, Job
from sqlq.common.specs import CancelSpec, error_field

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
            built = Client(url, token=token, retries=1)
        except ValueError as exc:  # (the only value it checks: the token)
            raise click.BadParameter(str(exc), param_hint="--token") from None
        try:
            with built as client:
                return fn(client, as_json, **kwargs)
        except ApiError as exc:
            where = f" ({exc.field})" if exc.field else ""
            raise click.ClickException(f"{exc.message}{where}") from exc

    return run  # type: ignore[return-value]


def _row(job: Job) -> list[str]:
    when = datetime.fromtimestamp(job.updated_at, UTC).strftime("%Y-%m-%d %H:%M:%S")
    error = (job.last_error or "").replace("\n", " ")
    return [job.id, job.kind, job.queue, job.state.value, str(job.attempts), when, error[:50]]


def stamp(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def table(rows: Iterable[list[str]], columns: tuple[str, ...] = COLUMNS) -> str:
    rows = [list(columns), *rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def _show(jobs: list[Job], as_json: bool) -> None:
    if as_json:
        click.echo(msgspec.json.encode([msgspec.to_builtins(j) for j in jobs]).decode())
    elif jobs:
        click.echo(table(_row(j) for j in jobs))
    else:
        click.echo("no jobs")


def show_job(job: Job, as_json: bool) -> None:
    if as_json:
        click.echo(msgspec.json.encode(job).decode())
        return
    for name, value in msgspec.to_builtins(job).items():
        if name == "progress" and value is not None:
            value = _progress(job)
        elif name == "errors":
            value = f"{len(job.errors)} (newest last)" if job.errors else "none"
        elif name == "checkpoint" and value is not None:
            value = f"{len(msgspec.json.encode(value))} bytes of JSON"
        click.echo(f"{name:>19}  {json.dumps(value) if not isinstance(value, str) else value}")
    for e in job.errors:
        click.echo(f"{'':>19}  attempt {e.attempt} at {stamp(e.at)}: {_line(e.error)}")


def _progress(job: Job) -> str:
    p = job.progress
    assert p is not None
    said = [f"{p.percent:.0f}%" if p.percent is not None else "", p.message or ""]
    return f"{' '.join(x for x in said if x) or '-'} (at {stamp(p.at)})"


def _line(text: str, limit: int = 200) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    show_job(client.get(job_id), as_json)


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
        show_job(client.retry(job_id), as_json)
        return
    n = client.retry_all(state="dead", kind=kind, queue=queue)
    click.echo(json.dumps({"retried": n}) if as_json else f"retried {n} dead jobs")


@jobs.command("cancel")
@connection
@click.argument("job_id", required=False)
@click.option("--force", is_flag=True, help="A running job: cut it off after the grace too.")
@click.option("--state", type=click.Choice(["scheduled", "running"]), help="Bulk: these only.")
@click.option("--kind", help="Bulk: jobs of this kind.")
@click.option("--queue", help="Bulk: jobs of this queue.")
@click.option("--all", "everything", is_flag=True, help="Bulk: every live job (no filter).")
def cancel_jobs(
    client: Client,
    as_json: bool,
    job_id: str | None,
    force: bool,
    state: str | None,
    kind: str | None,
    queue: str | None,
    everything: bool,
) -> None:
    """Cancel a job (or, with --state/--kind/--queue/--all, every live one that matches).

    One that has not started is cancelled; for a running one a cancel is asked for, and
    it ends cancelled when its handler stops (--force: or when the server's
    --cancel-grace runs out)."""
    bulk = state is not None or kind is not None or queue is not None or everything
    if (job_id is None) == (not bulk):
        raise click.UsageError("give a JOB_ID or --state/--kind/--queue/--all, not both")
    if job_id is not None:
        job = client.cancel(job_id, force=force)
        if as_json:
            show_job(job, as_json)
        elif job.state.value == "running":
            how = "; cut off after the grace if it has not stopped" if force else ""
            click.echo(f"cancel requested for job {job.id}: it is running, and ends cancelled "
                       f"when its handler stops{how}")  # fmt: skip
        else:
            click.echo(f"job {job.id} is {job.state.value}")
        return
    if force:
        raise click.UsageError("--force is for one JOB_ID, not a bulk cancel")
    filters = _cancel_filters(state, kind, queue)
    cancelled, requested = client.cancel_matching(**filters)
    if as_json:
        click.echo(json.dumps({"cancelled": cancelled, "requested": requested}))
    else:
        click.echo(f"cancelled {cancelled} scheduled jobs; asked {requested} running jobs "
                   "to stop")  # fmt: skip


def _cancel_filters(state: str | None, kind: str | None, queue: str | None) -> dict[str, Any]:
    """The bulk cancel's filters, checked here as the server checks them (``CancelSpec``):
    a message naming the flag, not a round trip."""
    given = {
        k: v for k, v in {"state": state, "kind": kind, "queue": queue}.items() if v is not None
    }  # fmt: skip (``--kind ""`` is refused, not "every kind")
    try:
        msgspec.convert(given, CancelSpec)
    except msgspec.ValidationError as exc:
        field, message = error_field(str(exc))
        raise click.BadParameter(message, param_hint=f"--{field}") from None
    return given


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
    show_job(client.submit(kind, args, **options), as_json)
