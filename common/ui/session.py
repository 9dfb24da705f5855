"""Who may use the dashboard, and proof that an action came from its own pages.

**The session cookie.** With ``--token`` set, the browser proves it once (the
login form) and then carries ``sqlq_ui=<expires>.<mac>``, where the mac is an
HMAC of the expiry keyed by the token. The cookie is HttpOnly (no script reads
it), SameSite=Strict (no other site's page sends it) and scoped to ``/ui``; the
token itself is never stored in the browser, and changing ``--token`` ends
every session. The JSON API does not accept the cookie: it keeps to bearer
tokens, so the cookie's reach is the dashboard only.

**CSRF.** Every form that changes something carries a field derived from a
secret this process drew at start and the session (or ``anon`` without a
token): a page on another site can neither read it nor compute it. SameSite and
the guard's Origin check are two more walls; this one also holds for browsers
that send neither. A token from before a restart is refused (reload the page).

**Guessing.** Failed logins are limited (``MAX_FAILURES`` a minute, then 429),
so the login form is no faster an oracle than the API's 401.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections import deque

from common.clock import SYSTEM_CLOCK, Clock

COOKIE = "sqlq_ui"
SESSION_S = 12 * 3600
MAX_FAILURES = 10  # failed logins per FAILURE_WINDOW_S, then 429
FAILURE_WINDOW_S = 60.0


def _mac(key: bytes, message: str) -> str:
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


class Sessions:
    def __init__(
        self, token: str | None, *, clock: Clock = SYSTEM_CLOCK, secret: bytes | None = None
    ) -> None:
        self._token = token.encode() if token else None
        self._clock = clock
        self._secret = secret or os.urandom(32)
        self._failures: deque[float] = deque()

    @property
    def required(self) -> bool:
        """Whether the dashboard asks for the token at all (``--token`` set)."""
        return self._token is not None

    def login(self, given: str) -> str | None:
        """A new session cookie's value for the right token; None for a wrong one."""
        if self._token is None:
            return None
        if not hmac.compare_digest(given.encode(), self._token):
            self._failures.append(self._clock.monotonic())
            return None
        expires = int(self._clock.time()) + SESSION_S
        return f"{expires}.{_mac(self._token, f'sqlq-ui:{expires}')}"

    def throttled(self) -> bool:
        """Too many failed logins lately: refuse to check another."""
        now = self._clock.monotonic()
        while self._failures and now - self._failures[0] > FAILURE_WINDOW_S:
            self._failures.popleft()
        return len(self._failures) >= MAX_FAILURES

    def valid(self, cookie: str | None) -> bool:
        """Whether a request with this cookie may see the dashboard."""
        if self._token is None:
            return True
        if not cookie or "." not in cookie:
            return False
        expires, mac = cookie.split(".", 1)
        if not expires.isdigit() or int(expires) < self._clock.time():
            return False
        return hmac.compare_digest(mac, _mac(self._token, f"sqlq-ui:{expires}"))

    def csrf(self, cookie: str | None) -> str:
        """The value this session's forms carry."""
        return _mac(self._secret, f"csrf:{cookie if self._token else 'anon'}")

    def csrf_ok(self, cookie: str | None, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given, self.csrf(cookie))
