"""Who may use the dashboard, and proof that an action came from its own pages.

**The session cookie.** With ``--token`` (or ``--token-file``) set, the browser
proves a token once (the login form) and then carries
``sqlq_ui=<expires>.<mac>.<name>``: the principal's name, and an HMAC of the expiry and
the name under a key only that principal's secret makes (``Roster.sign``). The cookie
is HttpOnly (no script reads it), SameSite=Strict (no other site's page sends it) and
scoped to ``/ui``; the token itself is never stored in the browser, and changing a
token ends its sessions. The JSON API does not accept the cookie: it keeps to bearer
tokens, so the cookie's reach is the dashboard only.

**Who may sign in.** The ``admin`` role, and ``read`` to look: a read session sees
every page and may change nothing, as ``--ui-read-only`` does (``sqlq.ui.app``). A
submit or worker token is refused (403): those roles are for programs, and the
dashboard shows every queue's jobs.

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
from sqlq.common.roles import ADMIN, Principal, Role, Roster, roster
from sqlq.throttle import MAX_FAILURES, WINDOW_S, Throttle

COOKIE = "sqlq_ui"
SESSION_S = 12 * 3600
FAILURE_WINDOW_S = WINDOW_S
__all__ = ["COOKIE", "FAILURE_WINDOW_S", "MAX_FAILURES", "SESSION_S", "NotForTheDashboard",
           "Sessions"]  # fmt: skip
# <expires>.<mac>.<name>: an epoch second (12 digits last until the year 33658), a SHA-256
# hex mac, and a principal's name (``sqlq.common.roles.NAME_PATTERN``)
_COOKIE_VALUE = re.compile(r"([0-9]{1,12})\.([0-9a-f]{64})\.([A-Za-z0-9_.:-]{1,64})", re.ASCII)
SIGNS_IN = frozenset({Role.ADMIN, Role.READ})  # the roles the dashboard takes


class NotForTheDashboard(Exception):
    """A right token whose role the dashboard does not take (submit, worker)."""

    def __init__(self, who: Principal) -> None:
        super().__init__(f"the {who.role.value} role ({who.name}) cannot use the dashboard")
        self.who = who


def _mac(key: bytes, message: str) -> str:
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


class Sessions:
    """``tokens``: the server's ``Roster`` (a bare ``--token`` string is made into one);
    None: no token, and every request is the admin's."""

    def __init__(
        self,
        tokens: Roster | str | None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        secret: bytes | None = None,
    ) -> None:
        self._roster = roster(tokens or None) if isinstance(tokens, str) else tokens
        self._clock = clock
        self._secret = secret or os.urandom(32)
        self._throttle = Throttle(clock)

    @property
    def required(self) -> bool:
        """Whether the dashboard asks for a token at all (``--token`` or ``--token-file``)."""
        return self._roster is not None

    def login(self, given: str, client: str | None = None) -> str | None:
        """A new session cookie's value for a right token; None for a wrong one, which
        counts against ``client`` (the connection's address); ``NotForTheDashboard`` for a
        right one of a role the dashboard does not take (no guess: not counted)."""
        if self._roster is None:
            return None
        who = self._roster.find(given)
        if who is None:
            self._throttle.failed(client)
            return None
        if who.role not in SIGNS_IN:
            raise NotForTheDashboard(who)
        expires = int(self._clock.time()) + SESSION_S
        mac = self._roster.sign(who.name, f"sqlq-ui:{who.name}:{expires}")
        return f"{expires}.{mac}.{who.name}"

    def throttled(self, client: str | None = None) -> bool:
        """Too many failed logins from ``client`` lately: refuse to check another."""
        return self._throttle.retry_after(client) is not None

    def who(self, cookie: str | None) -> Principal | None:
        """Whom a request with this cookie is signed in as; None: nobody (sign in).
        Without a token every request is the admin's."""
        if self._roster is None:
            return ADMIN
        m = _COOKIE_VALUE.fullmatch(cookie) if cookie else None
        if m is None:
            return None
        expires, mac, name = m.groups()
        if int(expires) < self._clock.time():
            return None
        expected = self._roster.sign(name, f"sqlq-ui:{name}:{expires}")
        if expected is None or not hmac.compare_digest(mac, expected):
            return None
        who = self._roster.named(name)
        return who if who is not None and who.role in SIGNS_IN else None

    def valid(self, cookie: str | None) -> bool:
        """Whether a request with this cookie may see the dashboard."""
        return self.who(cookie) is not None

    def csrf(self, cookie: str | None) -> str:
        """The value this session's forms carry."""
        return _mac(self._secret, f"csrf:{cookie if self._roster else 'anon'}")

    def csrf_ok(self, cookie: str | None, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given, self.csrf(cookie))
