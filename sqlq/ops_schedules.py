"""Operator commands for schedules: ``sqlq schedules ...``, over ``sqlq.Client``, as
``sqlq.ops`` has them for jobs (same --url, --token, --json and messages)."""

from __future__ import annotations

import json
from datetime import UTC, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import click
import msgspec

from sqlq.client import Client
from sqlq.common.errors import ValidationError
from sqlq.common.schedule import check_name
from sqlq.common.wire import ScheduleView
from sqlq.ops import connection, show_job, stamp, table

SCHEDULE_COLUMNS = ("name", "when", "tz", "kind", "next", "last_tick", "last_job", "paused")


def _when(view: ScheduleView) -> str:
    spec = view.spec
    return spec.cron if spec.cron is not None else f"every {spec.every_s} s"


def _zone(name: str) -> tzinfo:
    """The schedule's own zone, in which its ticks are read (UTC, labelled ``Z``, if this
    machine lacks the zone the server knew)."""
    if name in ("UTC", "Etc/UTC"):
        return UTC  # (written Z, as every other time the CLI prints in UTC)
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return UTC


def _schedule_row(view: ScheduleView) -> list[str]:
    """The next and last ticks in the schedule's zone, with its offset: beside a
    ``Europe/Berlin`` column, ``09:00:00+01:00``, not an unlabelled UTC ``08:00``."""
    last = view.last_job
    job = "-" if last is None else f"{last.id} ({last.state.value if last.state else 'pruned'})"
    spec = view.spec
    zone = _zone(spec.tz)
    return [view.name, _when(view), spec.tz, spec.kind, stamp(view.next_at, zone),
            stamp(view.last_tick, zone), job, "yes" if spec.paused else "no"]  # fmt: skip


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
        click.echo(table((_schedule_row(v) for v in found), SCHEDULE_COLUMNS))
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
    show_job(client.trigger(name), as_json)


@schedules.command("rm")
@connection
@NAME
def remove_schedule(client: Client, as_json: bool, name: str) -> None:
    """Delete it (the jobs it made stay)."""
    view = client.delete_schedule(name)
    click.echo(msgspec.json.encode(view).decode() if as_json else f"removed schedule {name}")
