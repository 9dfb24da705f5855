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
    base_s: float = 0.010  # delay before the 2nd attempt, before jitter
    cap_s: float = 5.0  # no delay exceeds this, before jitter
    jitter: float = 0.5  # up to this fraction of the delay is added at random
    retries: bool = True  # False: dead-letter at the first failure


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
) -> Transition:
    """What a failed attempt becomes: a retry after backoff (``delay_s``, if given, instead:
    a remote worker's ``retry_in_s``), or the dead-letter state (at once if ``retry`` is
    False: the handler said the failure is final); or, once a cancel was asked for,
    cancelled."""
    if job.cancel_requested_at is not None:
        return job.withdraw(error, now)
    if retry and should_retry(job.attempts, job.max_attempts, policy):
        delay = retry_delay(job.attempts, policy, rng) if delay_s is None else delay_s
        return job.retry(error, now + delay, now)
    return job.bury(error, now)


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
