"""Workflows: a graph of jobs, and the one rule of what a parent's end does to a child.

A workflow member with parents starts ``waiting`` and holds a ``Flow``: its workflow,
its parents, how many of them have not settled (``deps_pending``) and its two
policies. When a parent ends, ``after_parent`` says what becomes of each child, and
the engine writes that in the parent's own commit (``JobIndex.stage`` for memory and
walq), so a child is never released early, twice, or never: there is no resolver
that could lag or fire again, only the fenced end of the parent's attempt, which
happens once.

The rule, for each child of a parent that ended:

- the parent **completed**: one fewer pending;
- the parent ended **dead or cancelled**: if the child runs whatever its parents did
  (``run_if`` is ``all_finished`` or ``any_failed``) or its policy is ``run``, the
  parent counts as settled and failed; else ``cancel`` cancels the child (reason
  ``upstream_dead`` or ``upstream_cancelled``), and its own children in turn, down
  the whole cone; and ``wait`` leaves it waiting (its workflow then reads ``stuck``
  until the parent is retried);
- when none is pending, ``run_if`` decides: ``any_failed`` releases the child only
  if some parent failed (else it is cancelled, ``condition_false``); the others
  release it.

Pure, and importing nothing of the job model, which imports it: the runtime, the
engines and the tests reach this rule only through ``Job.after_parent``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from enum import Enum, StrEnum

import msgspec

MAX_PARENTS = 10_000  # a job's fan-in
# The edges of one submitted graph in all: a 1 -> 10,000 -> 1 graph has 20,000; a batch
# of 10,000 jobs each naming 10,000 parents would be 10^8, a gigabyte of ids.
MAX_EDGES = 100_000
MAX_REF = 128  # a ref's length
# A workflow's members kept at once: an append reads them all, and its page lists them.
MAX_MEMBERS = 100_000


class OnParentFailure(StrEnum):
    CANCEL = "cancel"  # cancel this job and its cone (the default)
    RUN = "run"  # the failed parent counts as settled; the job gets its error
    WAIT = "wait"  # stay waiting (the workflow reads ``stuck``) until it is retried


class RunIf(StrEnum):
    ALL_COMPLETED = "all_completed"  # the default: every parent completed
    ALL_FINISHED = "all_finished"  # every parent ended, however (a batch's ``on complete``)
    ANY_FAILED = "any_failed"  # every parent ended, and one or more failed (an ``on failure``)


class CancelReason(StrEnum):
    USER = "user"
    UPSTREAM_DEAD = "upstream_dead"
    UPSTREAM_CANCELLED = "upstream_cancelled"
    CONDITION_FALSE = "condition_false"


class Flow(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """What a workflow member holds besides a job's fields (``Job.flow``; None on a job
    outside every workflow, so those pay one pointer for it)."""

    workflow_id: str
    ref: str | None = None  # its name in the graph it was submitted in
    parents: tuple[str, ...] = ()  # job ids
    deps_pending: int = 0  # parents not settled yet
    failed: int = 0  # parents that ended dead or cancelled and counted as settled
    on_parent_failure: OnParentFailure = OnParentFailure.CANCEL
    run_if: RunIf = RunIf.ALL_COMPLETED
    cancel_reason: CancelReason | None = None  # why it was cancelled, if it was


class FlowChange(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, gc=False):
    """What a transition changes of a member's flow (``Transition.flow``): its counts and
    why it was cancelled, never its parents, which every decrement of a fan-in would
    otherwise write again (10,000 parents: 350 KB a decrement, measured)."""

    deps_pending: int = 0
    failed: int = 0
    cancel_reason: CancelReason | None = None
    # False: the move's author (the runtime, from its copy of the job) says only the reason,
    # and the counts stay as stored: a parent's end in the same commit may have moved them.
    counts: bool = True

    @classmethod
    def of(cls, flow: Flow) -> FlowChange:
        """The counts and reason of ``flow``, as the engine's cascade writes them."""
        return cls(
            deps_pending=flow.deps_pending, failed=flow.failed, cancel_reason=flow.cancel_reason
        )

    @classmethod
    def reason(cls, reason: CancelReason | None) -> FlowChange:
        """A move the runtime makes of a member: its reason only (``counts`` False)."""
        return cls(cancel_reason=reason, counts=False)

    def onto(self, flow: Flow | None) -> Flow | None:
        """``flow`` with this change (None stays None: a job outside every workflow)."""
        if flow is None:
            return None
        if not self.counts:
            return msgspec.structs.replace(flow, cancel_reason=self.cancel_reason)
        return msgspec.structs.replace(
            flow,
            deps_pending=self.deps_pending,
            failed=self.failed,
            cancel_reason=self.cancel_reason,
        )


class Ended(Enum):
    """How a parent ended, as ``after_parent`` reads it."""

    COMPLETED = "completed"
    DEAD = "dead"
    CANCELLED = "cancelled"


class Verdict(Enum):
    """What becomes of a waiting child."""

    WAIT = "wait"  # still waiting (its flow may have changed)
    RELEASE = "release"  # scheduled, due now
    CANCEL = "cancel"  # cancelled, with the flow's ``cancel_reason``


def ending(state: str, flow: Flow | None) -> Ended:
    """How a parent that ended in ``state`` (a terminal state's value) ended, for its
    children: a job cancelled because its cone's root died passes that on, so the whole
    cone of a dead job reads ``upstream_dead``."""
    if state != "cancelled":
        return Ended(state)
    dead_above = flow is not None and flow.cancel_reason is CancelReason.UPSTREAM_DEAD
    return Ended.DEAD if dead_above else Ended.CANCELLED


UPSTREAM = frozenset({CancelReason.UPSTREAM_DEAD, CancelReason.UPSTREAM_CANCELLED})


def recount(flow: Flow, state_of: Callable[[str], str | None]) -> Flow | None:
    """A member's flow made afresh from its parents' states (by id; None: not kept), as a
    revival of its cancelled cone makes it: completed parents settled, failed ones settled
    (and failed) if it counts them so, the rest pending. None: a failed parent it could not
    run after (its policy is ``cancel`` and it runs only after all completed) stays failed,
    so it stays cancelled."""
    settles = settles_failure(flow)
    pending = failed = 0
    for parent in flow.parents:
        state = state_of(parent)
        if state == "completed":
            continue
        if state in ("dead", "cancelled"):
            if not settles:
                if flow.on_parent_failure is OnParentFailure.CANCEL:
                    return None
                pending += 1  # ``wait``: it waits for that parent
                continue
            failed += 1
            continue
        pending += 1
    return msgspec.structs.replace(flow, deps_pending=pending, failed=failed, cancel_reason=None)


def at_birth(flow: Flow) -> Flow:
    """A new member's flow as it is stored, its counts made (``recount``): one none of whose
    parents is pending is judged at once, as a parent's end would judge it
    (``after_parent``): an ``any_failed`` hook none of whose parents failed is cancelled
    (``condition_false``), never run."""
    if flow.deps_pending == 0 and flow.run_if is RunIf.ANY_FAILED and flow.failed == 0:
        return msgspec.structs.replace(flow, cancel_reason=CancelReason.CONDITION_FALSE)
    return flow


def settles_failure(flow: Flow) -> bool:
    """Whether a parent that ended dead or cancelled counts, for this child, as settled
    (and failed): it runs whatever its parents did, or its policy is ``run``. A parent
    retried later is then unsettled again (``Job.after_parent``)."""
    return flow.run_if is not RunIf.ALL_COMPLETED or flow.on_parent_failure is OnParentFailure.RUN


def after_parent(flow: Flow, ended: Ended) -> tuple[Flow, Verdict]:
    """A waiting child's flow and fate after one of its parents ended (the module's rule)."""
    if ended is not Ended.COMPLETED:
        if not settles_failure(flow):
            if flow.on_parent_failure is OnParentFailure.WAIT:
                return flow, Verdict.WAIT
            dead = ended is Ended.DEAD
            reason = CancelReason.UPSTREAM_DEAD if dead else CancelReason.UPSTREAM_CANCELLED
            return msgspec.structs.replace(flow, cancel_reason=reason), Verdict.CANCEL
        flow = msgspec.structs.replace(
            flow, deps_pending=flow.deps_pending - 1, failed=flow.failed + 1
        )
    else:
        flow = msgspec.structs.replace(flow, deps_pending=flow.deps_pending - 1)
    if flow.deps_pending > 0:
        return flow, Verdict.WAIT
    if flow.run_if is RunIf.ANY_FAILED and flow.failed == 0:
        return msgspec.structs.replace(flow, cancel_reason=CancelReason.CONDITION_FALSE), (
            Verdict.CANCEL
        )
    return flow, Verdict.RELEASE


class Overall(StrEnum):
    """A workflow's state, read from its members (``overall``)."""

    RUNNING = "running"  # some member is live, and none is stuck
    STUCK = "stuck"  # a member waits behind a parent that failed (its policy: ``wait``)
    COMPLETED = "completed"  # every member ended, and none failed or was cancelled for it
    FAILED = "failed"  # every member ended, and one died (or was cancelled because one did)
    CANCELLED = "cancelled"  # every member ended, and a user's cancel stopped some


_FAILED_ENDS = frozenset({"dead", "cancelled"})


def retried(
    members: Iterable[tuple[str, str, Flow | None]], state_of: Callable[[str], str | None]
) -> list[str]:
    """The members a workflow's retry revives, from each one's (id, state, flow): every dead
    one whose parents all completed, and every dead one that counts a failed parent as
    settled (``settles_failure``) whose parents all ended, none of its failed ones coming
    back in this retry (revived, or in a cone a revival brings back: it would run beside
    that parent's next attempt). Each comes back with the cone its death cancelled
    (``Job.after_parent``); one a user cancelled stays so."""
    members = list(members)
    out = [
        job_id
        for job_id, state, flow in members
        if state == "dead"
        and (flow is None or all(state_of(p) == "completed" for p in flow.parents))
    ]
    back = set(out)
    reasons = {job_id: flow.cancel_reason for job_id, _, flow in members if flow is not None}
    for job_id, state, flow in members:
        if state != "dead" or flow is None or job_id in back or not settles_failure(flow):
            continue
        ended = [(p, state_of(p)) for p in flow.parents]
        if any(s not in ("completed", "dead", "cancelled") for _, s in ended):
            continue
        failed = [p for p, s in ended if s != "completed"]
        if not any(p in back or reasons.get(p) in UPSTREAM for p in failed):
            out.append(job_id)
    return out


def blocked_by(flow: Flow, state_of: Callable[[str], str | None]) -> list[str]:
    """The parents a waiting member still waits for: every one not completed (a parent
    no longer kept is listed too: from here it cannot be told how it ended)."""
    return [p for p in flow.parents if state_of(p) != "completed"]


def overall(
    members: Iterable[tuple[str, Flow | None]], state_of: Callable[[str], str | None]
) -> Overall:
    """A workflow's state from its members' (state, flow): ``stuck`` if a waiting member has
    a parent that ended dead or cancelled (only ``wait`` leaves one so), else ``running``
    while any member is live; once all ended, ``failed`` if one died or was cancelled
    because one did, ``cancelled`` if a user's cancel stopped one, else ``completed``
    (a hook cancelled as ``condition_false`` is no failure)."""
    live = failed = cancelled = False
    for state, flow in members:
        if state in ("scheduled", "running", "waiting"):
            live = True
            if (
                state == "waiting"
                and flow is not None
                and not settles_failure(flow)
                and any(state_of(p) in _FAILED_ENDS for p in flow.parents)
            ):
                return Overall.STUCK
        elif state == "dead":
            failed = True
        elif state == "cancelled":
            reason = None if flow is None else flow.cancel_reason
            if reason is CancelReason.UPSTREAM_DEAD:
                failed = True
            elif reason is not CancelReason.CONDITION_FALSE:
                cancelled = True
    if live:
        return Overall.RUNNING
    if failed:
        return Overall.FAILED
    return Overall.CANCELLED if cancelled else Overall.COMPLETED


class GraphError(ValueError):
    """A submitted graph that cannot be: ``index`` names the job, ``field`` its field."""

    def __init__(self, index: int, field: str, message: str) -> None:
        super().__init__(message)
        self.index = index
        self.field = field


def plan_graph(refs: Sequence[str | None], depends_on: Sequence[Sequence[str]]) -> list[list[int]]:
    """Each job's parents, as indexes into the batch, from its ``ref`` and ``depends_on``
    (refs of jobs in the same batch); a ``GraphError`` for a duplicate ref, an unknown
    one, a job named twice as a parent, a fan-in past ``MAX_PARENTS``, more than
    ``MAX_EDGES`` edges, or a cycle (naming a job on it).

    Iterative (Kahn's algorithm), so no depth of graph reaches the stack's."""
    by_ref: dict[str, int] = {}
    for i, ref in enumerate(refs):
        if ref is not None:
            if ref in by_ref:
                raise GraphError(i, "ref", f"ref {ref!r} is given to jobs[{by_ref[ref]}] too")
            by_ref[ref] = i
    parents: list[list[int]] = []
    edges = 0
    for i, names in enumerate(depends_on):
        if len(names) > MAX_PARENTS:
            raise GraphError(i, "depends_on", f"more than {MAX_PARENTS} parents")
        edges += len(names)
        if edges > MAX_EDGES:
            raise GraphError(i, "depends_on", f"the graph has more than {MAX_EDGES} edges")
        mine: list[int] = []
        seen: set[int] = set()
        for name in names:
            j = by_ref.get(name)
            if j is None:
                raise GraphError(i, "depends_on", f"no job in this batch has the ref {name!r}")
            if j in seen:
                raise GraphError(i, "depends_on", f"{name!r} is named twice")
            if j == i:
                raise GraphError(i, "depends_on", "a job cannot depend on itself")
            seen.add(j)
            mine.append(j)
        parents.append(mine)
    _acyclic(parents)
    return parents


def _acyclic(parents: list[list[int]]) -> None:
    """Raise a ``GraphError`` naming a job on a cycle, if there is one."""
    n = len(parents)
    children: list[list[int]] = [[] for _ in range(n)]
    pending = [len(p) for p in parents]
    for child, mine in enumerate(parents):
        for parent in mine:
            children[parent].append(child)
    ready = [i for i in range(n) if pending[i] == 0]
    done = 0
    while ready:
        i = ready.pop()
        done += 1
        for child in children[i]:
            pending[child] -= 1
            if pending[child] == 0:
                ready.append(child)
    if done < n:  # every job left has a parent left: walk up them until one repeats
        on, seen = next(i for i in range(n) if pending[i] > 0), set()
        while on not in seen:
            seen.add(on)
            on = next(p for p in parents[on] if pending[p] > 0)
        raise GraphError(on, "depends_on", "the graph has a cycle through this job")
