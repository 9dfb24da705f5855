"""Tick arithmetic: when a schedule's ticks fall, and which of the due ones to enqueue.

Pure functions of a spec, a cursor and a time (no clock, no I/O), so they are tested
on plain numbers, DST zones included. Ticks are whole unix seconds.

``every_s`` ticks are the whole multiples of ``every_s`` since the epoch: arithmetic, no
zone, and every node and restart agrees on them. ``cron`` ticks are read in ``spec.tz``
by ``sqlq.common.cron`` (cronsim, and the DST rules in that module's docstring).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from zoneinfo import ZoneInfo

from sqlq.common.cron import moments, parse_cron
from sqlq.common.errors import ValidationError
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


def next_tick(spec: ScheduleSpec, after: int) -> int:
    """The first tick of ``spec`` strictly after ``after``.

    cronsim starts from a wall time and drops its ``fold``: from the second copy of a
    repeated hour it can return a tick at or before ``after`` (research, issue 21), so
    those are passed over (at most the ticks of one repeated hour). ``LookupError`` if
    there is none within 50 years (cronsim's horizon; parse_cron refuses expressions
    with no tick in the 50 years after 2000, so only a far-off ``after`` can meet it)."""
    if spec.every_s is not None:
        return (after // spec.every_s + 1) * spec.every_s
    for tick in moments(*_cron(spec), after, reverse=False):
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
    back = moments(*_cron(spec), at + 1, reverse=True)
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
    back = moments(*_cron(spec), newest, reverse=True)
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
