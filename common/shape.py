"""How large a stored JSON value may be: its nesting depth and its number of items.

Both bounds hold whatever the stack: msgspec (and ``json``) decode and encode
recursively, and their limit is the interpreter's recursion limit minus the
frames already on the stack, so a value that decodes on the submit path's
shallow stack (about 970 levels) fails on every deeper read path afterwards.
A job's args and a handler's result are therefore checked here, without
recursion, against ``MAX_DEPTH``, far below any stack's limit.

``MAX_ITEMS`` bounds what a value costs in memory. Decoded JSON is larger
than its text: ``[]`` is 2 bytes of JSON and ~64 bytes of list object, so a
1 MiB body of small containers became ~22 MB of objects. Every object, array,
key and scalar counts as one item; at ~60-80 bytes an item, a job at the bound
holds at most ~4 MB of objects, whatever it is made of.

The walk is breadth first, one level at a time, so it costs one ``type()``
check per item and never more than ``MAX_DEPTH`` + 1 levels.
"""

from __future__ import annotations

from typing import Any

import msgspec

MAX_DEPTH = 64  # nested objects and arrays, the value itself the first level
MAX_ITEMS = 50_000  # objects, arrays, keys and scalars in one job's args (or result)

_SCALARS = frozenset({str, int, float, bool, type(None)})
_FLAT = (str, int, float, bytes, bytearray, memoryview)


class ShapeError(ValueError):
    """A value is nested too deeply or holds too many items; the message says which."""


def _builtin(value: Any) -> Any:
    """A value of any other type as the builtins msgspec would encode it (results only)."""
    try:
        return msgspec.to_builtins(value)
    except RecursionError:
        raise ShapeError(f"nested deeper than {MAX_DEPTH} levels") from None
    except (TypeError, ValueError, OverflowError):
        return None  # not encodable at all: the engine's encoder says so, and counts it


def bound(text: bytes) -> tuple[int, int]:
    """Upper bounds on the depth and the items of the JSON value ``text``, from counts.

    Nesting needs a bracket a level, and a container of n members has n - 1 commas:
    so depth <= brackets and items <= 1 + 2 * (commas + brackets), keys included.
    Brackets and commas inside strings only raise the bounds. A few C-speed counts
    (~0.3 us for a typical job) that spare the walk for every value surely within.
    """
    brackets = text.count(b"[") + text.count(b"{")
    return brackets, 1 + 2 * (text.count(b",") + brackets)


def surely_within(text: bytes) -> bool:
    depth, items = bound(text)
    return depth <= MAX_DEPTH and items <= MAX_ITEMS


def measure(value: Any, *, max_depth: int = MAX_DEPTH, max_items: int = MAX_ITEMS) -> int:
    """The number of items in ``value``; ``ShapeError`` past ``max_depth`` or ``max_items``.

    Decoded JSON holds only dicts, lists and scalars. A handler's result may hold
    anything msgspec encodes (tuples, sets, structs, dataclasses...): those are
    walked as the builtins they encode to. What msgspec cannot encode at all is
    left to the encoder, which fails the attempt itself.
    """
    if type(value) is dict and len(value) < max_items // 2 and max_depth > 0:  # the usual:
        for v in value.values():  # one object of scalars, counted without the walk's lists
            if type(v) not in _SCALARS:
                break
        else:
            return 1 + 2 * len(value)  # itself, and each key and value
    items = 0
    depth = 0  # levels that held an object or array: the value's nesting
    level = [value]
    while level:
        items += len(level)
        if items > max_items:
            raise ShapeError(f"holds more than {max_items} values (objects, arrays, keys, scalars)")
        below: list[Any] = []
        nested = False
        for v in level:
            t = type(v)
            if t is list:
                nested = True
                below.extend(v)
            elif t is dict:
                nested = True
                items += len(v)  # its keys
                below.extend(v.values())
            elif t in _SCALARS or isinstance(v, _FLAT):
                continue  # subclasses of scalars (an IntEnum) and bytes encode flat too
            else:
                if not isinstance(v, dict | list | tuple | set | frozenset):
                    v = _builtin(v)
                    if not isinstance(v, dict | list):
                        continue
                nested = True
                if isinstance(v, dict):
                    items += len(v)
                    below.extend(v.values())
                else:
                    below.extend(v)
        if nested:
            depth += 1
            if depth > max_depth:
                raise ShapeError(f"nested deeper than {max_depth} levels")
        level = below
    return items
