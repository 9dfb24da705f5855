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
        """Wall-clock seconds since the epoch."""
        ...


class SystemClock:
    def time(self) -> float:
        return time.time()


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


SYSTEM_CLOCK = SystemClock()
