"""walq's recovery rule for schedules: a cursor is never behind its schedule's jobs.

A tick is one commit call, so one change record holds its cursor's advance and its
job, and a torn tail drops both or neither: folding the log leaves no job ahead of
its cursor. The rule is the safety net for what the fold alone would not catch: a
job of ``sched:<name>:<tick>`` whose tick is past the cursor (a put that replaced
the record with an older cursor, say). Left so, the evaluator would enqueue that
tick again; the promise is at most one job per tick. So after the fold, a
schedule's cursor is the later of its own and the newest tick among its jobs, and
never earlier.

The fix is a change like any other (``AdvanceSchedule``, from the folded cursor
and version), which ``WalStore`` folds and appends as one record before it takes
commits: the next recovery folds the same history to the same cursor, and a later
advance (fenced on the fixed cursor) replays against exactly what it saw.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlq.common.schedule import KEY_PREFIX, AdvanceSchedule, Schedule, schedule_of


def cursor_fixes(
    schedules: Mapping[str, Schedule], keys: Mapping[str, str]
) -> list[AdvanceSchedule]:
    """The advances that bring each schedule's cursor up to the newest tick among its
    jobs (``keys``: idempotency key -> job id, every job recovery holds), in name order;
    none for a schedule whose cursor is already there or later. The newest tick's job
    becomes ``last_job``, as it would have if its own advance had been kept. A
    triggered job (no tick) and a job of a schedule that is gone move nothing."""
    if not schedules:
        return []  # no pass over the keys for a store without schedules
    newest: dict[str, tuple[int, str]] = {}
    for key, job_id in keys.items():
        if not key.startswith(KEY_PREFIX):
            continue
        name, tick = schedule_of(key) or ("", None)
        if tick is None or name not in schedules:
            continue
        if name not in newest or tick > newest[name][0]:
            newest[name] = (tick, job_id)
    fixes = []
    for name in sorted(newest):
        tick, job_id = newest[name]
        current = schedules[name]
        if tick > current.cursor:
            fixes.append(
                AdvanceSchedule(
                    name=name,
                    expect_version=current.version,
                    expect_cursor=current.cursor,
                    cursor=tick,
                    job=job_id,
                )
            )
    return fixes


def fix_note(fix: AdvanceSchedule) -> str:
    """What recovery says (in its notes and the log) of a cursor the rule moved."""
    return f"schedule {fix.name}: cursor {fix.expect_cursor} -> {fix.cursor}, its newest job's tick"
