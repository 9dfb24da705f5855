"""Operator commands for workflows: ``sqlq workflows ...``, over ``sqlq.Client``, as
``sqlq.ops`` has them for jobs (same --url, --token, --json and messages)."""

from __future__ import annotations

import json

import click
import msgspec

from sqlq.client import Client
from sqlq.common.models import is_job_id
from sqlq.common.store import MAX_PAGE
from sqlq.common.wire import WorkflowView
from sqlq.common.workflow import MAX_MEMBERS
from sqlq.ops import connection, table

MEMBER_COLUMNS = ("ref", "id", "kind", "state", "waits_for", "cancel_reason")


def _checked(workflow_id: str) -> str:
    """A workflow's id has a job id's shape: anything else names none (a usage error)."""
    if not is_job_id(workflow_id):
        raise click.BadParameter("a workflow's id: 32 hex digits", param_hint="WORKFLOW_ID")
    return workflow_id


def members(client: Client, workflow_id: str, limit: int) -> WorkflowView:
    """The workflow with up to ``limit`` of its members, page after page (``next``: the
    cursor past the last one shown, if it holds more)."""
    view = client.workflow(workflow_id, limit=min(limit, MAX_PAGE))
    jobs, after = list(view.jobs), view.next
    while after is not None and len(jobs) < limit:
        view = client.workflow(workflow_id, after=after, limit=min(limit - len(jobs), MAX_PAGE))
        jobs.extend(view.jobs)
        after = view.next
    return msgspec.structs.replace(view, jobs=jobs, next=after)  # (the last page's counts)


def show_workflow(view: WorkflowView, as_json: bool) -> None:
    if as_json:
        click.echo(msgspec.json.encode(view).decode())
        return
    counts = ", ".join(f"{n} {state}" for state, n in sorted(view.counts.items()))
    click.echo(f"workflow {view.id}: {view.state.value} ({counts})")
    rows = [
        [m.ref or "-", m.id, m.kind, m.state.value, str(len(m.blocked_by) or ""),
         m.cancel_reason.value if m.cancel_reason else ""]
        for m in view.jobs
    ]  # fmt: skip
    click.echo(table(rows, MEMBER_COLUMNS))
    if view.next is not None:
        total = sum(view.counts.values())
        click.echo(f"(the first {len(view.jobs):,} of {total:,} jobs: --limit shows more)")


@click.group()
def workflows() -> None:
    """Show, cancel and retry workflows (graphs of jobs) on a running server."""


@workflows.command("show")
@connection
@click.argument("workflow_id")
@click.option(
    "--limit",
    type=click.IntRange(1, MAX_MEMBERS),
    default=MAX_PAGE,
    show_default=True,
    help="Its jobs listed, at most (in the order stored).",
)
def show(client: Client, as_json: bool, workflow_id: str, limit: int) -> None:
    """A workflow: its state, its jobs' counts by state, and each job with what it waits for."""
    show_workflow(members(client, _checked(workflow_id), limit), as_json)


@workflows.command("cancel")
@connection
@click.argument("workflow_id")
def cancel(client: Client, as_json: bool, workflow_id: str) -> None:
    """Cancel every job of it that has not started; ask every running one to stop."""
    done = client.cancel_workflow(_checked(workflow_id))
    if as_json:
        click.echo(msgspec.json.encode(done).decode())
    else:
        click.echo(f"cancelled {done.cancelled}; asked {done.requested} running to stop")


@workflows.command("retry")
@connection
@click.argument("workflow_id")
def retry(client: Client, as_json: bool, workflow_id: str) -> None:
    """Run its dead jobs again, with the jobs their deaths cancelled."""
    n = client.retry_workflow(_checked(workflow_id))
    click.echo(json.dumps({"retried": n}) if as_json else f"retried {n} dead jobs")
