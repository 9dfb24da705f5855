"""Tick arithmetic: when a schedule's ticks fall, and which of the due ones to enqueue.

Pure functions of a spec, a cursor and a time (no clock, no I/O), so they are tested
on plain numbers, DST zones included. Ticks are whole unix seconds.

TO BE WRITTEN (the signatures below are the contract the rest of the code uses).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlq.common.schedule import ScheduleSpec


def parse_cron(expr: str) -> str:
    """``expr`` normalised if it is a 5-field cron expression (no seconds field, no
    ``@`` aliases); ``ValidationError("cron", why)`` otherwise."""
    raise NotImplementedError


def check_zone(tz: str) -> str:
    """``tz`` if ``zoneinfo`` knows it; ``ValidationError("tz", why)`` otherwise."""
    raise NotImplementedError


def next_tick(spec: ScheduleSpec, after: int) -> int:
    """The first tick of ``spec`` strictly after ``after``."""
    raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do with the ticks in ``(cursor, now]``."""

    enqueue: list[int]  # ticks to enqueue, oldest first
    skipped: int  # due ticks the catch-up policy passes over (counted in the metrics)
    cursor: int  # the newest due tick: where the cursor is once the plan is carried out


def plan(spec: ScheduleSpec, cursor: int, now: float) -> Plan:
    """The due ticks, ``(cursor, now]``, under ``spec.catch_up``."""
    raise NotImplementedError
