"""The per-client throttle of wrong tokens: pure, on a fake clock, with literal times."""

from __future__ import annotations

import pytest

from sqlq.common.clock import FakeClock
from sqlq.throttle import Throttle, client_key


def test_one_client_guessing_locks_out_that_client_only() -> None:
    clock = FakeClock()
    clock.mono = 1000.0
    t = Throttle(clock, max_failures=3, window_s=60.0)
    for second in (1000.0, 1010.0, 1020.0):
        clock.mono = second
        assert t.retry_after("10.0.0.1") is None
        t.failed("10.0.0.1")
    assert t.retry_after("10.0.0.1") == 40.0  # until the failure at 1000 is a minute old
    assert t.retry_after("10.0.0.2") is None  # everyone else is not affected
    clock.mono = 1059.0
    assert t.retry_after("10.0.0.1") == 1.0
    clock.mono = 1060.0  # the failure at 1000 has left the window
    assert t.retry_after("10.0.0.1") is None
    t.failed("10.0.0.1")
    assert t.retry_after("10.0.0.1") == 10.0  # 1010 and 1020 are still inside it


def test_failures_spread_out_never_lock() -> None:
    clock = FakeClock()
    t = Throttle(clock, max_failures=3, window_s=60.0)
    for second in (0.0, 25.0, 50.0, 75.0, 100.0, 125.0):
        clock.mono = second
        assert t.retry_after("10.0.0.1") is None
        t.failed("10.0.0.1")
    clock.mono = 200.0
    assert t.retry_after("10.0.0.1") is None
    assert len(t) == 0  # an expired client is dropped when asked about


def test_the_table_is_bounded_and_forgets_the_oldest_client() -> None:
    clock = FakeClock()
    t = Throttle(clock, max_failures=2, window_s=60.0, max_clients=3)
    for i in range(2):
        t.failed("10.0.0.1")
        clock.mono = float(i)
    for n in range(2, 1000):
        t.failed(f"10.0.{n // 256}.{n % 256}")
    assert len(t) == 3
    assert t.retry_after("10.0.0.1") is None  # forgotten: only its count is lost


def test_a_client_remembers_at_most_max_failures() -> None:
    t = Throttle(FakeClock(), max_failures=3)
    for _ in range(10_000):
        t.failed("10.0.0.1")
    assert len(t._failures["10.0.0.1"]) == 3


@pytest.mark.parametrize(
    ("address", "key"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("2001:db8::1", "2001:db8::/64"),
        ("2001:db8::ffff:1", "2001:db8::/64"),  # the same /64: one client
        ("2001:db8:0:1::1", "2001:db8:0:1::/64"),
        ("::ffff:192.0.2.7", "192.0.2.7"),
        (None, "-"),
        ("", "-"),
        ("x" * 5000, "x" * 64),
    ],
)
def test_client_keys(address: str | None, key: str) -> None:
    assert client_key(address) == key
