"""What an attempt that did not complete becomes: retried after backoff, dead-lettered,
snoozed, or (once a cancel was asked for) cancelled.

The cancel rule is River's: an attempt that fails, is cut off or snoozes after a cancel
was asked for ends its job ``cancelled``, never retried; one that succeeds still ends it
``completed`` (``Job.complete``). Every author of an attempt's end (the workers' outcome,
the health loop, recovery, shared mode's rescue) comes through here, so none can forget it.

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
) -> Transition:
    """What a failed attempt becomes: a retry after backoff (``delay_s``, if given, instead:
    a remote worker's ``retry_in_s``), or the dead-letter state; or, once a cancel was asked
    for, cancelled."""
    if job.cancel_requested_at is not None:
        return job.withdraw(error, now)
    if should_retry(job.attempts, job.max_attempts, policy):
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


def given_back(job: Job, reason: str, now: float) -> Transition:
    """What a claim that never started becomes when its node gives it back: due again as it
    was (no backoff: it did not fail), or cancelled if a cancel was asked for."""
    if job.cancel_requested_at is not None:
        return job.withdraw(reason, now)
    return job.retry(reason, job.ready_at, now)


def released(job: Job, now: float) -> Transition:
    """What a remote worker's ``/claims/release`` becomes: due now again with its attempt
    given back (it never started), or cancelled if a cancel was asked for."""
    if job.cancel_requested_at is not None:
        return job.withdraw("cancelled: given back after a cancel was asked for", now)
    return job.release(now)
