"""The walk of a workflow member's end (or revival) down its graph, over any engine's view.

``Job.after_parent`` is the rule for one child; this is the walk around it, written once
for every engine that stores a flow: the memory engine and walq walk their ``JobIndex``
(what a batch staged, over what is committed), SQLite its own tables inside the parent's
transaction on the connection's thread, PostgreSQL its tables inside the outcome's
transaction, awaited. So the walk does no I/O itself (``walk`` is a generator): it asks
for a parent's children as they stand in the commit, for the states of a revived
child's parents, and hands over each move to write, and an engine answers with its own
reads and writes (``run`` in a thread, ``run_async`` on the event loop).

The moves between two of the walk's reads are handed over together, before the next read
(and at the walk's end): the read sees them, and an engine that writes set-wise writes a
dead parent's thousands of cancelled children as a few statements, not a few each.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from typing import Any, NamedTuple, cast

from sqlq.common.errors import IllegalTransitionError
from sqlq.common.models import TERMINAL, Job, State, Transition
from sqlq.common.store import Cascaded, CascadeObserver, Change
from sqlq.common.workflow import Ended, ending, recount, settles_failure

log = logging.getLogger(__name__)

_ENDED_FAILED = ("dead", "cancelled")

Current = Callable[[str], Job | None]  # a job by id as it stands in the commit; None: gone
StateOf = Callable[[str], str | None]  # a job's state's value by id; None: gone


class Children(NamedTuple):
    """The walk asks for the children of ``parents`` (the members that ended or were revived
    at one depth of the cone) as they stand in the commit, with their flows (an engine that
    locks rows locks them here, in their ids' order): by parent, each one's in the engine's
    order (the SQL engines': their ids'), a parent with none left out. One read a depth,
    not one a member: a dead root's 10,000 children are one read, then one for all of
    theirs. (What the walk does to a child does not depend on the order it meets it in.)"""

    parents: tuple[str, ...]


class States(NamedTuple):
    """The walk asks for the states of ``ids`` (a revived child's parents, to count
    afresh): their values by id, a job gone left out."""

    ids: tuple[str, ...]


class Move(NamedTuple):
    """The walk moved a child: write ``change`` (``before`` to ``after``) before the walk's
    next read is answered, so that what it asks next sees it (``run_async`` hands the moves
    between two reads over together: ``Put``)."""

    before: Job
    after: Job
    change: Transition


Ask = Children | States | Move
Walk = Generator[Ask, Any, None]
# An engine's write of a walk's moves between two of its reads, in the order made: a depth's
# (a job once for each of its parents that moved at that depth: a fan-in's child, in order).
Put = Callable[[list[Move]], None]


def _nobody(_: str) -> str | None:
    return None


def walk(old: Job, new: Job) -> Walk:
    """What a workflow member's move from ``old`` to ``new`` does to its waiting children,
    and theirs in turn (a cancel goes down the cone): each read it needs and each move it
    makes, yielded for the engine to answer (``run``, ``run_async``), so the one walk serves
    an engine that reads in memory, on a thread or over a network. Only an end (into
    completed, dead or cancelled) or a revival (out of dead or cancelled) moves anything."""
    frontier = [(old, new)]
    latest: dict[str, Job] = {}  # what this walk moved, as it stands: read once, met again
    while frontier:
        ends: list[tuple[Job, Ended | None]] = []
        for old, new in frontier:
            if new.state in TERMINAL and old.state not in TERMINAL:
                ends.append((new, ending(new.state.value, new.flow)))
            elif old.state in TERMINAL and new.state not in TERMINAL:
                ends.append((new, None))  # revived
        if not ends:
            return
        frontier = []
        children: dict[str, list[Job]] = yield Children(tuple(new.id for new, _ in ends))
        # A revived member's cancelled children count their parents afresh: the states of
        # every parent of its children, read once a depth, under what the walk moves since.
        asked = {
            p
            for new, ended in ends
            if ended is None
            for c in children.get(new.id, ())
            if c.flow is not None
            for p in c.flow.parents
        }
        known: StateOf = _nobody
        if asked:
            states: dict[str, str] = yield States(tuple(sorted(asked)))
            known = _current(states, latest)
        for new, ended in ends:
            for read in children.get(new.id, ()):
                child = latest.get(read.id, read)  # (moved already, by a parent before)
                state_of: StateOf = _nobody
                if ended is None and child.flow is not None and child.state is State.CANCELLED:
                    state_of = known
                t = child.after_parent(ended, new.updated_at, state_of)
                if t is None:
                    continue
                moved = latest[child.id] = child.apply(t)
                yield Move(child, moved, t)
                if moved.state is State.CANCELLED or child.state is State.CANCELLED:
                    frontier.append((child, moved))  # down the cone: cancelled, or revived


def _current(states: dict[str, str], latest: dict[str, Job]) -> StateOf:
    """A job's state as ``states`` read it, or as the walk has moved it since (``latest``:
    every move of the walk's is there, so the two together are the commit as it stands)."""

    def state_of(job_id: str) -> str | None:
        job = latest.get(job_id)
        return states.get(job_id) if job is None else job.state.value

    return state_of


def by_parent(children: list[Job], parents: tuple[str, ...]) -> dict[str, list[Job]]:
    """An engine's answer to ``Children``: the ``children`` it read of ``parents`` (each once,
    with its flow, in their ids' order), under each of ``parents`` its flow names, in that
    order. (A flow's parents are its edges: both are written once, when it is made.)"""
    wanted = set(parents)
    out: dict[str, list[Job]] = {}
    for child in children:
        for parent in child.flow.parents if child.flow is not None else ():
            if parent in wanted:
                out.setdefault(parent, []).append(child)
    return out


class _Ready:
    """An engine's answer already there (a thread's reads and writes return values): awaited,
    it gives its value without suspending, so ``run`` drives ``run_async`` to its end in one
    step, in the thread, with no event loop."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __await__(self) -> Generator[Any, None, Any]:
        return self.value
        yield  # pragma: no cover (makes this a generator)


def _ready(fn: Callable[..., Any]) -> Callable[..., _Ready]:
    return lambda arg: _Ready(fn(arg))


def cascade(
    old: Job,
    new: Job,
    children: Callable[[tuple[str, ...]], dict[str, list[Job]]],
    states: Callable[[tuple[str, ...]], dict[str, str]],
    put: Put,
) -> None:
    """``walk`` from ``old`` to ``new``, driven in this thread (``run``)."""
    run(walk(old, new), children, states, put)


async def cascade_async(
    old: Job,
    new: Job,
    children: Callable[[tuple[str, ...]], Awaitable[dict[str, list[Job]]]],
    states: Callable[[tuple[str, ...]], Awaitable[dict[str, str]]],
    put: Callable[[list[Move]], Awaitable[None]],
) -> None:
    """``walk`` from ``old`` to ``new``, each read and write awaited (``run_async``)."""
    await run_async(walk(old, new), children, states, put)


def run(
    steps: Walk,
    children: Callable[[tuple[str, ...]], dict[str, list[Job]]],
    states: Callable[[tuple[str, ...]], dict[str, str]],
    put: Put,
) -> None:
    """Drive ``walk``'s ``steps`` with an engine's reads and writes, in this thread: the one
    driver, ``run_async``, over answers that are already there."""
    driving = run_async(steps, _ready(children), _ready(states), _ready(put))
    try:
        driving.send(None)
    except StopIteration:
        return
    driving.close()
    raise AssertionError("a walk in a thread suspended")  # (every answer is ready)


async def run_async(
    steps: Walk,
    children: Callable[[tuple[str, ...]], Awaitable[dict[str, list[Job]]]],
    states: Callable[[tuple[str, ...]], Awaitable[dict[str, str]]],
    put: Callable[[list[Move]], Awaitable[None]],
) -> None:
    """Drive ``walk``'s ``steps`` with an engine's reads and writes, each awaited: its moves
    kept until it reads again, or ends, then written together (``put``)."""
    answer: Any = None
    moves: list[Move] = []
    while True:
        try:
            ask = steps.send(answer)
        except StopIteration:
            if moves:
                await put(moves)
            return
        answer = None
        if type(ask) is Move:
            moves.append(ask)
            continue
        if moves:
            await put(moves)
            moves = []
        if type(ask) is Children:
            answer = await children(ask.parents)
        else:
            answer = await states(cast(States, ask).ids)


def check_revival(job: Job, state_of: StateOf) -> None:
    """A workflow member revived on its own (an operator's retry) may run only if every
    parent has settled for it (``recount``); else it is refused, naming the parent to
    retry instead. (A revived parent revives its cancelled cone itself: ``walk``.)"""
    assert job.flow is not None
    for parent_id in job.flow.parents:
        state = state_of(parent_id)
        if state == "completed" or (state in _ENDED_FAILED and settles_failure(job.flow)):
            continue
        if state in _ENDED_FAILED:
            then = "a workflow's job runs only after its parents: retry that one first"
        else:
            then = "a workflow's job runs only once its parents have completed"
        what = "gone" if state is None else state
        raise IllegalTransitionError(job.id, f"its parent {parent_id} is {what}: {then}")


def check_member(job: Job, state_of: StateOf) -> None:
    """A new member's counts against its parents as they stand in the commit that stores it
    (a parent stored in the same commit reads as pending): every parent kept, and its
    pending and failed counts what they make (``recount``). The runtime counts them from
    what it read; a parent that ended between that read and this commit makes them
    disagree, and the submission is refused (``IllegalTransitionError``), for the runtime
    to count again, so no parent's end is missed or counted twice. One whose failed parent
    it cannot run after is refused, naming the parent to retry."""
    flow = job.flow
    assert flow is not None
    for parent in flow.parents:
        if state_of(parent) is None:
            raise IllegalTransitionError(job.id, f"its parent {parent} is not kept")
    again = recount(flow, state_of)
    if again is None:
        failed = next(p for p in flow.parents if state_of(p) in _ENDED_FAILED)
        raise IllegalTransitionError(
            job.id, f"its parent {failed} has failed and it would never run: retry that one"
        )
    if (again.deps_pending, again.failed) != (flow.deps_pending, flow.failed):
        raise IllegalTransitionError(job.id, MOVED)


# What a submission makes a member (``Job.new``): only such a one is counted against its
# parents (``check_member``); one stored in any other state is stored as given.
FRESH = frozenset({State.WAITING, State.SCHEDULED})


def counted(changes: Iterable[Change]) -> list[Job]:
    """The new members among ``changes`` that their commit counts against their parents
    (``check_member``): those with parents, as a submission makes them."""
    return [
        c
        for c in changes
        if isinstance(c, Job) and c.flow is not None and c.flow.parents and c.state in FRESH
    ]


# The refusal of a member counted against parents that moved since (``check_member``): the
# runtime reads them again and counts afresh.
MOVED = "its parents moved while it was added"


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
