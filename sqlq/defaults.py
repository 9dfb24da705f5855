"""Where a client connects when it is not told: ``configure()``, then the environment.

    import sqlq
    sqlq.configure(url="https://queue.internal", token=read_secret())

``Client()`` and ``AsyncClient()`` with no ``url`` take the one ``configure`` set, else
``SQLQ_URL``, else ``http://127.0.0.1:8080``; with no ``token``, the one ``configure``
set, else ``SQLQ_TOKEN``, else none. The same variables the CLI reads (``--url``,
``--token``), so an app and ``sqlq jobs`` point at the same server. Its own module, so
that ``sqlq.configure`` imports no HTTP client.
"""

from __future__ import annotations

import os

DEFAULT_URL = "http://127.0.0.1:8080"
URL_VAR, TOKEN_VAR = "SQLQ_URL", "SQLQ_TOKEN"

_configured: dict[str, str | None] = {}


def configure(*, url: str | None = None, token: str | None = None) -> None:
    """The URL and token every client made after this uses when given none (None: the
    environment's again)."""
    _configured["url"] = url
    _configured["token"] = token


def client_url(url: str | None) -> str:
    """``url``, or the configured one, or ``SQLQ_URL``, or the default."""
    return url or _configured.get("url") or os.environ.get(URL_VAR) or DEFAULT_URL


def client_token(token: str | None) -> str | None:
    """``token``, or the configured one, or ``SQLQ_TOKEN`` (an empty one is none)."""
    return token or _configured.get("token") or os.environ.get(TOKEN_VAR) or None
