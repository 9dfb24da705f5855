"""Injected time.

Job timestamps (``ready_at``, ``created_at``) are wall-clock seconds because they
must survive a restart; only code that owns a loop reads a clock, and always
through this protocol so tests can drive time by hand.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds since the epoch: timestamps that must survive a restart."""
        ...

    def monotonic(self) -> float:
        """Seconds that only go forward: heartbeats and timeouts."""
        ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told to (trio's ``MockClock`` idea)."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start
        self.mono = 0.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.mono += seconds


SYSTEM_CLOCK = SystemClock()
