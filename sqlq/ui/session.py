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

**Guessing.** Failed logins are limited per client address (``MAX_FAILURES`` a
minute, then 429; ``sqlq.throttle``, as the API's 401 is), so the login
form is no faster an oracle than the API, and one address guessing never locks
the right token out for the others.

**The cookie is input.** It is parsed by one ASCII pattern with a bounded
expiry, never by ``str.isdigit`` (which takes ``²``) and ``int`` (which refuses
5,000 digits): a crafted cookie is just not a session.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re

from sqlq.common.clock import SYSTEM_CLOCK, Clock
from sqlq.throttle import MAX_FAILURES, WINDOW_S, Throttle

COOKIE = "sqlq_ui"
SESSION_S = 12 * 3600
FAILURE_WINDOW_S = WINDOW_S
__all__ = ["COOKIE", "FAILURE_WINDOW_S", "MAX_FAILURES", "SESSION_S", "Sessions"]
# <expires>.<mac>: an epoch second (12 digits last until the year 33658) and a SHA-256 hex mac
_COOKIE_VALUE = re.compile(r"([0-9]{1,12})\.([0-9a-f]{64})", re.ASCII)


def _mac(key: bytes, message: str) -> str:
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


class Sessions:
    def __init__(
        self, token: str | None, *, clock: Clock = SYSTEM_CLOCK, secret: bytes | None = None
    ) -> None:
        self._token = token.encode() if token else None
        self._clock = clock
        self._secret = secret or os.urandom(32)
        self._throttle = Throttle(clock)

    @property
    def required(self) -> bool:
        """Whether the dashboard asks for the token at all (``--token`` set)."""
        return self._token is not None

    def login(self, given: str, client: str | None = None) -> str | None:
        """A new session cookie's value for the right token; None for a wrong one, which
        counts against ``client`` (the connection's address)."""
        if self._token is None:
            return None
        if not hmac.compare_digest(given.encode(), self._token):
            self._throttle.failed(client)
            return None
        expires = int(self._clock.time()) + SESSION_S
        return f"{expires}.{_mac(self._token, f'sqlq-ui:{expires}')}"

    def throttled(self, client: str | None = None) -> bool:
        """Too many failed logins from ``client`` lately: refuse to check another."""
        return self._throttle.retry_after(client) is not None

    def valid(self, cookie: str | None) -> bool:
        """Whether a request with this cookie may see the dashboard."""
        if self._token is None:
            return True
        m = _COOKIE_VALUE.fullmatch(cookie) if cookie else None
        if m is None:
            return False
        expires, mac = m.groups()
        if int(expires) < self._clock.time():
            return False
        return hmac.compare_digest(mac, _mac(self._token, f"sqlq-ui:{expires}"))

    def csrf(self, cookie: str | None) -> str:
        """The value this session's forms carry."""
        return _mac(self._secret, f"csrf:{cookie if self._token else 'anon'}")

    def csrf_ok(self, cookie: str | None, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given, self.csrf(cookie))
