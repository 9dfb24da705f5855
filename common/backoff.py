"""What an attempt that did not complete becomes: retried after backoff, dead-lettered,
snoozed, or (once a cancel was asked for) cancelled.

The cancel rule is River's: an attempt that fails, is cut off or snoozes after a cancel
was asked for ends its job ``cancelled``, never retried; one that succeeds still ends it
``completed`` (``Job.complete``). Every author of an attempt's end (the workers' outcome,
a remote worker's, the health loop, recovery, shared mode's rescue, a claim given back)
comes through here, so none can forget it.

Pure: the delay is a function of the attempt number and an injected RNG, so
tests pin it down with a seeded ``random.Random`` and literal numbers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sqlq.common.models import Job, Transition


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryPolicy:
    """The backoff between attempts. The default is sized for real work, as Oban's and
    Sidekiq's are: 15 s before the second attempt, doubling, up to 6 h (before jitter):
    attempt 10 waits about 2 h. An outage of minutes is outlasted by a few attempts, not
    spent in a second. The benchmarks set theirs (10 ms) explicitly."""

    base_s: float = 15.0  # delay before the 2nd attempt, before jitter
    cap_s: float = 6 * 3600.0  # no delay exceeds this, before jitter
    jitter: float = 0.5  # up to this fraction of the delay is added at random
    retries: bool = True  # False: dead-letter at the first failure

    def __post_init__(self) -> None:
        if not (self.base_s >= 0 and self.cap_s >= 0 and 0 <= self.jitter <= 1):
            raise ValueError("a backoff needs base_s >= 0, cap_s >= 0 and jitter from 0 to 1")


FAST_RETRY = RetryPolicy(base_s=0.010, cap_s=5.0)  # the experiments' (sqlq bench, loadgen)


@dataclass(frozen=True, slots=True)
class Failure:
    """How an attempt failed, as its attempt loop tells its holder: the error's text, its
    traceback if a handler raised, and what the task's own rules said (``TaskRetry``):
    whether it may be retried, and after how long (None: the holder's backoff)."""

    error: str
    traceback: str | None = None
    retry: bool = True
    delay_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskRetry:
    """A task's own retry rules (``@task(max_attempts=, backoff=, retry_on=, no_retry_on=)``),
    as Celery's, dramatiq's and Oban's: applied where its attempts run (the server's
    workers, or a remote worker, through the outcome it reports)."""

    max_attempts: int | None = None  # None: the job's own (the server's --max-attempts)
    backoff: RetryPolicy | None = None  # None: the holder's (the server's --retry-*)
    retry_on: tuple[type[BaseException], ...] = ()  # if given: only these are retried
    no_retry_on: tuple[type[BaseException], ...] = ()  # these are final at once

    def retries(self, exc: BaseException) -> bool:
        """Whether a failure that raised ``exc`` may be retried (attempts left permitting)."""
        if isinstance(exc, self.no_retry_on):
            return False
        return not self.retry_on or isinstance(exc, self.retry_on)

    def failure(
        self, error: str, traceback: str | None, retries: bool, attempts: int,
        rng: random.Random,
    ) -> Failure:  # fmt: skip
        """What the job's ``attempts``-th attempt, failed (``retries``: what ``retries``
        said of its exception), tells its holder: final past the task's ``max_attempts``;
        its delay by the task's backoff, if it has one."""
        if self.max_attempts is not None and attempts >= self.max_attempts:
            retries = False
        delay = None if self.backoff is None else retry_delay(attempts, self.backoff, rng)
        return Failure(error, traceback, retries, delay)


NO_RULES = TaskRetry()


def retry_delay(attempt: int, policy: RetryPolicy, rng: random.Random) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based).

    ``base * 2^(attempt-1)``, capped, plus up to ``jitter`` of itself so that
    jobs that failed together do not retry together.
    """
    delay = min(policy.cap_s, policy.base_s * 2.0 ** max(0, attempt - 1))
    return delay + delay * policy.jitter * rng.random()


def should_retry(attempts: int, max_attempts: int, policy: RetryPolicy) -> bool:
    """Whether a job that has started ``attempts`` times may run again."""
    return policy.retries and attempts < max_attempts


def after_failure(
    job: Job,
    error: str,
    now: float,
    policy: RetryPolicy,
    rng: random.Random,
    *,
    delay_s: float | None = None,
    retry: bool = True,
    traceback: str | None = None,
) -> Transition:
    """What a failed attempt becomes: a retry after backoff (``delay_s``, if given, instead:
    the task's own backoff, or a remote worker's ``retry_in_s``), or the dead-letter state
    (at once if ``retry`` is False: the task's rules or the handler said the failure is
    final); or, once a cancel was asked for, cancelled. ``traceback`` goes with the error."""
    if job.cancel_requested_at is not None:
        return job.withdraw(error, now, traceback)
    if retry and should_retry(job.attempts, job.max_attempts, policy):
        delay = retry_delay(job.attempts, policy, rng) if delay_s is None else delay_s
        return job.retry(error, now + delay, now, traceback)
    return job.bury(error, now, traceback)


def after_snooze(job: Job, delay_s: float, now: float, max_snoozes: int) -> Transition:
    """What a snooze becomes: scheduled again after ``delay_s``, its attempt given back; dead
    past ``max_snoozes`` (a job that snoozes forever); cancelled if a cancel was asked for."""
    if job.cancel_requested_at is not None:
        return job.withdraw("cancelled: it snoozed after a cancel was asked for", now)
    if job.snoozes >= max_snoozes:
        return job.bury(f"snoozed {job.snoozes + 1} times, more than --max-snoozes ({max_snoozes})",
                        now)  # fmt: skip
    return job.snooze(now + delay_s, now)


def released(job: Job, now: float) -> Transition:
    """What a claim that never started becomes when its holder gives it back (a remote
    worker's ``/claims/release``, a node that stops with claims no worker took): due again
    in its place in line, or cancelled if a cancel was asked for. Either way it was no
    attempt: ``attempts`` and ``errors`` stay as they were before the claim."""
    return job.release(now, cancelled=job.cancel_requested_at is not None)
