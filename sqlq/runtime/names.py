"""The queue names ``--max-queues`` bounds, and who may add one: the rule's one home.

Every queue name the runtime knows costs it state (lanes, a census row, metrics
series), so the names are bounded. One pool handed out first come, first served is
one principal's to exhaust: a thousand pauses of made-up names, or live delayed jobs
in a thousand names, and ``default``, the remote queues and every new name would refuse
every submission. So:

- **Fixed names never count and are never refused**: ``default``, every
  ``--remote-queue``, every ``--queue NAME=N`` and ``--queue-policy NAME=...``, every
  schedule the code defines. The configuration bounds them.
- **A schedule's queue is known while the schedule exists**: it counts (it holds a
  name) but a tick or a submission into it is never refused. Creating a schedule in a
  name that does not count yet is admitted as a new name is, so schedules cannot add
  names past the cap.
- **A name counts while it has a live job, a schedule, or a commit in flight** that may
  give it one. A pause of a name with none of them does not count: a paused queue's
  name is kept, but those are bounded apart (``check_pause``: at most ``max_queues``).
- **New names are shared fairly by principal.** Each of the ``principals`` that may
  submit has a share of ``max(1, max_queues // principals)`` names; one may go past its
  share only into room that no other principal's unused share needs. So one token can
  fill at most what the others leave it, and under the cap any principal under its share
  is admitted. A name's owner is the principal whose submission made it count (or a
  remote worker's spawn: its token's); names recovered at a restart, a schedule's, or
  added by this process's own handlers' spawns or a retry have none: they take room but
  no one's share. With one principal (no ``--token-file``) the rule is the
  plain cap.

The per-job path asks ``known`` first: a name with live jobs is a dict lookup.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable

from sqlq.common.errors import ValidationError


class QueueNames:
    """The names that count against ``max_queues``, their owners and the fair shares."""

    def __init__(
        self,
        max_queues: int,
        principals: int,
        fixed: Iterable[str],
        live: Callable[[], Collection[str]],
        paused: Callable[[], Collection[str]],
    ) -> None:
        self.cap = max_queues
        self._principals = max(1, principals)
        self.share = max(1, max_queues // self._principals)
        self.fixed = frozenset(fixed)
        self._live = live  # the queues with a live job now (the claims' view)
        self._paused = paused
        self._pending: Counter[str] = Counter()  # names of commits in flight
        self._scheduled: dict[str, str] = {}  # schedule -> its queue
        self._schedule_queues: Counter[str] = Counter()
        self._owners: dict[str, str] = {}  # a counted name -> the principal that made it

    def fix(self, queues: Iterable[str]) -> None:
        """``queues`` are configured too (the code's schedules): never counted or refused."""
        self.fixed = self.fixed.union(queues)

    # -- what counts ----------------------------------------------------------------------

    def known(self, queue: str) -> bool:
        """Whether a job in ``queue`` adds no name: fixed, live, scheduled or in flight."""
        return (
            queue in self._live()
            or queue in self.fixed
            or queue in self._schedule_queues
            or queue in self._pending
        )

    def counted(self) -> set[str]:
        """The names that count against the cap now."""
        names = {*self._live(), *self._schedule_queues, *self._pending}
        names.difference_update(self.fixed)
        return names

    def used(self) -> int:
        return len(self.counted())

    # -- admitting a name -------------------------------------------------------------------

    def check_new(self, field: str, who: str | None, more: int = 0) -> None:
        """One more name, for ``who`` (None: no principal's, as a spawn's), with ``more``
        already counted in this request: ``ValidationError`` naming ``field`` unless it
        fits the cap and ``who``'s fair share."""
        counted = self.counted()
        total = len(counted) + more
        if total + 1 <= self.cap:
            if who is None:
                return
            owned = self._owned(counted)
            mine = owned.get(who, 0) + more
            if mine < self.share:
                return  # under its share: the cap is all it needs
            others = [n for q, n in owned.items() if q != who]
            unused = (self._principals - 1) * self.share - sum(min(self.share, n) for n in others)
            if total + 1 + max(0, unused) <= self.cap:
                return
            if self._principals > 1:
                raise ValidationError(
                    field, f"would be one more queue than this principal's share of "
                    f"--max-queues ({mine} of {self.cap}, shared by {self._principals}); use "
                    "an existing queue, or wait for one to empty",
                )  # fmt: skip
        raise ValidationError(
            field, f"would be one more than --max-queues ({self.cap}) queues with live jobs "
            "or a schedule; use an existing queue, or wait for one to empty",
        )  # fmt: skip

    def _owned(self, counted: set[str]) -> Counter[str]:
        """Names owned by each principal now; an owner's name that stopped counting is
        forgotten here (the view drops a queue when its last live job ends)."""
        owners = self._owners
        for name in [n for n in owners if n not in counted]:
            del owners[name]
        return Counter(owners.values())

    def hold(self, names: Iterable[str], who: str | None) -> None:
        """Count ``names`` while the commit that may add them runs, owned by ``who``."""
        for name in names:
            self._pending[name] += 1
            if who is not None:
                self._owners.setdefault(name, who)

    def let_go(self, names: Iterable[str]) -> None:
        pending = self._pending
        for name in names:
            pending[name] -= 1
            if pending[name] <= 0:
                del pending[name]

    # -- pauses and schedules ---------------------------------------------------------------

    def check_pause(self, queue: str) -> None:
        """A pause of a name that does not count keeps it anyway: at most ``cap`` of those."""
        if self.known(queue) or queue in self._paused():
            return
        counted = self.counted()
        idle = sum(1 for q in self._paused() if q not in counted and q not in self.fixed)
        if idle + 1 > self.cap:
            raise ValidationError(
                "queue", f"would be one more than --max-queues ({self.cap}) paused queues "
                "that hold no job; resume one first",
            )  # fmt: skip

    def check_policy(self, queue: str, policies: Collection[str]) -> None:
        """A policy keeps its queue's name too: at most ``cap`` queues with one."""
        if queue in policies or queue in self.fixed:
            return
        if len(policies) + 1 > self.cap:
            raise ValidationError(
                "queue", f"would be one more than --max-queues ({self.cap}) queues with a "
                "policy; drop one first",
            )  # fmt: skip

    def scheduled(self, name: str, queue: str | None) -> None:
        """Schedule ``name`` now puts its jobs in ``queue`` (None: it is gone)."""
        was = self._scheduled.pop(name, None)
        if was is not None:
            self._schedule_queues[was] -= 1
            if self._schedule_queues[was] <= 0:
                del self._schedule_queues[was]
        if queue is not None:
            self._scheduled[name] = queue
            self._schedule_queues[queue] += 1

    def schedules_are(self, queues: dict[str, str]) -> None:
        """Every schedule as listed now, by name: its queue."""
        for name in [n for n in self._scheduled if n not in queues]:
            self.scheduled(name, None)
        for name, queue in queues.items():
            if self._scheduled.get(name) != queue:
                self.scheduled(name, queue)
