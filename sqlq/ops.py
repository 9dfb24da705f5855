"""Operator commands: ``sqlq jobs ...`` and ``sqlq submit`` over ``sqlq.Client``
(``sqlq schedules ...`` is ``sqlq.ops_schedules``, on the same footing).

They talk to a running server at ``--url`` (``SQLQ_URL``) with ``--token``
(``SQLQ_TOKEN``), print a table for people and JSON with ``--json`` for
scripts, and turn the server's errors into one-line messages (exit 1), never a
traceback. Times are ISO 8601 with their zone (``Z``: UTC), so none is read in the
wrong one; listings come newest first, where the job running now is.

``--wait`` (``submit``, ``jobs get``) waits for the job to finish and prints it; the
exit status says how it ended, for a script: 0 completed, 3 dead or cancelled
(``FAILED``), 124 still unfinished when ``--timeout`` ran out (``TIMED_OUT``, as
timeout(1) says it); 1 and 2 stay click's (an error, a usage mistake).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, tzinfo
from functools import wraps
from typing import Any, TypeVar

import click
import msgspec

from sqlq.client import DEFAULT_URL, ApiError, Client, Job
from sqlq.common.models import TERMINAL, State
from sqlq.common.running import AttemptError
from sqlq.common.specs import CancelSpec, error_field

F = TypeVar("F", bound=Callable[..., Any])
COLUMNS = ("id", "kind", "queue", "state", "attempts", "updated", "last_error")
# A job's fields that are wall-clock seconds: shown as ISO 8601 (``--json`` keeps numbers).
TIMES = frozenset(
    {"ready_at", "created_at", "updated_at", "started_at", "cancel_requested_at", "lease_until"}
)
FAILED = 3  # --wait: the job ended dead or cancelled
TIMED_OUT = 124  # --wait: --timeout ran out first (timeout(1)'s status)


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
    error = (job.last_error or "").replace("\n", " ")
    return [job.id, job.kind, job.queue, job.state.value, str(job.attempts),
            stamp(job.updated_at), error[:50]]  # fmt: skip


def stamp(ts: float | None, zone: tzinfo = UTC) -> str:
    """``ts`` as ISO 8601 in ``zone`` with the zone written: ``2026-12-04T21:03:16.123Z`` in
    UTC, the offset elsewhere (``2026-12-05T09:00:00+01:00``); milliseconds only when there
    are any (a schedule's ticks are whole seconds). ``-``: none."""
    if ts is None:
        return "-"
    text = datetime.fromtimestamp(ts, zone).isoformat(
        timespec="milliseconds" if ts % 1 else "seconds"
    )
    return text.removesuffix("+00:00") + "Z" if zone is UTC else text


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
        elif name in TIMES and value is not None:
            value = stamp(value)
        click.echo(f"{name:>19}  {json.dumps(value) if not isinstance(value, str) else value}")
    for n, e in enumerate(job.errors, start=1):
        click.echo(f"{'':>19}  attempt {e.attempt} at {stamp(e.at)}: {_line(e.error)}")
        for line in _traceback(e, newest=n == len(job.errors)):
            click.echo(f"{'':>23}{line}")


def _traceback(error: AttemptError, newest: bool) -> list[str]:
    """An ``errors`` entry's traceback as lines to print: the newest entry's in full (the
    failure being diagnosed), an older one's as its size and last line (the same failure,
    most often; ``--json`` has them all). None for an entry without one (an older server's,
    or one whose traceback gave way to newer ones under the job's bound)."""
    text = error.traceback
    if not text:
        return []
    lines = text.rstrip("\n").splitlines()
    if newest:
        return lines
    last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "")
    return [f"(traceback: {len(lines)} lines, ending {_line(last, 120)})"]


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
    "--state",
    type=click.Choice(["scheduled", "running", "completed", "dead", "cancelled", "waiting"]),
)
@click.option("--kind")
@click.option("--queue")
@click.option("--schedule", help="Only the jobs this schedule made.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True)
@click.option("--oldest-first", is_flag=True, help="Oldest first (default: newest first).")
def list_jobs(
    client: Client,
    as_json: bool,
    state: str | None,
    kind: str | None,
    queue: str | None,
    schedule: str | None,
    limit: int,
    oldest_first: bool,
) -> None:
    """Jobs newest first (or --oldest-first), filtered; e.g. --state dead."""
    found: list[Job] = []
    order = "asc" if oldest_first else "desc"
    for job in client.jobs(state=state, kind=kind, queue=queue, schedule=schedule, order=order):
        found.append(job)
        if len(found) >= limit:
            break
    _show(found, as_json)


def waiting(fn: F) -> F:
    """--wait and --timeout: the command's job, once finished (``finish``)."""
    fn = click.option(
        "--timeout",
        type=click.FloatRange(0, 86_400),
        default=None,
        help="Seconds --wait waits [default: 60].",
    )(fn)
    return click.option(
        "--wait",
        is_flag=True,
        help=f"Wait until the job is completed, dead or cancelled, and print it; exit 0 if "
        f"it completed, {FAILED} if dead or cancelled, {TIMED_OUT} if --timeout ran out.",
    )(fn)


def check_wait(wait: bool, timeout: float | None) -> None:
    if timeout is not None and not wait:
        raise click.UsageError("--timeout is for --wait")


def finish(client: Client, job: Job, as_json: bool, wait: bool, timeout: float | None) -> None:
    """Print ``job``; with ``wait``, once it is finished or ``timeout`` ran out, and exit
    with the status that says which (the module's docstring)."""
    if not wait:
        show_job(job, as_json)
        return
    if job.state not in TERMINAL:
        job = client.wait(job.id, 60.0 if timeout is None else timeout)
    show_job(job, as_json)
    if job.state is State.COMPLETED:
        return
    if job.state in TERMINAL:
        click.echo(f"job {job.id} ended {job.state.value}", err=True)
        raise SystemExit(FAILED)
    click.echo(f"job {job.id} is still {job.state.value} (--timeout ran out)", err=True)
    raise SystemExit(TIMED_OUT)


@jobs.command("get")
@connection
@click.argument("job_id")
@waiting
def get_job(client: Client, as_json: bool, job_id: str, wait: bool, timeout: float | None) -> None:
    """One job: its state, args, result, errors (the newest traceback) and every timestamp."""
    check_wait(wait, timeout)
    finish(client, client.get(job_id), as_json, wait, timeout)


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
@click.option(
    "--state", type=click.Choice(["scheduled", "running", "waiting"]), help="Bulk: these only."
)
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
@click.argument("args", required=False)
@click.option("--args", "args_option", default=None, help="The job's args (or ARGS).")
@click.option("--delay-ms", type=click.IntRange(0), default=None)
@click.option("--priority", type=int, default=None)
@click.option("--queue", default=None)
@click.option("--max-attempts", type=click.IntRange(1), default=None)
@click.option("--key", "idempotency_key", default=None, help="An idempotency key.")
@waiting
def submit(
    client: Client,
    as_json: bool,
    kind: str,
    args: str | None,
    args_option: str | None,
    wait: bool,
    timeout: float | None,
    **options: Any,
) -> None:
    """Submit one job of KIND and print it; ARGS, its args, is a JSON object.

    For example: sqlq submit send_email '{"to": "a@example.com"}' --wait"""
    if args is not None and args_option is not None:
        raise click.UsageError("give the args as ARGS or as --args, not both")
    given, where = (args, "ARGS") if args is not None else (args_option or "{}", "--args")
    try:
        decoded = json.loads(given)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=where) from None
    if not isinstance(decoded, dict):
        raise click.BadParameter("must be a JSON object", param_hint=where)
    check_wait(wait, timeout)  # (before the job is made, not after)
    finish(client, client.submit(kind, decoded, **options), as_json, wait, timeout)
