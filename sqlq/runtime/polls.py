"""The long polls waiting at once: one server-wide budget, shared max-min fairly by principal.

A waiting ``POST /claims`` holds a task, a timer and a slot of ``MAX_WAITING_CLAIMS``
until a job comes or its wait ends. The budget bounds what the server keeps for them;
handed out first come, first served, one worker token confined to one queue could fill
it, and every other principal's long polls would get 503 until those ended.

So a principal that arrives at a full budget takes a slot from whoever holds the most,
if that one holds at least two more than the newcomer: that holder's oldest poll still
waiting is answered empty at once (``Poll.evicted``: a worker that hears no job polls
again, as at the end of any wait), and the newcomer waits in its place. Otherwise the
newcomer is refused (503, retry later): it holds its share already. Whatever one token
does, another principal always gets a poll in, and at a full budget the shares end up
within one of each other. A poll is only taken while it waits (``evictable``), never
while it takes jobs from the queue, so an eviction can never lose a claimed job.

Pure but for ``asyncio.Task.cancel``: the eviction's way into a wait.
"""

from __future__ import annotations

import asyncio

from sqlq.common.errors import StoreUnavailableError

MAX_WAITING_CLAIMS = 1000  # claims long-polling at once, server-wide


class Poll:
    """One waiting claim: its task (which an eviction cancels), whether it is in a wait
    now (the only place one may be taken), and whether it was."""

    __slots__ = ("evictable", "evicted", "task", "who")

    def __init__(self, who: str, task: asyncio.Task[object] | None) -> None:
        self.who, self.task = who, task
        self.evictable = False
        self.evicted = False


class Polls:
    """The budget; ``enter`` a poll before its first wait, ``leave`` after its last."""

    def __init__(self, limit: int | None = None) -> None:
        self._limit = MAX_WAITING_CLAIMS if limit is None else limit
        self._by: dict[str, dict[Poll, None]] = {}  # a principal's polls, oldest first
        self.count = 0

    def held(self, who: str) -> int:
        polls = self._by.get(who)
        return 0 if polls is None else len(polls)

    def enter(self, who: str) -> Poll:
        """A slot for ``who``'s poll, perhaps one taken from the principal that holds the
        most; ``StoreUnavailableError`` (503) if ``who`` holds its share already."""
        if self.count >= self._limit:
            self._evict_for(who)
        poll = Poll(who, asyncio.current_task())
        self._by.setdefault(who, {})[poll] = None
        self.count += 1
        return poll

    def leave(self, poll: Poll) -> None:
        if not poll.evicted:
            self._drop(poll)

    def _drop(self, poll: Poll) -> None:
        polls = self._by[poll.who]
        del polls[poll]
        if not polls:
            del self._by[poll.who]
        self.count -= 1

    def _evict_for(self, who: str) -> None:
        mine = self.held(who)
        # The principals that hold the most first; of each, the oldest poll in a wait (one
        # taking jobs now is never taken from, so look on past a principal with none).
        for name in sorted(self._by, key=lambda n: len(self._by[n]), reverse=True):
            if len(self._by[name]) < mine + 2:
                break
            for poll in self._by[name]:
                if poll.evictable and poll.task is not None:
                    poll.evicted = True
                    self._drop(poll)
                    poll.task.cancel()
                    return
        raise StoreUnavailableError(
            f"{self._limit} claims are waiting already, {mine} of them this principal's; "
            "try again later"
        )
