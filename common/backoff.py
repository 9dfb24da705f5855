"""Retry policy: when a failed attempt runs again, and when a job is dead-lettered.

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
    job: Job, error: str, now: float, policy: RetryPolicy, rng: random.Random
) -> Transition:
    """What a failed attempt becomes: a retry after backoff, or the dead-letter state."""
    if should_retry(job.attempts, job.max_attempts, policy):
        return job.retry(error, now + retry_delay(job.attempts, policy, rng), now)
    return job.bury(error, now)
