"""``Executor``: how a claimed job runs, by its kind.

Workers get a claim from ``Claims`` and hand the job here: the executor looks
its kind up, gives the handler a ``JobContext`` carrying that kind's limits
(heartbeat timeout and timeout, with "server" resolved to ``--hb-timeout``) and
the pool plain handlers run in, and runs it. Where the job came from and where
its outcome goes is the business of ``Claims``, not of this module.

A result is held to the bounds every stored value keeps (``sqlq.common.shape``:
depth and items) before it goes anywhere: one nested past ``MAX_DEPTH`` could
be stored but not read back on a deeper stack, so it fails its attempt like a
result JSON cannot encode, and the store never sees it.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from sqlq.common.clock import Clock
from sqlq.common.models import JSON, Job
from sqlq.common.shape import ShapeError, measure
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.context import Channel
from sqlq.runtime.cpu import CpuPool, cpu_kind
from sqlq.runtime.kinds import JobContext, Kind, Registry, sleep_kind
from sqlq.runtime.threads import HandlerThreads

if TYPE_CHECKING:
    from sqlq.runtime.claim import Claim


class UnstorableResult(Exception):
    """A handler's result is past a bound of ``sqlq.common.shape``; its attempt fails."""


def build_registry(user: Registry, *, fault_injection: bool, cpu: CpuPool) -> Registry:
    """The kinds a server runs: the user's ``@task`` handlers plus the built-in ones.

    A user kind named like a built-in one (``sleep``, ``cpu``) takes its place.
    """
    kinds = Registry()
    for name in user.names():
        kinds.register(user.get(name))
    for builtin in (sleep_kind(fault_injection=fault_injection), cpu_kind(cpu)):
        if builtin.name not in kinds:
            kinds.register(builtin)
    return kinds


class Executor:
    def __init__(
        self,
        kinds: Registry,
        config: RuntimeConfig,
        *,
        rng: random.Random,
        clock: Clock,
    ) -> None:
        self.kinds = kinds
        self.threads = HandlerThreads(
            (config.handler_threads or config.workers) + config.max_abandoned
        )
        self._server_hb = config.hb_timeout_s
        self._rng = rng
        self._clock = clock
        # Per kind: (heartbeat timeout, timeout) in seconds, "server" resolved, and whether
        # a cancel cancels its task.
        self._limits = {name: self._resolve(kinds.get(name)) for name in kinds.names()}

    def _resolve(self, kind: Kind) -> tuple[float | None, float | None, bool]:
        hb = self._server_hb if kind.hb_timeout_s == "server" else kind.hb_timeout_s
        return hb, kind.timeout_s, kind.interruptible

    def context(
        self, job: Job, claim: Claim | None = None, channel: Channel | None = None
    ) -> JobContext:
        """The handler's context, with the limits of its kind (unknown kind: the server's),
        writing through ``channel`` (the claims) for ``claim``."""
        hb, timeout, interruptible = self._limits.get(job.kind, (self._server_hb, None, True))
        return JobContext(job, self._rng, clock=self._clock, threads=self.threads, hb_timeout=hb,
                          timeout=timeout, claim=claim, channel=channel,
                          interruptible=interruptible)  # fmt: skip

    async def execute(self, job: Job, ctx: JobContext) -> JSON:
        """Run the job's handler; an unknown kind (its module not imported) or a result
        past the bounds of a stored value fails the attempt."""
        result = await self.kinds.get(job.kind).run(job.args, ctx)
        try:
            measure(result)
        except ShapeError as exc:
            raise UnstorableResult(f"the result {exc}") from None
        return result

    def shutdown(self) -> None:
        self.threads.shutdown()
