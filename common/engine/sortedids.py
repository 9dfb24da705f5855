"""``SortedIds``: a set of job ids kept in order, for paging through an index bucket.

A plain sorted list costs O(n) to insert into or delete from the middle, and a
page after a cursor must not copy the tail (paging through a million ids that
way is quadratic). Here the ids sit in blocks of at most ``2 * LOAD``, with
each block's last id in ``_maxes``: finding a position is a bisect over the
blocks and one within a block, an insert or a delete moves at most a block's
pointers, and a page walks on from the cursor without copying anything.

Job ids are time-ordered, so almost every insert lands past the end: that path
is an append. Deletes come mostly from the front (old jobs finishing, or pruned
past retention), and a block that shrinks is merged into its neighbour, so the
blocks stay few whatever the order of deletes.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Iterator

LOAD = 512  # a block splits at 2 * LOAD ids; one below LOAD // 4 merges into its neighbour


class SortedIds:
    __slots__ = ("_len", "_lists", "_maxes")

    def __init__(self, ordered: Iterable[str] = ()) -> None:
        """``ordered``: ids already sorted and distinct (a bulk build, in C-sized steps)."""
        ids = ordered if isinstance(ordered, list) else list(ordered)
        self._lists = [ids[i : i + LOAD] for i in range(0, len(ids), LOAD)]
        self._maxes = [block[-1] for block in self._lists]
        self._len = len(ids)

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __contains__(self, x: str) -> bool:
        maxes = self._maxes
        i = bisect_left(maxes, x)
        if i == len(maxes):
            return False
        block = self._lists[i]
        j = bisect_left(block, x)
        return block[j] == x

    def __iter__(self) -> Iterator[str]:
        for block in self._lists:
            yield from block

    def add(self, x: str) -> None:
        """Insert ``x``, which must not be present (the index's callers know)."""
        maxes, lists = self._maxes, self._lists
        self._len += 1
        if not maxes:
            lists.append([x])
            maxes.append(x)
            return
        if x > maxes[-1]:  # the common case: a new id, past every other
            i = len(maxes) - 1
            block = lists[i]
            block.append(x)
            maxes[i] = x
        else:
            i = bisect_left(maxes, x)
            block = lists[i]
            insort(block, x)
        if len(block) > 2 * LOAD:
            lists.insert(i + 1, block[LOAD:])
            del block[LOAD:]
            maxes.insert(i, block[-1])

    def discard(self, x: str) -> None:
        """Remove ``x`` if present."""
        maxes, lists = self._maxes, self._lists
        i = bisect_left(maxes, x)
        if i == len(maxes):
            return
        block = lists[i]
        j = bisect_left(block, x)
        if block[j] != x:
            return
        del block[j]
        self._len -= 1
        if len(block) >= LOAD // 4:
            if j == len(block):
                maxes[i] = block[-1]
            return
        if not block:
            del lists[i], maxes[i]
            return
        # Too small: merge with a neighbour, so that deletes never leave many tiny blocks.
        k = i + 1 if i + 1 < len(lists) else i - 1
        if k < 0:
            maxes[i] = block[-1]
            return
        lo, hi = min(i, k), max(i, k)
        merged = lists[lo] + lists[hi]
        del lists[hi], maxes[hi]
        if len(merged) > 2 * LOAD:
            lists[lo : lo + 1] = [merged[:LOAD], merged[LOAD:]]
            maxes[lo : lo + 1] = [merged[LOAD - 1], merged[-1]]
        else:
            lists[lo] = merged
            maxes[lo] = merged[-1]

    def after(self, x: str | None) -> Iterator[str]:
        """The ids greater than ``x`` (all of them if ``x`` is None), in order, lazily: a
        bisect to the position, then a walk that copies at most one block."""
        lists = self._lists
        if x is None:
            i, j = 0, 0
        else:
            i = bisect_right(self._maxes, x)
            if i == len(lists):
                return
            j = bisect_right(lists[i], x)
        while i < len(lists):
            block = lists[i]
            yield from block[j:] if j else block
            i, j = i + 1, 0
