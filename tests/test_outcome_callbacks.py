"""An outcome written on callbacks (``ClaimsBase._record``): whoever waits for outcomes
in flight, and is cancelled, never cancels them; and a fault in the callbacks never leaves
one in flight for good."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

from sqlq.common.engine.memory import MemoryStore
from sqlq.common.models import State, Transition
from sqlq.common.store import Change
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.context import JobContext
from sqlq.runtime.kinds import Kind, Registry
from sqlq.runtime.local import LocalClaims
from sqlq.runtime.service import Service
from tests.helpers import final, submit, wait_for


class HeldClaims(MemoryStore):
    """The memory engine, but a claim's commit waits until ``release``, as a group commit's
    waits for its batch's sync."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[tuple[Sequence[Change], asyncio.Future[None]]] = []
        self.open_gate = False

    def commit(self, changes: Sequence[Change]) -> Awaitable[None]:
        starts = any(isinstance(c, Transition) and c.state is State.RUNNING for c in changes)
        if starts and not self.open_gate:
            held: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.held.append((changes, held))
            return held
        return super().commit(changes)

    async def release(self) -> None:
        self.open_gate = True
        for changes, held in self.held:
            await super().commit(changes)
            if not held.done():
                held.set_result(None)


async def _ok(args: Any, ctx: JobContext) -> dict[str, int]:
    return {"r": 1}


def _service(store: MemoryStore) -> Service:
    kinds = Registry()
    kinds.register(Kind("ok", lambda a: a, _ok))
    return Service(store, RuntimeConfig(workers=1, seed=1), kinds=kinds)


async def test_a_cancelled_settle_leaves_the_outcomes_it_waited_on_to_land() -> None:
    store = HeldClaims()
    rt = _service(store)
    await rt.start()
    try:
        job = await submit(rt, "ok")
        claims = rt.claims
        assert isinstance(claims, LocalClaims)
        await wait_for(lambda: claims.outcomes_in_flight() > 0, what="the outcome in flight")
        assert store.held  # the claim is not durable yet: its outcome waits on it
        waiter = asyncio.create_task(claims.settle())
        await asyncio.sleep(0)  # (one turn: the waiter is waiting on what is in flight)
        assert not waiter.done()
        waiter.cancel()  # a timeout around a drain, a cancelled request's wait
        await asyncio.gather(waiter, return_exceptions=True)
        await store.release()
        done = await final(rt, job.id)
        assert done.state is State.COMPLETED
        assert done.result == {"r": 1}
        await wait_for(lambda: claims.outcomes_in_flight() == 0, what="nothing in flight")
    finally:
        await rt.stop(0)


async def test_a_fault_in_an_outcomes_callback_leaves_nothing_in_flight() -> None:
    rt = _service(MemoryStore())
    loop = asyncio.get_running_loop()
    faults: list[BaseException | None] = []
    loop.set_exception_handler(lambda _, context: faults.append(context.get("exception")))
    await rt.start()
    try:
        claims = rt.claims
        assert isinstance(claims, LocalClaims)
        landed = claims._landed

        def faulty(*args: Any) -> None:
            claims._landed = landed  # type: ignore[method-assign]  # (once)
            raise RuntimeError("a fault in the outcome's last step")

        claims._landed = faulty  # type: ignore[method-assign,assignment]
        await submit(rt, "ok")
        await wait_for(lambda: bool(faults), what="the fault reported to the loop")
        await asyncio.wait_for(claims.settle(), 10)  # (it spun for ever on a done future)
        assert claims.outcomes_in_flight() == 0
        assert isinstance(faults[0], RuntimeError)
    finally:
        loop.set_exception_handler(None)
        await rt.stop(0)
