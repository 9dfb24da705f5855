"""Failed credentials, counted per client address: past a few a minute, refuse to check more.

Both doors that take the token use one of these: the API's bearer header
(``Guard``: a 429 instead of a check) and the dashboard's login form
(``sqlq.ui.session``). It counts per client, so one client's guessing locks
out that client only, never the right token from everyone else.

The client is the address the connection came from: an IPv4 address, or an
IPv6 address's /64 (one host is commonly given a whole /64, so counting single
IPv6 addresses would let it spread its guesses over 2^64 of them). The table is
bounded (``MAX_CLIENTS``; the least recently failing client is forgotten first)
because the number of addresses is an input too; each client keeps at most
``MAX_FAILURES`` times. A client that is forgotten loses only its count, so the
bound costs an attacker with that many addresses nothing it did not have.

Pure logic on an injected clock (``monotonic``): no I/O, no timers.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict, deque

from sqlq.common.clock import SYSTEM_CLOCK, Clock

MAX_FAILURES = 10  # wrong credentials per WINDOW_S from one client, then refused
WINDOW_S = 60.0
MAX_CLIENTS = 4096  # clients with recent failures remembered at once
IPV6_PREFIX = 64
MAX_KEY = 64  # characters of an address that is not an IP address (a socket path, say)


def client_key(address: str | None) -> str:
    """The bucket ``address`` counts in: an IPv4 address, an IPv6 /64, or the text clipped."""
    if not address:
        return "-"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:MAX_KEY]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, IPV6_PREFIX), strict=False))
    return str(ip)


class Throttle:
    """Recent failures per client; ``retry_after`` says whether (and how long) to refuse."""

    def __init__(
        self,
        clock: Clock = SYSTEM_CLOCK,
        *,
        max_failures: int = MAX_FAILURES,
        window_s: float = WINDOW_S,
        max_clients: int = MAX_CLIENTS,
    ) -> None:
        self._clock = clock
        self._max = max_failures
        self._window = window_s
        self._max_clients = max_clients
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._failures)

    def retry_after(self, address: str | None) -> float | None:
        """Seconds until ``address`` may try again; None: check its credential now.

        Cheap while no client has failed lately (the API asks on every request)."""
        if not self._failures:
            return None
        key = client_key(address)
        times = self._failures.get(key)
        if times is None:
            return None
        now = self._clock.monotonic()
        while times and now - times[0] >= self._window:
            times.popleft()
        if not times:
            del self._failures[key]
            return None
        if len(times) < self._max:
            return None
        return self._window - (now - times[0])

    def failed(self, address: str | None) -> None:
        """``address`` sent a wrong credential."""
        key = client_key(address)
        times = self._failures.pop(key, None)
        if times is None:
            times = deque(maxlen=self._max)
            while len(self._failures) >= self._max_clients:
                self._failures.popitem(last=False)
        times.append(self._clock.monotonic())
        self._failures[key] = times  # the most recent failure last: evicted last
