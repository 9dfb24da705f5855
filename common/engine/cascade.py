"""The walk of a workflow member's end (or revival) down its graph, over any engine's view.

``Job.after_parent`` is the rule for one child; this is the walk around it, written once
for every engine that stores a flow: the memory engine and walq walk their ``JobIndex``
(what a batch staged, over what is committed), SQLite its own tables inside the parent's
transaction. An engine gives three things: a job's children, a job as it stands now
(what the same commit wrote before included), and what to do with a child's move.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

from sqlq.common.errors import IllegalTransitionError
from sqlq.common.models import TERMINAL, Job, State, Transition
from sqlq.common.store import Cascaded, CascadeObserver
from sqlq.common.workflow import Ended, ending, settles_failure

log = logging.getLogger(__name__)

Current = Callable[[str], Job | None]  # a job by id as it stands in the commit; None: gone
Put = Callable[[Job, Job, Transition], None]  # a child before, after, and the move between


def state_of(current: Current) -> Callable[[str], str | None]:
    """The state's value of a job by id, as ``after_parent`` and ``recount`` read it."""

    def of(job_id: str) -> str | None:
        job = current(job_id)
        return None if job is None else job.state.value

    return of


def walk(
    old: Job,
    new: Job,
    children: Callable[[str], Iterable[str]],
    current: Current,
    put: Put,
) -> None:
    """What a workflow member's move from ``old`` to ``new`` does to its waiting children,
    and theirs in turn (a cancel goes down the cone), each move handed to ``put`` as it
    is made, so ``current`` sees it next. Only an end (into completed, dead or cancelled)
    or a revival (out of dead or cancelled) moves anything."""
    of = state_of(current)
    work = [(old, new)]
    while work:
        old, new = work.pop()
        if new.state in TERMINAL and old.state not in TERMINAL:
            ended: Ended | None = ending(new.state.value, new.flow)
        elif old.state in TERMINAL and new.state not in TERMINAL:
            ended = None  # revived
        else:
            continue
        for child_id in children(new.id):
            child = current(child_id)
            if child is None:
                continue
            t = child.after_parent(ended, new.updated_at, of)
            if t is None:
                continue
            moved = child.apply(t)
            put(child, moved, t)
            if moved.state is State.CANCELLED or child.state is State.CANCELLED:
                work.append((child, moved))  # down the cone: cancelled, or revived


def check_revival(job: Job, current: Current) -> None:
    """A workflow member revived on its own (an operator's retry) may run only if every
    parent has settled for it (``recount``); else it is refused, naming the parent to
    retry instead. (A revived parent revives its cancelled cone itself: ``walk``.)"""
    assert job.flow is not None
    for parent_id in job.flow.parents:
        parent = current(parent_id)
        state = None if parent is None else parent.state
        if state is State.COMPLETED or (
            state in (State.DEAD, State.CANCELLED) and settles_failure(job.flow)
        ):
            continue
        if state in (State.DEAD, State.CANCELLED):
            then = "a workflow's job runs only after its parents: retry that one first"
        else:
            then = "a workflow's job runs only once its parents have completed"
        what = "gone" if state is None else state.value
        raise IllegalTransitionError(job.id, f"its parent {parent_id} is {what}: {then}")


def revived_alone(old: Job, new: Job) -> bool:
    """Whether ``new`` is a member with parents brought back out of an end by a move of
    its own (``check_revival`` then applies)."""
    return (
        new.flow is not None
        and bool(new.flow.parents)
        and old.state in TERMINAL
        and new.state not in TERMINAL
    )


def tell(observer: CascadeObserver | None, moves: Sequence[Cascaded]) -> None:
    """Tell ``observer`` of a durable commit's cascade. What it raises is logged, never
    raised: the commit is durable, and its callers must hear so."""
    if moves and observer is not None:
        try:
            observer(moves)
        except Exception:
            log.exception("the cascade's observer failed; the commit stands")
