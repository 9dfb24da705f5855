"""What a running job carries besides its state: progress, a checkpoint, its errors.

These are plain stored fields of ``Job`` and ``Transition``, written whole like
every other field (an engine stores what a transition says and computes nothing),
so the rules of how they change live here and in ``Job``'s constructors only:

- ``Progress``: the latest a handler reported (``ctx.progress``), replaced whole.
- A checkpoint: a small JSON value a handler saves (``ctx.checkpoint``) for the next
  attempt of the same job. Kept across retries, cleared when the job completes.
- ``AttemptError``: one failed attempt, newest last; a job keeps the last
  ``MAX_ERRORS``, each cut to ``MAX_HISTORY_ERROR_BYTES`` (``last_error`` keeps up to
  4 KiB of the newest), with its traceback, each cut to ``MAX_TRACEBACK_BYTES`` (its
  head and the frames nearest the error), and the oldest tracebacks dropped past
  ``MAX_TRACEBACKS_BYTES`` in all: so the history costs at most ~42 KiB a job, and a
  job that fails the same way ten times keeps four of its tracebacks at worst.

Each is bounded here, in one place: the runtime checks a handler's value with
``check_progress``/``check_checkpoint`` before anything is written, so a bad value
fails that call (or that attempt), never the store.
"""

from __future__ import annotations

from typing import Any

import msgspec

from sqlq.common.shape import ShapeError, measure

MAX_ERROR_BYTES = 4096  # last_error is a diagnosis, not a log: longer text is cut
MAX_ERRORS = 10  # failures a job keeps in ``errors``, newest last
MAX_HISTORY_ERROR_BYTES = 1024  # of each one's text (last_error keeps up to 4 KiB)
MAX_TRACEBACK_BYTES = 8192  # of each one's traceback: its head and its last frames
MAX_TRACEBACKS_BYTES = 32 * 1024  # of all of a job's: the oldest lose theirs first
MAX_CHECKPOINT_BYTES = 64 * 1024  # a checkpoint's JSON
MAX_PROGRESS_MESSAGE = 256  # characters of a progress message
DEFAULT_MAX_SNOOZES = 100  # snoozes after which a job is dead-lettered (--max-snoozes)
MAX_SNOOZE_S = 366 * 86400  # the longest one snooze may be: a year and a day


class Progress(msgspec.Struct, frozen=True, kw_only=True):
    """How far the current (or last) attempt got, as its handler said, and when."""

    percent: float | None = None  # 0 to 100
    message: str | None = None
    at: float  # wall-clock seconds


class AttemptError(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One failed attempt: its number (1-based, among every attempt the job made:
    ``Job.all_attempts``), why, and when; and where, if its handler raised (the
    traceback, omitted from a record without one, as every record before it)."""

    attempt: int
    error: str
    at: float
    traceback: str | None = None


def check_progress(percent: Any, message: Any, at: float) -> Progress:
    """A handler's progress as a ``Progress``; ``ValueError`` naming what is wrong."""
    if percent is not None:
        if isinstance(percent, bool) or not isinstance(percent, int | float):
            raise ValueError("progress percent must be a number from 0 to 100, or None")
        if not 0 <= percent <= 100:  # (NaN fails this too)
            raise ValueError(f"progress percent must be from 0 to 100, not {percent!r}")
        percent = float(percent)
    if message is not None:
        if not isinstance(message, str):
            raise ValueError("progress message must be a string, or None")
        if len(message) > MAX_PROGRESS_MESSAGE:
            raise ValueError(f"progress message is longer than {MAX_PROGRESS_MESSAGE} characters")
        message = clean_error(message)
    return Progress(percent=percent, message=message, at=at)


def check_checkpoint(data: Any) -> Any:
    """``data`` as a checkpoint (its JSON builtins); ``ValueError`` if it is None, past the
    bounds of a stored value, not JSON, or over ``MAX_CHECKPOINT_BYTES`` encoded."""
    if data is None:
        raise ValueError("a checkpoint cannot be None (a job without one reads None)")
    try:
        measure(data)
        encoded = msgspec.json.encode(data)
    except ShapeError as exc:
        raise ValueError(f"the checkpoint {exc}") from None
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValueError(f"the checkpoint is not JSON-serialisable: {exc}") from None
    if len(encoded) > MAX_CHECKPOINT_BYTES:
        raise ValueError(
            f"the checkpoint is {len(encoded)} bytes of JSON, over {MAX_CHECKPOINT_BYTES}"
        )
    return msgspec.json.decode(encoded)


def check_snooze(seconds: Any) -> float:
    """A snooze's delay in seconds; ``ValueError`` unless 0 to ``MAX_SNOOZE_S``."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ValueError("a snooze's delay must be a number of seconds")
    if not 0 <= seconds <= MAX_SNOOZE_S:
        raise ValueError(f"a snooze's delay must be from 0 to {MAX_SNOOZE_S} s, not {seconds!r}")
    return float(seconds)


def with_error(
    errors: tuple[AttemptError, ...],
    attempt: int,
    error: str,
    at: float,
    traceback: str | None = None,
) -> tuple[AttemptError, ...]:
    """``errors`` with one more failure (``error`` already cleaned; ``traceback`` cleaned
    and cut here), the oldest dropped past ``MAX_ERRORS``, and the oldest tracebacks past
    ``MAX_TRACEBACKS_BYTES``."""
    data = error.encode("utf-8")
    if len(data) > MAX_HISTORY_ERROR_BYTES:
        error = data[: MAX_HISTORY_ERROR_BYTES - 16].decode("utf-8", "ignore") + " ... (truncated)"
    tb = None if traceback is None else clean_traceback(traceback)
    kept = [*errors[-(MAX_ERRORS - 1) :], AttemptError(attempt=attempt, error=error, at=at,
                                                       traceback=tb)]  # fmt: skip
    total = 0
    for i in range(len(kept) - 1, -1, -1):  # newest first: the oldest give theirs up
        e = kept[i]
        if e.traceback is None:
            continue
        total += len(e.traceback.encode("utf-8"))
        if total > MAX_TRACEBACKS_BYTES:
            kept[i] = AttemptError(attempt=e.attempt, error=e.error, at=e.at)
    return tuple(kept)


def clean_traceback(text: str) -> str:
    """A traceback as every engine can store it (``clean_error``'s escapes), at most
    ``MAX_TRACEBACK_BYTES``: past that, its first line and as many of its last lines as fit
    (the frames nearest the error, and the error), with how much was cut between."""
    text = _storable(text)
    data = text.encode("utf-8")
    if len(data) <= MAX_TRACEBACK_BYTES:
        return text
    head = text.partition("\n")[0].encode("utf-8")[:256].decode("utf-8", "ignore")
    tail = data[-(MAX_TRACEBACK_BYTES - len(head.encode("utf-8")) - 64) :]
    tail_text = tail.decode("utf-8", "ignore")
    tail_text = tail_text[tail_text.find("\n") + 1 :]  # from a whole line
    cut = len(data) - len(head.encode("utf-8")) - len(tail_text.encode("utf-8"))
    return f"{head}\n  ... ({cut} bytes cut) ...\n{tail_text}"


def _storable(text: str) -> str:
    """``text`` as valid UTF-8 with no NUL (PostgreSQL's text holds none)."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def clean_error(text: str) -> str:
    """``text`` as a ``last_error`` every engine can store: valid UTF-8, at most 4 KiB.

    A handler's exception message may hold anything: lone surrogates from a
    filename decoded with ``surrogateescape`` cannot be encoded as UTF-8, and
    would fail the encode of the whole record. They become ``\\udcff`` escapes, and a
    NUL (which PostgreSQL's text cannot hold) becomes ``\\x00``.
    """
    text = _storable(text)
    data = text.encode("utf-8")
    if len(data) <= MAX_ERROR_BYTES:
        return text
    cut = data[: MAX_ERROR_BYTES - 16].decode("utf-8", "ignore")  # never split a character
    return cut + " ... (truncated)"
