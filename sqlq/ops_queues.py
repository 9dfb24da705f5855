"""Operator commands for queues: ``sqlq queues ...``, over ``sqlq.Client``, as ``sqlq.ops``
has them for jobs (same --url, --token, --json and messages): the list, a pause, and a
queue's policy (``sqlq.common.fair``: per-key limits and fair claims between keys)."""

from __future__ import annotations

import click
import msgspec

from sqlq.client import Client
from sqlq.common.errors import ValidationError
from sqlq.common.fair import KeyPolicy, Policy
from sqlq.common.specs import BadJSON, decode
from sqlq.common.wire import QueueView
from sqlq.ops import connection, table

COLUMNS = ("queue", "depth", "running", "limit", "paused", "policy")


def _policy_text(view: QueueView) -> str:
    return "" if view.policy is None else msgspec.json.encode(view.policy).decode()


def show(views: list[QueueView], as_json: bool) -> None:
    if as_json:
        click.echo(msgspec.json.encode(views).decode())
        return
    rows = [[v.name, str(v.depth), str(v.running), "" if v.limit is None else str(v.limit),
             "yes" if v.paused else "", _policy_text(v)] for v in views]  # fmt: skip
    click.echo(table(rows, COLUMNS))


def _decoded(raw: str, spec: type[Policy] | type[KeyPolicy]) -> Policy | KeyPolicy:
    """A policy given on the command line, checked as the server checks it; a usage error
    naming the field."""
    try:
        return decode(raw.encode(), spec)  # type: ignore[no-any-return]
    except (ValidationError, BadJSON) as exc:
        raise click.BadParameter(str(exc), param_hint="POLICY") from None


@click.group()
def queues() -> None:
    """List queues, pause them, and set their policies on a running server."""


@queues.command("list")
@connection
def list_queues(client: Client, as_json: bool) -> None:
    """Every queue: its depth, running jobs, cap, pause and policy."""
    show(client.queues(), as_json)


@queues.command("policy")
@connection
@click.argument("queue")
@click.argument("policy")
def policy(client: Client, as_json: bool, queue: str, policy: str) -> None:
    """Set QUEUE's policy to POLICY, JSON as PUT /queues/QUEUE takes it ('{}': none), e.g.
    '{"key_concurrency": 2, "rate": {"per_s": 10, "burst": 1}}'."""
    show([client.set_policy(queue, _decoded(policy, Policy))], as_json)  # type: ignore[arg-type]


@queues.command("key")
@connection
@click.argument("queue")
@click.argument("key")
@click.argument("override", required=False)
@click.option("--drop", is_flag=True, help="Drop KEY's override instead.")
def key(
    client: Client, as_json: bool, queue: str, key: str, override: str | None, drop: bool
) -> None:
    """Set KEY's override of QUEUE's per-key limits, JSON as PUT /queues/QUEUE/keys/KEY
    takes it (e.g. '{"key_concurrency": 5, "weight": 3}'); --drop removes it."""
    if drop == (override is not None):
        raise click.UsageError("give OVERRIDE or --drop, one of them")
    made = None if override is None else _decoded(override, KeyPolicy)
    show([client.set_key_policy(queue, key, made)], as_json)  # type: ignore[arg-type]
