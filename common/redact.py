"""What a client may see of a server-side message: no absolute path, only base names.

One home for the rule "no absolute path in any message the client sees": the
HTTP errors, ``/healthz`` and ``/readyz`` apply it, and so do the engines to
what they report in ``/stats`` and on the dashboard (a store's failure, the
notes of a recovery). The full path goes to the server's log only.
"""

from __future__ import annotations

import re

_ABSOLUTE_PATH = re.compile(r"(?<![\w.])/(?:[^\s'\":,;()]+/)*([^\s'\":,;()/]+)")


def redact_paths(message: str) -> str:
    """``message`` with every absolute path cut to its last component."""
    return _ABSOLUTE_PATH.sub(lambda m: m.group(1), message)
