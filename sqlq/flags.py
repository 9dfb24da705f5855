"""How a settings field becomes a click option, and the ``--queue NAME=N`` parser.

A field made by ``opt`` carries its click declaration in its metadata;
``options`` turns every field of a settings class into a click option, each
also read from the environment as ``SQLQ_<FLAG>``. ``sqlq.settings`` holds the
fields themselves.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any, TypeVar

import click

from sqlq.common.errors import ValidationError
from sqlq.common.fair import Policy
from sqlq.common.specs import QUEUE_PATTERN, BadJSON, decode, whole_number

F = TypeVar("F", bound=Callable[..., Any])


def opt(default: Any, *decls: str, **click_options: Any) -> Any:
    """A setting: its default, then how it looks on the command line."""
    return dataclasses.field(default=default, metadata={"decls": decls, "click": click_options})


def check_queue_caps(values: tuple[str, ...]) -> tuple[str, ...]:
    """Check ``NAME=N`` values (a click callback, and used again to build the dict)."""
    caps: dict[str, int] = {}
    for value in values:
        name, sep, n = value.partition("=")
        count = whole_number(n)
        if not sep or not re.fullmatch(QUEUE_PATTERN, name) or count is None or count < 1:
            raise click.BadParameter(
                f"{value!r}: expected NAME=N, a queue name and a positive number",
                param_hint="--queue",
            )
        caps[name] = int(n)
    return values


def queue_policies(values: tuple[str, ...]) -> dict[str, Policy]:
    """``NAME=JSON`` values (``--queue-policy``): each queue's policy, as ``PUT
    /queues/{name}`` takes it; a click error naming the flag and the field."""
    policies: dict[str, Policy] = {}
    for value in values:
        name, sep, raw = value.partition("=")
        if not sep or not re.fullmatch(QUEUE_PATTERN, name):
            raise click.BadParameter(
                f"{value[:80]!r}: expected NAME=JSON, a queue name and its policy",
                param_hint="--queue-policy",
            )
        try:
            policies[name] = decode(raw.encode(), Policy)
        except (ValidationError, BadJSON) as exc:
            raise click.BadParameter(f"{name}: {exc}", param_hint="--queue-policy") from None
    return policies


def check_queue_names(values: tuple[str, ...], flag: str) -> tuple[str, ...]:
    """Check that each of ``values`` is a queue name (a click callback)."""
    for value in values:
        if not re.fullmatch(QUEUE_PATTERN, value):
            raise click.BadParameter(
                f"{value[:80]!r}: not a queue name (1-64 of A-Z a-z 0-9 _ . : -)", param_hint=flag
            )
    return values


def queue_caps(values: tuple[str, ...]) -> dict[str, int]:
    return {name: int(n) for name, _, n in (v.partition("=") for v in check_queue_caps(values))}


def options(cls: type[Any]) -> Callable[[F], F]:
    """Click options for every field of ``cls``, each also read from ``SQLQ_<FLAG>``."""

    def decorate(fn: F) -> F:
        for f in reversed(dataclasses.fields(cls)):
            decls: tuple[str, ...] = f.metadata["decls"]
            flag = decls[0].split("/")[0].removeprefix("--")
            extra = dict(f.metadata["click"])
            extra.setdefault("show_default", True)
            fn = click.option(
                *decls,
                f.name,
                default=f.default,
                envvar="SQLQ_" + flag.upper().replace("-", "_"),
                **extra,
            )(fn)
        return fn

    return decorate
