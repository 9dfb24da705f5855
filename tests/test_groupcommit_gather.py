"""The group committer's gathering: callers a few loop turns away join the batch
being taken; an idle loop does not hold a lone caller; a busy one cannot hold the
first caller of a batch for ever."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sqlq.common.engine.groupcommit import MAX_GATHER_TURNS, QUIET_TURNS, GroupCommitter, Pending
from sqlq.common.store import Change


class Recorder:
    """A flush that writes nothing and remembers each batch's size."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    async def flush(self, batch: list[Pending]) -> list[BaseException | None]:
        self.sizes.append(len(batch))
        return [None] * len(batch)


def _encode(changes: Sequence[Change]) -> object:
    return list(changes)


async def _started(recorder: Recorder, *, group: bool = True) -> GroupCommitter:
    committer = GroupCommitter(recorder.flush, encode=_encode, name="test", group=group)
    committer.start()
    await asyncio.sleep(0)  # the writer is waiting for its first caller
    return committer


async def _later(committer: GroupCommitter, turns: int) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)
    await committer.submit([])


async def test_callers_a_few_turns_away_join_the_same_batch() -> None:
    recorder = Recorder()
    committer = await _started(recorder)
    # One caller now, others that reach submit one, two and three turns later (as a
    # request does: its protocol callback, its task, its awaits).
    await asyncio.gather(committer.submit([]), *(_later(committer, t) for t in (1, 2, 3)))
    await committer.close()
    assert recorder.sizes == [4]


async def test_a_lone_caller_is_written_after_the_quiet_turns() -> None:
    recorder = Recorder()
    committer = await _started(recorder)
    # A caller QUIET_TURNS + 2 turns behind the first is not waited for: QUIET_TURNS
    # turns in a row added no caller, so the first batch was written.
    await asyncio.gather(committer.submit([]), _later(committer, QUIET_TURNS + 2))
    await committer.close()
    assert recorder.sizes == [1, 1]


async def test_a_busy_loop_cannot_hold_a_batch_for_ever() -> None:
    recorder = Recorder()
    committer = await _started(recorder)
    first = committer.submit([])
    joined = 0

    async def every_turn() -> None:  # a new caller on every turn, far past the bound
        nonlocal joined
        for _ in range(10 * MAX_GATHER_TURNS):
            committer.submit([])
            joined += 1
            await asyncio.sleep(0)

    await every_turn()
    await committer.close()
    assert first.done()
    # The first batch was taken after at most MAX_GATHER_TURNS turns of newcomers (an
    # unbounded gathering would take all 10 x of them, once the feeder stopped).
    assert recorder.sizes[0] <= MAX_GATHER_TURNS + 2  # and those pending when it began
    assert sum(recorder.sizes) == joined + 1


async def test_without_group_commit_a_caller_is_written_without_gathering() -> None:
    for group, gathered in ((False, False), (True, True)):
        recorder = Recorder()
        committer = await _started(recorder, group=group)
        future = committer.submit([])
        for _ in range(2):  # the writer's turn, then the write's
            await asyncio.sleep(0)
        assert future.done() is not gathered
        await future
        await committer.close()
        assert recorder.sizes == [1]
