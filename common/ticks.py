"""Tick arithmetic: when a schedule's ticks fall, and which of the due ones to enqueue.

Pure functions of a spec, a cursor and a time (no clock, no I/O), so they are tested
on plain numbers, DST zones included. Ticks are whole unix seconds.

``every_s`` ticks are the whole multiples of ``every_s`` since the epoch: arithmetic, no
zone, and every node and restart agrees on them. ``cron`` ticks are read in ``spec.tz``
by cronsim (research of issue 21: it handles the DST cases croniter gets wrong), with
these rules:

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

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from sqlq.common.errors import ValidationError, clip
from sqlq.common.schedule import CatchUp, ScheduleSpec

# A tick overdue by at most this is on time, not missed: it is enqueued under every
# policy, ``skip`` and a ``catch_up_window_s`` below it included. The evaluator sleeps
# until the tick, but a loaded event loop, a batch ahead of it in the store's writer and
# a shared store's round trip wake it late by a few hundred ms, and a GC pause or a
# busy 2-core host by a second or two; 5 s covers that with room while staying far
# below any real downtime (the shortest cron period is 60 s). Only the newest due tick
# can be on time: the ones before it fell due while nothing acted on them (a 3 s stall
# with every_s=1 is a 3 s downtime: ``latest`` enqueues one tick).
ON_TIME_S = 5

# A cron plan walks back from now at most this many ticks beyond the ones it enqueues
# to count the skipped ones (cronsim costs ~12 us a tick for ``* * * * *``, ~70 us for a
# daily one, so one plan stays within a few ms whatever the downtime). Beyond it
# ``Plan.skipped`` is a lower bound. ``every_s`` counts are always exact (arithmetic).
WALK_LIMIT = 200

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
        next(_moments(normal, ZoneInfo("UTC"), int(_PROBE.timestamp()), reverse=False))
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


def next_tick(spec: ScheduleSpec, after: int) -> int:
    """The first tick of ``spec`` strictly after ``after``.

    cronsim starts from a wall time and drops its ``fold``: from the second copy of a
    repeated hour it can return a tick at or before ``after`` (research, issue 21), so
    those are passed over (at most the ticks of one repeated hour). ``LookupError`` if
    there is none within 50 years (cronsim's horizon; parse_cron refuses expressions
    with no tick in the 50 years after 2000, so only a far-off ``after`` can meet it)."""
    if spec.every_s is not None:
        return (after // spec.every_s + 1) * spec.every_s
    for tick in _moments(*_cron(spec), after, reverse=False):
        if tick > after:
            return tick
    raise LookupError(f"no tick of {spec.cron!r} in the 50 years after {after}")


def prev_tick(spec: ScheduleSpec, at: int) -> int:
    """The newest tick of ``spec`` at or before ``at``.

    cronsim's reverse walk from the second copy of a repeated hour would skip the
    first copy's ticks (they lie later in wall time), so its answer is carried forward
    with ``next_tick`` while that stays at or before ``at``. ``LookupError`` if there is
    none in the 50 years before ``at``."""
    if spec.every_s is not None:
        return at // spec.every_s * spec.every_s
    back = _moments(*_cron(spec), at + 1, reverse=True)
    try:
        tick = next(back)
        while tick > at:  # defensive: a gap moves a tick forward
            tick = next(back)
    except StopIteration:
        raise LookupError(f"no tick of {spec.cron!r} in the 50 years before {at}") from None
    try:
        while (later := next_tick(spec, tick)) <= at:
            tick = later
    except LookupError:  # nothing after it for 50 years: it is the newest
        pass
    return tick


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do with the ticks in ``(cursor, now]``."""

    enqueue: list[int]  # ticks to enqueue, oldest first
    skipped: int  # due ticks the catch-up policy passes over (counted in the metrics)
    cursor: int  # the newest due tick: where the cursor is once the plan is carried out


def plan(spec: ScheduleSpec, cursor: int, now: float) -> Plan:
    """The due ticks, ``(cursor, now]``, under ``spec.catch_up``.

    The newest due tick is enqueued if it is on time (overdue by at most ``ON_TIME_S``),
    whatever the policy. Otherwise ``latest`` enqueues it if it is overdue by at most
    ``catch_up_window_s``, ``all`` enqueues the newest ``max_catch_up`` due ticks and
    ``skip`` none. ``skipped`` is the due ticks not enqueued: exact for ``every_s``; for
    cron the walk back from now stops ``WALK_LIMIT`` ticks past the ones enqueued, and
    beyond that ``skipped`` is a lower bound. The work is bounded whatever the downtime:
    every_s is arithmetic; cron walks ``WALK_LIMIT + 1`` ticks (a few ms), or under
    ``all`` ``max(max_catch_up, WALK_LIMIT) + 1`` (0.12 s for 10,000 of ``* * * * *``)."""
    top = math.floor(now)
    if top <= cursor:
        return Plan([], 0, cursor)
    try:
        newest = prev_tick(spec, top)
    except LookupError:  # none in the 50 years before now: nothing worth planning
        return Plan([], 0, cursor)
    if newest <= cursor:
        return Plan([], 0, cursor)
    late = now - newest
    if spec.catch_up == CatchUp.ALL:
        want = spec.max_catch_up
    elif late <= ON_TIME_S or (spec.catch_up == CatchUp.LATEST and late <= spec.catch_up_window_s):
        want = 1
    else:
        want = 0
    if spec.every_s is not None:
        step = spec.every_s
        due = newest // step - cursor // step
        take = min(want, due)
        return Plan([newest - i * step for i in range(take - 1, -1, -1)], due - take, newest)
    ticks = _walk_back(spec, cursor, newest, max(want, WALK_LIMIT) + 1)
    take = min(want, len(ticks))
    return Plan(ticks[:take][::-1], len(ticks) - take, newest)


def _walk_back(spec: ScheduleSpec, cursor: int, newest: int, limit: int) -> list[int]:
    """The cron ticks in ``(cursor, newest]``, newest first, at most ``limit`` of them;
    ``newest`` is a tick. cronsim's wall-time walk yields each wall time once (a
    repeat's first copy); a result not below the last one (the gap's wall times
    fold into one instant) is passed over, so the list strictly descends."""
    out = [newest]
    back = _moments(*_cron(spec), newest, reverse=True)
    while len(out) < limit:
        tick = next(back, None)
        if tick is None:  # no tick in the 50 years before
            break
        if tick <= cursor:
            break
        if tick < out[-1]:
            out.append(tick)
    return out


def describe(expr: str | int | ScheduleSpec) -> str:
    """A schedule in words, for the dashboard: a cron expression (a ``str``) through
    cron-descriptor, in 24-hour format (imported here, so only a process that renders
    one loads it); an ``every_s`` (an ``int``) as a plain phrase; a spec as whichever
    it has. ``ValidationError("cron", ...)`` for an expression ``parse_cron`` refuses:
    cron-descriptor itself describes ``61 * * * *`` as "At 61 minutes past the hour"."""
    if isinstance(expr, ScheduleSpec):
        if expr.every_s is not None:
            return describe(expr.every_s)
        return describe(expr.cron or "")
    if isinstance(expr, int):
        return _every(expr)
    normal = parse_cron(expr)
    try:
        from cron_descriptor import ExpressionDescriptor, Options  # type: ignore[import-untyped]

        options = Options()
        options.use_24hour_time_format = True
        return str(ExpressionDescriptor(normal, options).get_description())
    except Exception:  # a valid expression it cannot word (cronsim reads more): show it
        return normal


def _every(seconds: int) -> str:
    for size, unit, one in ((86400, "d", "day"), (3600, "h", "hour"), (60, "min", "minute")):
        if seconds % size == 0:
            n = seconds // size
            return f"every {one}" if n == 1 else f"every {n} {unit}"
    return "every second" if seconds == 1 else f"every {seconds} s"


def _cron(spec: ScheduleSpec) -> tuple[str, ZoneInfo]:
    if spec.cron is None:
        raise ValidationError("cron", "give exactly one of cron and every_s")
    return spec.cron, ZoneInfo(spec.tz)  # ZoneInfo caches its keys


def _moments(expr: str, zone: ZoneInfo, start: int, reverse: bool) -> Iterator[int]:
    """cronsim's ticks of ``expr`` from ``start`` (strictly after it, or strictly before
    it with ``reverse``) as unix seconds, with ``_for_cronsim``'s corrections."""
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
