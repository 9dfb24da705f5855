"""The Schedules page's rows: each schedule's view, its expression and that expression in
words (``sqlq.common.ticks.describe``), a page of them at a time in name order.

The words are cached per expression: the page refreshes every second, many schedules
share an expression, and the description does not change.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sqlq.common.schedule import Schedule, ScheduleSpec
from sqlq.common.wire import ScheduleView

PAGE_SIZE = 50


@dataclass(frozen=True, slots=True)
class Row:
    view: ScheduleView
    expression: str  # as given: the cron expression, or "every_s: N"
    words: str


@functools.lru_cache(maxsize=1024)
def _cron_words(expr: str) -> str:
    from sqlq.common import ticks  # the cron libraries load only where schedules are shown

    try:
        return ticks.describe(expr)
    except Exception:
        return expr


def _seconds_words(n: int) -> str:
    for unit, size in (("day", 86_400), ("hour", 3600), ("minute", 60)):
        if n % size == 0 and n >= size:
            count = n // size
            return f"Every {unit}" if count == 1 else f"Every {count} {unit}s"
    return "Every second" if n == 1 else f"Every {n} seconds"


def in_words(spec: ScheduleSpec) -> tuple[str, str]:
    """The expression and what it says."""
    if spec.cron is not None:
        return spec.cron, _cron_words(spec.cron)
    every = spec.every_s or 0
    return f"every_s: {every}", _seconds_words(every)


async def page(
    schedules: list[Schedule],
    view: Callable[[Schedule], Awaitable[ScheduleView]],
    after: str | None,
) -> tuple[list[Row], str | None]:
    """The rows after the name ``after`` (None: from the first), and the last row's name
    if there may be more. Only the rows shown are made views (each reads its last job),
    so a page refreshed every second costs the same with 50 schedules or 10,000."""
    later = [s for s in schedules if after is None or s.name > after]
    shown = later[:PAGE_SIZE]
    rows = []
    for schedule in shown:
        shown_view = await view(schedule)
        rows.append(Row(shown_view, *in_words(shown_view.spec)))
    return rows, (shown[-1].name if len(later) > PAGE_SIZE else None)
