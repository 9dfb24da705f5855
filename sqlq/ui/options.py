"""What ``sqlq serve`` tells the dashboard, apart from the dashboard itself: importing
this costs nothing, so ``--no-ui`` never loads Jinja2 or compiles a template."""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "/ui"


@dataclass(frozen=True, kw_only=True)
class UiOptions:
    read_only: bool = False  # --ui-read-only: pages only, every action refused
    secure_cookie: bool = False  # --ui-secure-cookie: behind a proxy that terminates TLS
