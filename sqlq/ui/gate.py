"""What every dashboard request passes on its way in, apart from the session (``session``):
the headers every answer carries, a refusal drawn as a page, and the form.

Every answer carries a Content-Security-Policy that allows only this server's own
scripts and styles (htmx's eval and inline styles are turned off in ``base.html``)
and forbids framing, so no page can be clickjacked into an action.
"""

from __future__ import annotations

from urllib.parse import parse_qsl

from starlette.requests import Request

from sqlq.ui.options import PREFIX

MAX_FORM = 16 << 10
MAX_FORM_FIELDS = 20
FORM_TYPE = "application/x-www-form-urlencoded"
HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "x-frame-options": "DENY",
    # not no-referrer: with it, Chrome sends "Origin: null" on the pages' own form posts
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}


class Refused(Exception):
    """A request the dashboard answers with a page that says why (status, title, text)."""

    def __init__(self, status: int, title: str, text: str) -> None:
        super().__init__(text)
        self.status, self.title, self.text = status, title, text


async def read_form(request: Request) -> dict[str, str]:
    """The posted form: a browser's own (415 otherwise), at most ``MAX_FORM`` bytes, read
    as it arrives so a larger body is refused before it is all in memory."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != FORM_TYPE:
        raise Refused(415, "Refused", f"Actions are HTML forms ({FORM_TYPE}).")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM:
            raise Refused(413, "Refused", f"A form is at most {MAX_FORM} bytes.")
    try:
        return dict(parse_qsl(body.decode(), max_num_fields=MAX_FORM_FIELDS))
    except (UnicodeDecodeError, ValueError) as exc:
        raise Refused(400, "Refused", "The form could not be read.") from exc


def next_path(value: str | None) -> str:
    """Where a login goes back to: a dashboard path, never another site."""
    if value and value.startswith(f"{PREFIX}/") and not value.startswith("//"):
        return value
    return f"{PREFIX}/"
