"""``Serial``: one job's writes one at a time, in the order they asked.

A remote worker's heartbeat, its checkpoint, its outcome, an operator's cancel and
the lease's expiry may all arrive for one job at once. Each builds its transition
from the job as it stands *at its turn* and writes it whole, so two that overlapped
would undo each other (a heartbeat's lease and a checkpoint's data, say). ``Serial``
gives each key a turn: ``take`` when nobody holds it costs a dict lookup and an
insert (no future, no task); only a writer that finds the key held waits, in FIFO
order. ``give`` hands the turn on. An entry exists only while a key is held, so
a job written once costs nothing after.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Serial:
    def __init__(self) -> None:
        self._held: dict[str, deque[asyncio.Future[None]] | None] = {}  # key -> its waiters

    def busy(self, key: str) -> bool:
        return key in self._held

    def try_take(self, key: str) -> bool:
        """Take ``key``'s turn if nobody holds it (synchronously); False if somebody does."""
        if key in self._held:
            return False
        self._held[key] = None
        return True

    async def take(self, key: str) -> None:
        """Wait for ``key``'s turn (at once if nobody holds it); ``give`` it back after."""
        held = self._held
        if key not in held:
            held[key] = None
            return
        waiters = held[key]
        if waiters is None:
            waiters = held[key] = deque()
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.give(key)  # the turn came as we were cancelled: pass it on
            else:
                waiters.remove(turn)
            raise

    def give(self, key: str) -> None:
        """The holder of ``key`` is done: the longest waiter's turn, or nobody's."""
        waiters = self._held.get(key)
        while waiters:
            turn = waiters.popleft()
            if not turn.done():
                turn.set_result(None)
                return
        del self._held[key]

    async def idle(self, key: str) -> None:
        """Wait until every write of ``key`` asked for so far is over (take and give)."""
        if key in self._held:
            await self.take(key)
            self.give(key)

    def __len__(self) -> int:
        return len(self._held)
