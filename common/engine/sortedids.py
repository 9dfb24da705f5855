"""``SortedIds``: a set of job ids kept in order, for paging through an index bucket.

A plain sorted list costs O(n) to insert into or delete from the middle, and a
page after a cursor must not copy the tail (paging through a million ids that
way is quadratic). ``sortedcontainers.SortedList`` keeps the ids in blocks with
each block's last id beside them: a bisect finds a position, an insert or a
delete moves at most a block's pointers, and ``irange`` walks on from a cursor
without copying. Job ids are time-ordered, so almost every insert lands past
the end, which SortedList does as an append.

sortedcontainers ships no type information; this class is the typed face the
index uses, and the only place that names the library.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from sortedcontainers import SortedList  # type: ignore[import-untyped]


class SortedIds:
    __slots__ = ("_ids",)

    def __init__(self, ordered: Iterable[str] = ()) -> None:
        """``ordered``: distinct ids, already sorted (a bulk build: sorting them again is
        a linear pass)."""
        self._ids = SortedList(ordered)

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, x: str) -> bool:
        return x in self._ids

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def add(self, x: str) -> None:
        """Insert ``x``, which must not be present (the index's callers know)."""
        self._ids.add(x)

    def discard(self, x: str) -> None:
        """Remove ``x`` if present."""
        self._ids.discard(x)

    def after(self, x: str | None) -> Iterator[str]:
        """The ids greater than ``x`` (all of them if ``x`` is None), in order, lazily."""
        return iter(self._ids.irange(x, inclusive=(False, True)))

    def before(self, x: str | None) -> Iterator[str]:
        """The ids less than ``x`` (all of them if ``x`` is None), newest first, lazily: a
        newest-first page walks back from its cursor without copying, as ``after`` does."""
        return iter(self._ids.irange(None, x, inclusive=(True, False), reverse=True))
