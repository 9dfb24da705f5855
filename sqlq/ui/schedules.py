"""The Schedules page's rows: each schedule's view, its expression and that expression in
words (``sqlq.common.ticks.describe``), a page of them at a time in name order.

The words are cached per expression: the page refreshes every second, many schedules
share an expression, and what it says does not change.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sqlq.common.errors import ValidationError
from sqlq.common.schedule import Schedule, ScheduleSpec
from sqlq.common.wire import ScheduleView

PAGE_SIZE = 50


@dataclass(frozen=True, slots=True)
class Row:
    view: ScheduleView
    expression: str  # as given: the cron expression, or "every_s: N"
    words: str


@functools.lru_cache(maxsize=1024)
def _words(timing: str | int) -> str:
    from sqlq.common import ticks  # the cron libraries load only where schedules are shown

    try:
        return ticks.describe(timing)
    except ValidationError:  # stored by another version, say: the page shows it as it is
        return str(timing)


def in_words(spec: ScheduleSpec) -> tuple[str, str]:
    """The expression and what it says (``ticks.describe``)."""
    if spec.cron is not None:
        return spec.cron, _words(spec.cron)
    return f"every_s: {spec.every_s}", _words(spec.every_s or 0)


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
