"""``Remote``: the pull protocol's server side (``service.remote``), over either mode's claims.

A remote worker (``sqlq worker``, ``examples/worker.mjs``, curl) claims jobs of the
remote queues with a lease, renews every lease it holds in one heartbeat, and
reports outcomes (``sqlq.common.protocol`` has the bodies and their bounds). This
module is what both modes do alike:

- **Who may ask.** Every queue a claim names must be remote (``RuntimeConfig.is_remote``;
  else a ``ValidationError`` naming ``queues[i]``), and a worker principal may name
  only its own queues, and report only on their jobs (``ForbiddenError``; per item in a
  heartbeat or a batch, ``error: "forbidden"``).
- **Tokens.** A claim's token is signed with the store's key (``signing_key``, loaded at
  start), naming the job, the epoch it was claimed at and the lease's length. A token
  that does not verify is ``invalid``; one that verifies but whose job moved on is
  ``fenced`` (``fence``: not running, another epoch, not held remotely, or the lease ran
  out). Nothing is written for either.
- **One job's writes in turn.** Every heartbeat, outcome, cancel and expiry of a job
  takes its turn (``Serial``) and builds its transition from the job as it stands then,
  so none undoes another. A call's items take their turns at once and are written
  together: its outcomes in one commit where the side can (``write_all``: local mode;
  refused as a value, each goes alone), else concurrently, so group commit batches them;
  an item whose job is busy waits for its own turn after (never while holding another's,
  so no two calls wait on each other).
- **What an outcome becomes** (``outcome_of``): ``complete``; ``fail`` through the retry
  policy (``retry_in_s`` instead of the backoff; ``retry: false`` buries it, or
  withdraws it if a cancel was asked for); ``snooze`` as a handler's; ``checkpoint`` a
  touch (the job still running); ``release`` given back with no attempt counted. A
  result JSON can't hold (or past the stored-value bounds) is the attempt's failure,
  as in process.
- **Durable before answered.** Each write is awaited; a request cancelled meanwhile
  (its client gone) does not cancel its writes (``shield``): what was asked is either
  written and shown, or refused, never half-known. A batch of outcomes whose store took
  some items and failed others (unavailable past its write deadline) answers 200, the
  failed items ``error: "unavailable"`` (report them again); only a call of which
  nothing landed fails whole (503), since a landed outcome asked again is ``fenced``. A
  heartbeat fails whole: a renewal asked again is renewed again.
- **Outcomes on a claim.** A claim may carry outcomes (``ClaimRequest.outcomes``), so a
  busy worker reports the round it finished with the call that takes the next. They are
  written beside the claim (group commit takes both in one flush; before it, if a
  queue it names has a cap, whose room they free), as a batch is, and answered in the
  claim's answer; such a claim does not wait. Whatever of the two landed is answered:
  a claim that failed beside them answers no jobs, outcomes that failed beside a claim
  answer ``unavailable`` each; only both failing fails the call (on a capped queue,
  where the outcomes go first, so does their failing: the claim is then not made).
- **Long-poll.** A claim that finds nothing waits (the side's ``wait``: the lanes' bell in
  local mode, NOTIFY and a poll in shared mode) until ``wait_s``. At most
  ``MAX_WAITING_CLAIMS`` claims wait at once, shared fairly by principal
  (``sqlq.runtime.polls``): one more from a principal that holds its share is refused at
  once with a ``StoreUnavailableError`` (HTTP 503, retry later), not answered empty, so
  a worker backs off instead of asking again in a tight loop; one from a principal
  below it takes the slot of the principal that holds the most.

Where the queue lives is the side's (``RemoteSide``): ``LocalSide``
(``sqlq.runtime.remote_local``: lanes of their own per remote queue, a heap of leases on
the clock) or ``SharedSide`` (``sqlq.runtime.remote_shared``: the database's claim,
extend and fenced writes; expiry is the rescue every node runs).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar

import msgspec

from sqlq.common.backoff import after_failure, after_snooze, released
from sqlq.common.errors import (
    ForbiddenError,
    StoreError,
    StoreUnavailableError,
    TransitionError,
    UnencodableError,
    ValidationError,
)
from sqlq.common.models import Job, State, Transition
from sqlq.common.protocol import (
    FENCED,
    UNAVAILABLE,
    Beat,
    BeatItem,
    CheckpointIn,
    ClaimAnswer,
    ClaimRequest,
    CompleteIn,
    FailIn,
    Granted,
    HeartbeatAnswer,
    HeartbeatRequest,
    Outcome,
    OutcomesAnswer,
    OutcomesRequest,
    ParentsPage,
    ReleaseIn,
    Reported,
    SnoozeIn,
    What,
    WorkerList,
    remote_holder,
    remote_worker,
)
from sqlq.common.redact import redact_paths
from sqlq.common.roles import Principal
from sqlq.common.running import Progress, check_checkpoint, check_progress
from sqlq.common.shape import ShapeError, measure
from sqlq.common.tokens import BadToken, Ticket, sign, verify
from sqlq.common.wire import job_view
from sqlq.runtime.events import Event
from sqlq.runtime.parents import page as parents_page
from sqlq.runtime.parts import Parts
from sqlq.runtime.polls import Polls
from sqlq.runtime.serial import Serial
from sqlq.runtime.spawn import Spawner, SpawnRefused

log = logging.getLogger(__name__)

MAX_ISSUED = 1 << 14  # tokens signed here and remembered (``Issued``); then forgotten
POLL_SLACK_S = 0.001  # a long-poll this close to its end is over (no sliver of a wait)
INVALID, FORBIDDEN = "invalid", "forbidden"
# What ``/stats`` (``remote``) and ``/metrics`` (``sqlq_remote_total{what}``) count: a
# fixed set, so the label's cardinality is bounded whatever clients send.
COUNTED = ("claims", "claimed", "heartbeats", "renewed", "complete", "fail", "snooze",
           "checkpoint", "release", FENCED, INVALID, FORBIDDEN, "expired", "cut_off")  # fmt: skip

T = TypeVar("T")
A = TypeVar("A")
Renewed = tuple[float, bool]  # a lease renewed: until when, and whether a cancel was asked for


class RemoteSide(Protocol):
    """What ``Remote`` asks of where the queue lives (``LocalSide``, ``SharedSide``)."""

    serial: Serial  # one job's remote writes in turn (its cancel and expiry take turns too)
    knows_held: bool  # every end of a job it claims is written here (``WorkersSeen``)

    @property
    def stopping(self) -> bool:
        """The service is stopping: no claim waits, none is made."""
        ...

    async def take(self, req: ClaimRequest, holder: str, now: float) -> list[Job]:
        """Claim up to ``req.max`` due jobs of ``req.queues`` (of ``req.kinds``) for
        ``holder``, each durable before it is returned (a refused one left out)."""
        ...

    async def wait(self, req: ClaimRequest, within: float) -> None:
        """Return when a job may have become claimable for ``req``, or after ``within``."""
        ...

    async def current(self, ids: Sequence[str]) -> list[Job | None]:
        """The jobs as they stand now (None: no such live job), in order."""
        ...

    async def write(self, job: Job, t: Transition, now: float, spawned: Sequence[Job] = ()) -> Job:
        """Write ``t`` (built from ``job`` at its turn) durably, with the jobs it ``spawned``
        in its commit; the job after it, shown to the view and its waiters, due again in its
        lanes if scheduled. ``TransitionError`` if refused (shared: fenced on the holder and
        the lease at ``now``)."""
        ...

    async def write_all(self, writes: Sequence[tuple[Job, Transition]], now: float
                        ) -> list[Job] | None:  # fmt: skip
        """``write`` of each ``(job, t)`` in one commit, all or none: the jobs after them;
        None if none was written because the side writes one at a time, or the store
        refused the batch as a value (each goes alone then, and only that one fails).
        Anything else it raises (``StoreError`` as ``write``) fails every item."""
        ...

    async def extend(
        self, now: float, leases: Sequence[tuple[Job, float, Progress | None]]
    ) -> list[Renewed | None]:
        """Renew each ``(job, lease_until, progress)``, all at once; None where refused. A
        lease a forced cancel holds (``Job.cancel_forced``) is answered as it stands."""
        ...


class Issued:
    """The tokens this process signed whose job has not been heard to end: each one read
    back is found here instead of its mac being computed again (``verify``: 2.7 us, one a
    remote job). A token not found (signed before a restart, by another node, or forgotten
    once ``MAX_ISSUED`` were held) is verified as ever; a token found is one ``sign`` made
    here with the same key, so it would verify. Its fence is the job's, as ever (``fence``):
    this says only what the token names."""

    def __init__(self) -> None:
        self._tickets: dict[str, Ticket] = {}

    def sign(self, key: bytes, job_id: str, epoch: int, lease_s: float) -> str:
        token = sign(key, job_id, epoch, lease_s)
        tickets = self._tickets
        if len(tickets) >= MAX_ISSUED:  # (workers gone with their claims: verified again)
            tickets.clear()
        tickets[token] = Ticket(job_id, epoch, round(lease_s * 1000) / 1000)
        return token

    def read(self, key: bytes, token: str) -> Ticket:
        """What ``token`` says (``BadToken``: not one ``key`` signed)."""
        ticket = self._tickets.get(token)
        return verify(key, token) if ticket is None else ticket

    def forget(self, token: str) -> None:
        """``token``'s job ended, or it was fenced: it is verified again if it comes back."""
        self._tickets.pop(token, None)

    def __len__(self) -> int:
        return len(self._tickets)


def fence(job: Job | None, ticket: Ticket, now: float) -> str | None:
    """Why a token no longer holds its job at ``now`` (None: it does)."""
    if job is None:
        return "the job is finished or gone"
    if job.state is not State.RUNNING:
        return f"the job is {job.state.value}"
    if job.epoch != ticket.epoch:
        return f"the job moved on (epoch {job.epoch}; this claim's was {ticket.epoch})"
    if remote_worker(job.holder) is None:
        return "the job is not held by a remote worker"
    if job.lease_until is None or job.lease_until < now:
        return "the lease ran out"
    return None


class Remote:
    def __init__(self, side: RemoteSide, parts: Parts) -> None:
        self._side = side
        self._parts = parts
        self._store = parts.store
        self._config = parts.config
        self._clock = parts.clock
        self._rng = parts.rng
        self._events = parts.live.events
        self._metrics = parts.metrics
        self.seen = parts.seen
        self.seen.counts_held = side.knows_held
        self.counts = parts.remote_counts
        self._key: bytes | None = None
        self._issued = Issued()
        self._started = False
        self._polls = Polls()  # claims long-polling now, shared fairly by principal
        self._inflight: set[asyncio.Task[Any]] = set()  # calls whose writes outlive a client
        self.spawner: Spawner | None = None  # what makes a spawn's jobs (the submissions)

    async def start(self) -> None:
        """Load the store's signing key (the store is open), if any queue is remote; else at
        the first call that needs it (a server with no remote queue never asks)."""
        if self._config.every_queue_remote or self._config.remote_queues:
            self._key = await self._store.signing_key()
        self._started = True

    async def _signing_key(self) -> bytes:
        if not self._started:
            raise StoreUnavailableError("the server is starting: no claim is served yet")
        key = self._key
        if key is None:
            key = self._key = await self._store.signing_key()
        return key

    async def drain(self) -> None:
        """Wait for every call's writes to be over (a stop, before the store closes)."""
        while self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)

    def is_remote(self, queue: str) -> bool:
        return self._config.is_remote(queue)

    def workers(self) -> WorkerList:
        return self.seen.view()

    def waiting(self) -> int:
        """Claims long-polling now."""
        return self._polls.count

    def stats(self) -> dict[str, Any]:
        now = self._clock.time()
        return {
            "queues": sorted(self._config.remote_queues),
            "all_queues": self._config.every_queue_remote,
            "workers_seen": len(self.seen),
            "workers_active": self.seen.active(now),
            "claims_waiting": self._polls.count,
            **{what: self.counts[what] for what in COUNTED},
        }

    async def _shielded(self, work: Awaitable[T]) -> T:
        """``work``, carried on to its end even if the caller is cancelled (its writes are
        either all shown or refused); a stop waits for it (``drain``)."""
        task = asyncio.ensure_future(work)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        return await asyncio.shield(task)

    # -- claim ------------------------------------------------------------------------------

    async def claim(self, req: ClaimRequest, who: Principal) -> ClaimAnswer:
        """Up to ``req.max`` jobs, each durably claimed for ``req.worker`` with a lease of
        ``req.lease_s``; waits up to ``req.wait_s`` for the first. The outcomes it carries
        are written beside the claim (once the claim is known to be allowed), which then
        does not wait; what landed is answered (module docstring)."""
        for i, queue in enumerate(req.queues):
            if not who.serves(queue):
                raise ForbiddenError(f"{who.name} may not claim from queue {queue!r}")
            if not self._config.is_remote(queue):
                raise ValidationError(f"queues[{i}]", f"queue {queue!r} is not a remote queue "
                                      "(--remote-queue, or --workers 0)")  # fmt: skip
        self.seen.check(req.worker, who)  # (before the outcomes it carries land)
        if not req.outcomes:
            return ClaimAnswer(claims=await self._claim(req, who, req.wait_s))
        reported: list[Reported] | BaseException
        got: list[Granted] | BaseException
        if any(q in self._config.queue_caps for q in req.queues):
            # a capped queue's room counts its running jobs: these outcomes end some of
            # them, so they go first (alongside, the claim would find the room still full)
            reported = await self._outcomes(req.outcomes, who)  # (none landed: 503, whole)
            try:
                got = await self._claim(req, who, 0.0)
            except Exception as exc:
                got = exc
        else:  # both at once, so group commit writes them together (one flush, not two)
            reported, got = await asyncio.gather(
                self._outcomes(req.outcomes, who), self._claim(req, who, 0.0),
                return_exceptions=True)  # fmt: skip
        if isinstance(got, BaseException) and isinstance(reported, BaseException):
            raise got  # nothing of it landed: the call fails whole
        # whatever landed is answered: asked again, a landed outcome would be fenced, and a
        # claimed job never answered would be held until its lease ran out
        if isinstance(got, BaseException):
            _failed_beside(got, "a claim failed beside the outcomes it carried")
            got = []
        if isinstance(reported, BaseException):
            _failed_beside(reported, "outcomes failed beside the claim that carried them")
            why = redact_paths(str(reported))
            reported = [Reported(token=o.token, error=UNAVAILABLE, detail=why)
                        for o in req.outcomes]  # fmt: skip
        return ClaimAnswer(claims=got, outcomes=reported)

    async def _claim(self, req: ClaimRequest, who: Principal, wait_s: float) -> list[Granted]:
        key = await self._signing_key()
        side, clock = self._side, self._clock
        now = clock.time()
        self.seen.saw(req.worker, who, now, req.queues)
        self.seen.runs(req.worker, req.kinds)
        holder = remote_holder(req.worker)
        self.counts["claims"] += 1
        jobs = await self._shielded(side.take(req, holder, now))
        if not jobs and wait_s > 0 and not side.stopping:
            jobs = await self._long_poll(req, holder, now + wait_s, who.name)
        if not jobs:
            return []
        lease_s = req.lease_s
        issued = self._issued
        try:
            granted = [Granted(token=issued.sign(key, job.id, job.epoch, lease_s),
                               lease_until=job.lease_until or now + lease_s,
                               job=job_view(job, tracebacks=False))
                       for job in jobs]  # fmt: skip
        except Exception:  # a bug: the jobs are durably claimed, and nobody will hear of it
            log.exception("a claim's answer could not be built: its %d jobs go back", len(jobs))
            await self._shielded(self._give_back_taken(jobs))
            raise
        self.seen.took(req.worker, len(jobs))
        self.counts["claimed"] += len(jobs)
        record, kinds = self._events.record, set()
        for job in jobs:
            record(Event.REMOTE_CLAIMED, job)
            kinds.add((job.queue, job.kind))
        for queue, kind in kinds:  # (a call's jobs are mostly of one kind)
            self.seen.claimed_kind(queue, kind)
        return granted

    async def _give_back_taken(self, jobs: list[Job]) -> None:
        """Release jobs just taken whose claim cannot be answered, each in its turn as it
        stands then (a cancel asked meanwhile ends it cancelled), rather than leave them
        held, by no one, until their leases run out: written and counted as a worker's
        ``/claims/release`` is (``_write_all``). Whatever fails here is logged: the bug
        that brought it here is what the caller raises."""

        async def group(indexes: list[int]) -> None:
            taken = [jobs[i] for i in indexes]
            now = self._clock.time()
            try:
                current = await self._side.current([j.id for j in taken])
            except Exception:  # (each is ended by its lease)
                log.exception("jobs of a claim that failed could not be given back")
                return
            release: What = ReleaseIn()
            writes = [(k, job, released(job, now), release)  # as a worker's /claims/release
                      for k, (was, job) in enumerate(zip(taken, current, strict=True))
                      if job is not None and job.epoch == was.epoch
                      and job.state is State.RUNNING]  # (else it moved on already)  # fmt: skip
            for (_, job, *_), done in zip(writes, await self._write_all(writes, now), strict=True):
                if isinstance(done, BaseException):  # (its lease ends it)
                    log.error("job %s of a claim that failed could not be given back", job.id,
                              exc_info=done)  # fmt: skip

        await self._in_turns([j.id for j in jobs], group)

    async def _long_poll(
        self, req: ClaimRequest, holder: str, deadline: float, who: str
    ) -> list[Job]:
        """Wait for jobs until ``deadline`` in a slot of the long polls' budget (``Polls``:
        503 past this principal's share; evicted by another's, answered empty)."""
        side, clock = self._side, self._clock
        poll = self._polls.enter(who)
        try:
            while (left := deadline - clock.time()) > POLL_SLACK_S and not side.stopping:
                poll.evictable = True
                try:
                    await side.wait(req, left)
                except asyncio.CancelledError:
                    task = poll.task
                    if poll.evicted and task is not None and task.uncancel() == 0:
                        return []  # another principal's poll took this slot
                    raise
                finally:
                    poll.evictable = False
                if side.stopping:
                    break
                jobs = await self._shielded(side.take(req, holder, clock.time()))
                if jobs:
                    return jobs
        finally:
            self._polls.leave(poll)
        return []

    # -- the turns of a call's items ---------------------------------------------------------

    async def _in_turns(
        self,
        ids: Sequence[str],
        group: Callable[[list[int]], Awaitable[None]],
    ) -> None:
        """Run ``group`` over the items (indexes into ``ids``) whose jobs' turns are free, all
        at once, then over each of the others alone, once its turn comes."""
        serial = self._side.serial
        now_free: list[int] = []
        later: list[int] = []
        for i, job_id in enumerate(ids):
            (now_free if serial.try_take(job_id) else later).append(i)
        try:
            if now_free:
                await group(now_free)
        finally:
            for i in now_free:
                serial.give(ids[i])
        for i in later:
            await serial.take(ids[i])
            try:
                await group([i])
            finally:
                serial.give(ids[i])

    # -- heartbeat ----------------------------------------------------------------------------

    async def heartbeat(self, req: HeartbeatRequest, who: Principal) -> HeartbeatAnswer:
        """Renew every lease ``req`` names (its progress too); one answer per item."""
        return await self._shielded(self._heartbeat(req.items, who))

    async def _heartbeat(self, items: list[BeatItem], who: Principal) -> HeartbeatAnswer:
        key = await self._signing_key()
        now = self._clock.time()
        counts = self.counts
        counts["heartbeats"] += 1
        answers: list[Beat | None] = [None] * len(items)
        tickets: list[Ticket] = []
        at: list[int] = []  # the items with a good token, by index
        read = self._issued.read
        for i, item in enumerate(items):
            try:
                tickets.append(read(key, item.token))
            except BadToken:
                counts[INVALID] += 1
                answers[i] = Beat(token=item.token, error=INVALID)
                continue
            at.append(i)

        async def group(picked: list[int]) -> None:
            jobs = await self._side.current([tickets[k].job_id for k in picked])
            leases: list[tuple[Job, float, Progress | None]] = []
            whose: list[int] = []
            for k, job in zip(picked, jobs, strict=True):
                i, ticket = at[k], tickets[k]
                item = items[i]
                if job is not None and not who.serves(job.queue):
                    counts[FORBIDDEN] += 1
                    answers[i] = Beat(token=item.token, error=FORBIDDEN)
                    continue
                if job is None or fence(job, ticket, now) is not None:
                    counts[FENCED] += 1
                    answers[i] = Beat(token=item.token, error=FENCED)
                    continue
                progress = None
                if item.progress is not None:
                    try:
                        progress = check_progress(item.progress.percent, item.progress.message, now)
                    except ValueError:
                        progress = None  # (the protocol's bounds make this unreachable)
                # (a lease a forced cancel holds stays where it is: ``Job.renew``, and
                # ``extend`` in PostgreSQL, where it may be forced after this read)
                until = max(job.lease_until or now, now + ticket.lease_s)
                leases.append((job, until, progress))
                whose.append(i)
                self.seen.saw_holder(job.holder, who, now)
            renewed = await self._side.extend(now, leases) if leases else []
            for i, done in zip(whose, renewed, strict=True):
                token = items[i].token
                if done is None:
                    counts[FENCED] += 1
                    answers[i] = Beat(token=token, error=FENCED)
                else:
                    counts["renewed"] += 1
                    answers[i] = Beat(token=token, lease_until=done[0], cancel_requested=done[1])

        await self._in_turns([t.job_id for t in tickets], group)
        return HeartbeatAnswer(items=_every(answers))

    # -- outcomes -------------------------------------------------------------------------------

    async def report(self, token: str, what: What, who: Principal) -> Reported:
        """One outcome (the single forms): ``state`` after it, or ``error`` fenced, invalid
        (``detail``: ``"<field>: why"``) or forbidden."""
        [answer] = await self._shielded(self._report([(token, what)], who))
        return answer

    async def parents(self, token: str, start: int, who: Principal) -> ParentsPage | Reported:
        """A page of the claimed job's parents (``POST /claims/parents``), as the server's
        own holders read it (``sqlq.runtime.parents.page``), while the token holds the job;
        else its refusal, as a single outcome's (fenced, invalid, forbidden)."""
        key = await self._signing_key()
        try:
            ticket = self._issued.read(key, token)
        except BadToken as exc:
            self.counts[INVALID] += 1
            return Reported(token=token, error=INVALID, detail=f"token: {exc}")
        [job] = await self._side.current([ticket.job_id])
        if job is not None and not who.serves(job.queue):
            self.counts[FORBIDDEN] += 1
            return Reported(token=token, error=FORBIDDEN,
                            detail=f"{who.name} may not read queue {job.queue!r}")  # fmt: skip
        why = fence(job, ticket, self._clock.time())
        if job is None or why is not None:
            return self._fenced(token, job, why)
        return await parents_page(self._store.get_many, job, start)

    async def give_back(self, answer: ClaimAnswer, who: Principal) -> None:
        """Release what a claim granted but could not hand over (its client went away before
        the answer): back to scheduled at once, no attempt counted, rather than held until
        the lease runs out and then retried with an attempt spent."""
        said: list[tuple[str, What | str]] = [(g.token, ReleaseIn()) for g in answer.claims]
        done = await self._shielded(self._report(said, who))
        log.info("a claim's client went away before its answer: %d of its %d jobs released",
                 sum(1 for r in done if r.error is None), len(done))  # fmt: skip

    async def outcomes(self, req: OutcomesRequest, who: Principal) -> OutcomesAnswer:
        """Every outcome of ``req``, written together; one answer each, in order."""
        return OutcomesAnswer(outcomes=await self._outcomes(req.outcomes, who))

    async def _outcomes(self, items: Sequence[Outcome], who: Principal) -> list[Reported]:
        said: list[tuple[str, What | str]] = []
        for item in items:
            try:
                said.append((item.token, item.what()))
            except ValueError as exc:
                said.append((item.token, str(exc)))
        return await self._shielded(self._report(said, who))

    async def _report(self, said: Sequence[tuple[str, What | str]], who: Principal
                      ) -> list[Reported]:  # fmt: skip
        key = await self._signing_key()
        now = self._clock.time()
        counts = self.counts
        answers: list[Reported | None] = [None] * len(said)
        tickets: list[Ticket] = []
        at: list[int] = []
        issued = self._issued
        read = issued.read
        for i, (token, what) in enumerate(said):
            if isinstance(what, str):
                counts[INVALID] += 1
                answers[i] = Reported(token=token, error=INVALID, detail=f"outcome: {what}")
                continue
            try:
                tickets.append(read(key, token))
            except BadToken as exc:
                counts[INVALID] += 1
                answers[i] = Reported(token=token, error=INVALID, detail=f"token: {exc}")
                continue
            at.append(i)
        failures: list[BaseException] = []
        landed = 0  # writes that are durable

        async def group(picked: list[int]) -> None:
            nonlocal landed
            jobs = await self._side.current([tickets[k].job_id for k in picked])
            writes = []
            holder: str | None = None  # the holder last seen (a call's jobs share one)
            for k, job in zip(picked, jobs, strict=True):
                i, ticket = at[k], tickets[k]
                token, what = said[i]
                assert not isinstance(what, str)
                if job is not None and not who.serves(job.queue):
                    counts[FORBIDDEN] += 1
                    answers[i] = Reported(token=token, error=FORBIDDEN,
                                          detail=f"{who.name} may not report on queue "
                                          f"{job.queue!r}")  # fmt: skip
                    continue
                why = fence(job, ticket, now)
                if job is None or why is not None:
                    issued.forget(token)
                    answers[i] = self._fenced(token, job, why)
                    continue
                if job.holder != holder:
                    holder = job.holder
                    self.seen.saw_holder(holder, who, now)
                try:
                    t = self.outcome_of(job, what, now)
                except ValueError as exc:
                    counts[INVALID] += 1
                    answers[i] = Reported(token=token, error=INVALID, detail=str(exc))
                    continue
                writes.append((i, job, t, what))
            if not writes:
                return
            done = await self._write_all(writes, now, who.name)
            for (i, *_), answer in zip(writes, done, strict=True):
                token = said[i][0]
                if isinstance(answer, BaseException):
                    failures.append(answer)
                    answer = Reported(
                        token=token, error=UNAVAILABLE, detail=redact_paths(str(answer))
                    )
                else:
                    landed += 1
                    if answer.state != _RUNNING:  # (a checkpoint's job runs on)
                        issued.forget(token)
                    answer = msgspec.structs.replace(answer, token=token)
                answers[i] = answer

        await self._in_turns([t.job_id for t in tickets], group)
        if failures and not landed:  # nothing was written: the call fails (503), all of it
            raise failures[0]  # is asked again; once one item is durable, the call must say
        # so (asked again, it would be fenced): the others answer ``unavailable``, per item
        return _every(answers)

    def _fenced(self, token: str, job: Job | None, why: str | None) -> Reported:
        self.counts[FENCED] += 1
        if job is not None:
            self._events.record(Event.FENCED, job)
        return Reported(token=token, error=FENCED, detail=why or "the job is finished or gone")

    def outcome_of(self, job: Job, what: What, now: float) -> Transition:
        """The transition ``what`` makes of the running ``job`` at ``now``; ``ValueError``
        (``"<field>: why"``) for a value the bounds refuse."""
        if isinstance(what, CompleteIn):
            try:
                measure(what.result)
            except ShapeError as exc:
                return self._failure(job, f"result is past the bounds of a stored value: {exc}",
                                     now)  # fmt: skip
            return job.complete(what.result, now)
        if isinstance(what, FailIn):
            return self._failure(job, what.error, now, what.retry_in_s, retry=what.retry,
                                 traceback=what.traceback)  # fmt: skip
        if isinstance(what, SnoozeIn):
            return after_snooze(job, what.delay_s, now, self._config.max_snoozes)
        if isinstance(what, CheckpointIn):
            try:
                data = check_checkpoint(what.data)
            except ValueError as exc:
                raise ValueError(f"data: {exc}") from None
            return job.touch(now, checkpoint=data)
        if isinstance(what, ReleaseIn):
            return released(job, now)
        raise ValueError(f"outcome: not an outcome: {type(what).__name__}")

    def _failure(
        self, job: Job, error: str, now: float, delay_s: float | None = None, *,
        retry: bool = True, traceback: str | None = None,
    ) -> Transition:  # fmt: skip
        return after_failure(job, error, now, self._config.retry, self._rng, delay_s=delay_s,
                             retry=retry, traceback=traceback)  # fmt: skip

    async def _write_all(
        self, writes: list[tuple[int, Job, Transition, What]], now: float, who: str | None = None
    ) -> list[Reported | BaseException]:
        """Write a call's outcomes (their turns held): at once if the side can (one commit,
        all or none), else, or if that commit was refused as a value, each on its own.
        ``who``: the reporting principal, whose share of queue names a spawn takes."""
        if len(writes) > 1 and not any(_spawns(what) for *_, what in writes):
            try:
                afters = await self._side.write_all([(job, t) for _, job, t, _ in writes], now)
            except Exception as exc:  # the store failed (or a bug): each item says so
                return [exc] * len(writes)
            if afters is not None:
                pairs = zip(writes, afters, strict=True)
                return [self._written(job, after, what) for (_, job, _, what), after in pairs]
        if len(writes) == 1:  # (no task for the one write of a single form)
            [(_, job, t, what)] = writes
            try:
                return [await self._write(job, t, what, now, who)]
            except Exception as exc:
                return [exc]
        return await asyncio.gather(
            *(self._write(job, t, what, now, who) for _, job, t, what in writes),
            return_exceptions=True,
        )

    def _written(self, job: Job, after: Job, what: What) -> Reported:
        """``job``'s outcome ``what`` is durable (``after``): counted and answered."""
        name = _name(what)
        self.counts[name] += 1
        note_end(self._parts, job, after, name)
        return Reported(token="", state=after.state.value)

    async def _write(
        self, job: Job, t: Transition, what: What, now: float, who: str | None = None
    ) -> Reported:
        """Write the outcome ``t`` of ``job`` (its turn is held); what it answers."""
        side = self._side
        try:
            try:
                # (a completion refused as a value, its result past the bounds, is a failure:
                # it spawns nothing)
                spawn = _spawns(what) if t.state is State.COMPLETED else None
                if spawn is None:
                    after = await side.write(job, t, now)
                elif self.spawner is None:
                    raise SpawnRefused("spawn refused: this server makes no jobs from an outcome")
                else:
                    after = await self.spawner(job, t, spawn, partial(side.write, job, t, now),
                                               who)  # fmt: skip
            except UnencodableError as exc:
                self._events.record(Event.UNENCODABLE, job)
                t = self._failure(job, f"result is not JSON-serialisable: {exc.what}", now)
                after = await side.write(job, t, now)
            except SpawnRefused as exc:  # the attempt failed, as in process; nothing stored
                self._events.record(Event.SPAWN_REFUSED, job)
                t = self._failure(job, str(exc), now, retry=not exc.final)
                after = await side.write(job, t, now)
        except TransitionError as exc:
            return self._fenced("", job, f"refused: {exc}")
        except StoreError:
            raise
        return self._written(job, after, what)


def _failed_beside(exc: BaseException, what: str) -> None:
    if not isinstance(exc, Exception):
        raise exc  # (a cancel, an exit: not a failure to answer)
    if isinstance(exc, StoreError):
        log.warning("%s: %s", what, exc)
    else:  # a bug: logged whole, and the half that landed is still answered
        log.error("%s", what, exc_info=exc)


def _spawns(what: What) -> list[Any] | None:
    """The jobs an outcome spawned (``sqlq.runtime.spawn``), if it is a completion that did."""
    return what.spawn if isinstance(what, CompleteIn) else None


def _every(answers: list[A | None]) -> list[A]:
    """``answers``, each of which a call's items have set (one per item, in order)."""
    assert all(a is not None for a in answers), "an item was left unanswered"
    return answers  # type: ignore[return-value]  # (none is None, asserted)


def _name(what: What) -> str:
    """What ``/stats`` counts ``what`` as (a single form's body is a subclass)."""
    for kind, name in _NAMES:
        if isinstance(what, kind):
            return name
    raise AssertionError(f"not an outcome: {what!r}")


_RUNNING = State.RUNNING.value
_NAMES: tuple[tuple[type, str], ...] = ((CompleteIn, "complete"), (FailIn, "fail"),
    (SnoozeIn, "snooze"), (CheckpointIn, "checkpoint"), (ReleaseIn, "release"))  # fmt: skip


def note_end(parts: Parts, job: Job, after: Job, what: str) -> None:
    """Count what ``job``'s remote attempt became (``after``, durable): an outcome's
    (``what`` its name), an expiry's (``"expired"``) or a forced cancel's cut-off
    (``"cut_off"``); a checkpoint's is no end."""
    if after.state is State.RUNNING:
        return
    events = parts.live.events
    started = job.started_at
    if started is not None:
        parts.metrics.run.observe(max(0.0, after.updated_at - started))
    parts.seen.let_go(remote_worker(job.holder))
    if after.state is State.SCHEDULED:
        if what in ("fail", "expired"):
            events.record(Event.RETRIED, job)
        if what == "expired":
            events.record(Event.REQUEUED_EXPIRED_LEASE, job)
        elif what == "snooze":
            events.record(Event.SNOOZED, job)
    elif after.state is State.CANCELLED:
        events.record(Event.CANCELLED_RUNNING, job)


def expired_reason(job: Job) -> str:
    """The error an expired remote lease records."""
    return f"lease expired: worker {remote_worker(job.holder)} went silent"


def lease_ran_out(job: Job) -> tuple[str, str]:
    """What the end of ``job``'s remote lease records, and what it is counted as: the cut-off
    of a forced cancel whose grace is over (``Job.cancel_forced``, stored, so after a restart
    or on another node alike), else an expiry (the worker went silent)."""
    if job.cancel_forced:
        return CUT_OFF_REASON, "cut_off"
    return expired_reason(job), "expired"


# The error a forced cancel's cut-off records (counted ``cut_off``, not ``expired``): the
# worker may well be alive and beating; the server ended the attempt.
CUT_OFF_REASON = "cancelled: forced after --cancel-grace"
