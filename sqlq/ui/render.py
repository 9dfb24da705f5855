"""How the dashboard draws: the Jinja2 environment with its filters, a job's JSON as the
job page shows it, and the static files.

Templates are autoescaped, compiled once by a thread at the dashboard's first request and
never reloaded (they are package data), so a page costs its render and nothing else on the
event loop.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections import OrderedDict
from importlib import resources
from typing import Any

import msgspec
from jinja2 import Environment, PackageLoader, StrictUndefined

from sqlq.common.fair import describe
from sqlq.common.models import State
from sqlq.common.schedule import schedule_of
from sqlq.common.wire import JobView
from sqlq.ui.options import PREFIX

MAX_SHOWN_JSON = 64 << 10  # characters of args or result a job page shows
STATIC = {  # file -> media type; pinned versions in static/VENDORED.md
    "htmx.min.js": "text/javascript; charset=utf-8",
    "ui.js": "text/javascript; charset=utf-8",
    "ui.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def ago(ts: float | None, now: float) -> str:
    if ts is None:
        return "-"
    s = now - ts
    ahead = s < 0
    s = abs(s)
    text = f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.0f} h"
    return f"in {text}" if ahead else f"{text} ago"


def size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def short(job_id: str) -> str:
    return job_id[:12]


def json_size(value: Any) -> int:
    """Bytes of ``value`` as JSON: what a checkpoint weighs (the page shows no more of it)."""
    return len(msgspec.json.encode(value))


def pretty(value: Any) -> str:
    """``value`` as indented JSON, cut to ``MAX_SHOWN_JSON`` characters (msgspec: 3 ms for
    1 MB of JSON where ``json.dumps(indent=2)`` took 128 ms of the event loop, measured)."""
    text = msgspec.json.format(msgspec.json.encode(value), indent=2).decode()
    if len(text) > MAX_SHOWN_JSON:
        return text[:MAX_SHOWN_JSON] + f"\n… ({len(text) - MAX_SHOWN_JSON} more characters)"
    return text


class ShownArgs:
    """A job's args as the job page shows them, made once per (id, epoch) and kept for
    the last ``size`` jobs shown: a page left open re-renders nothing of them."""

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._shown: OrderedDict[tuple[str, int], str] = OrderedDict()

    def get(self, job: JobView) -> str:
        key = (job.id, job.epoch)
        text = self._shown.get(key)
        if text is None:
            text = self._shown[key] = pretty(job.args)
            if len(self._shown) > self.size:
                self._shown.popitem(last=False)
        else:
            self._shown.move_to_end(key)
        return text


def environment() -> Environment:
    """The templates, each compiled once (then kept: ``auto_reload`` off), by a thread at the
    dashboard's first request (``Dashboard.compiled``). Compiling them all here cost every
    start ~65 ms before /readyz (experiment K's restart)."""
    env = Environment(
        loader=PackageLoader("sqlq.ui", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,  # templates are package data: no stat() per render on the loop
    )
    env.filters.update(when=when, size=size, pretty=pretty, short=short, made_by=schedule_of,
                       json_size=json_size, policy=describe)  # fmt: skip
    env.globals.update(prefix=PREFIX, states=[s.value for s in State])
    return env


def static_files() -> dict[str, tuple[bytes, str, str]]:
    """Each static file's body, media type and ETag, read once at start."""
    found = {}
    for name, media in STATIC.items():
        body = resources.files("sqlq.ui").joinpath("static", name).read_bytes()
        found[name] = (body, media, hashlib.sha256(body).hexdigest()[:16])
    return found
