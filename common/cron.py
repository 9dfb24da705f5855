"""Cron expressions and zones: which are valid, and the moments one names in a zone.

A schedule's spec is checked with these (``schedule.check_spec``) and its ticks are
walked with ``moments`` (``sqlq.common.ticks``); neither needs the spec itself, so both
of those modules build on this one. Moments are whole unix seconds.

Expressions are read by cronsim (research of issue 21: it handles the DST cases
croniter gets wrong), with these rules:

- The hour field names hours (``30 2 * * *``, ``0 9-17 * * *``): wall-time rules. A wall
  time in a DST gap fires once, at the first instant after the gap (02:30 on the spring
  day fires at 03:00), and a wall time that happens twice fires once, in its first copy.
  A ``*`` minute under a named hour (``*/15 2 * * *``) follows the same rules: cronsim
  would walk real time for it (so the gap day had no tick at all), so we hand it the
  equivalent ``0-59/15`` (``_for_cronsim``).
- The hour field starts with ``*`` (``0 * * * *``, ``*/15 * * * *``, ``30 */2 * * *``):
  real time. Such an expression fires in both copies of a repeated hour (02:00 CEST and
  02:00 CET are two hours) and none is lost in a gap: "every 15 minutes" stays so. A
  ``*/n`` hour field is walked minute by minute and filtered here (``_for_cronsim``):
  cronsim's hour-sized steps lose ticks where clocks move by half an hour.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from sqlq.common.errors import ValidationError, clip

MAX_ZONE = 64  # as ScheduleSpec.tz
# IANA keys: letters, digits, ``_ + -``, segments joined by ``/``; no dots, so no path
# tricks (``..``, ``zone.tab``) reach zoneinfo's file lookup.
_ZONE = re.compile(r"[A-Za-z0-9_+-]+(?:/[A-Za-z0-9_+-]+)*")
_FIELDS = "minute hour day-of-month month day-of-week"
_PROBE = datetime(2000, 1, 1, tzinfo=UTC)


def parse_cron(expr: str) -> str:
    """``expr`` normalised if it is a 5-field cron expression (no seconds field, no
    ``@`` aliases); ``ValidationError("cron", why)`` otherwise.

    Normalised: fields upper-cased and joined by one space, so two spellings of one
    expression compare equal. cronsim takes a sixth field as seconds and the
    dashboard's describer takes anything, so the field count is checked here."""
    if not isinstance(expr, str):
        raise ValidationError("cron", "a string of 5 fields")
    fields = expr.split()
    if expr.lstrip().startswith("@"):
        raise ValidationError("cron", "no @ aliases: write the 5 fields (@daily is 0 0 * * *)")
    if len(fields) != 5:
        raise ValidationError(
            "cron", f"exactly 5 fields ({_FIELDS}), not {len(fields)}: {clip(expr, 80)!r}"
        )
    if not expr.isascii() or not all(f.isprintable() for f in fields):
        raise ValidationError("cron", f"ASCII fields only: {clip(expr, 80)!r}")
    normal = " ".join(fields).upper()
    try:
        CronSim(normal, _PROBE)  # the fields as written; then whether it ever fires
        next(moments(normal, ZoneInfo("UTC"), int(_PROBE.timestamp()), reverse=False))
    except CronSimError as exc:
        raise ValidationError("cron", f"{exc}: {clip(expr, 80)!r}") from None
    except StopIteration:
        raise ValidationError("cron", f"no tick in 50 years: {clip(expr, 80)!r}") from None
    except (ValueError, OverflowError, IndexError, KeyError) as exc:  # cronsim's own slips
        raise ValidationError("cron", f"cannot read {clip(expr, 80)!r} ({exc})") from None
    return normal


def check_zone(tz: str) -> str:
    """``tz`` if ``zoneinfo`` knows it; ``ValidationError("tz", why)`` otherwise."""
    if not isinstance(tz, str) or not tz:
        raise ValidationError("tz", "an IANA zone name such as Europe/Berlin")
    if len(tz) > MAX_ZONE or _ZONE.fullmatch(tz) is None:
        raise ValidationError("tz", f"not an IANA zone name: {clip(tz, 80)!r}")
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError, UnicodeError):
        # not found (a KeyError), a file that is no zone (ValueError), a directory
        # (IsADirectoryError) or a name the filesystem refuses (OSError)
        raise ValidationError("tz", f"no such zone: {clip(tz, 80)!r}") from None
    return tz


def moments(expr: str, zone: ZoneInfo, start: int, reverse: bool) -> Iterator[int]:
    """cronsim's ticks of ``expr`` (normalised by ``parse_cron``) from ``start`` (strictly
    after it, or strictly before it with ``reverse``) as unix seconds, with
    ``_for_cronsim``'s corrections."""
    spelt, hours = _for_cronsim(expr)
    for moment in CronSim(spelt, datetime.fromtimestamp(start, zone), reverse=reverse):
        if hours is None or moment.hour in hours:
            yield int(moment.timestamp())


@lru_cache(maxsize=4096)
def _for_cronsim(expr: str) -> tuple[str, frozenset[int] | None]:
    """``expr`` as cronsim is to walk it, and the hours to keep of what it yields.

    A ``*/n`` hour field is walked as ``*`` and its hours are kept here: cronsim steps
    real time an hour at a time to reach a matching hour, which in a zone whose clocks
    move by half an hour (Australia/Lord_Howe) lands on :30 and skips a tick near the
    change, forward and backward differently (``0 */2 * * *`` lost 02:00 +10:30 on
    2026-04-05 going forward, ``30 */3`` lost 00:30 +10:30 on 10-04 going back).
    Walked minute by minute, both directions see every real minute.

    A ``*`` minute is spelt ``0-59`` when the hour field names hours.

    cronsim applies wall-time rules (a gap's wall times fire once after it, a repeated
    one once) only when neither the minute nor the hour field starts with ``*``; else
    it walks real time, which is right for ``*/15 * * * *`` but gives ``*/15 2 * * *``
    no tick on the day 02:00-03:00 does not exist. ``*`` and ``0-59`` match the same
    minutes, so only the DST rule changes."""
    fields = expr.split()
    hours = None
    if fields[1].startswith("*") and fields[1] != "*":
        hours = frozenset(CronSim(expr, _PROBE).hours)
        fields[1] = "*"
    elif fields[0].startswith("*") and not fields[1].startswith("*"):
        fields[0] = ",".join(
            "0-59" + item[1:] if item.startswith("*") else item for item in fields[0].split(",")
        )
    return " ".join(fields), hours
