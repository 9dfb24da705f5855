"""``sqlq.common.shape``: the walk agrees with plain recursion, and ``bound`` never undercounts."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sqlq.common.shape import MAX_DEPTH, MAX_ITEMS, ShapeError, bound, measure

SCALARS = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet="ab,:[]{}\"\\ é")  # brackets and commas in strings only raise bounds
)  # fmt: skip
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=60,
)


def reference(value: Any) -> tuple[int, int]:
    """(depth, items) by plain recursion: what ``measure`` must agree with."""
    if isinstance(value, dict):
        inner = [reference(v) for v in value.values()]
        return 1 + max((d for d, _ in inner), default=0), 1 + len(value) + sum(n for _, n in inner)
    if isinstance(value, list):
        inner = [reference(v) for v in value]
        return 1 + max((d for d, _ in inner), default=0), 1 + sum(n for _, n in inner)
    return 0, 1


@settings(max_examples=80, deadline=None)
@given(JSON)
def test_the_walk_agrees_with_recursion_and_the_counts_bound_it(value: Any) -> None:
    walk_agrees(value)


@pytest.mark.slow
@settings(max_examples=1000, deadline=None)
@given(JSON)
def test_the_walk_agrees_with_recursion_over_many_values(value: Any) -> None:
    walk_agrees(value)


def walk_agrees(value: Any) -> None:
    depth, items = reference(value)
    assert measure(value, max_depth=1000, max_items=10**9) == items
    most_depth, most_items = bound(msgspec.json.encode(value))
    assert depth <= most_depth
    assert items <= most_items


def _nested(levels: int) -> Any:
    value: Any = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_the_limits_are_inclusive() -> None:
    measure(_nested(MAX_DEPTH))
    with pytest.raises(ShapeError, match=f"nested deeper than {MAX_DEPTH}"):
        measure(_nested(MAX_DEPTH + 1))
    measure(list(range(MAX_ITEMS - 1)))
    with pytest.raises(ShapeError, match=f"more than {MAX_ITEMS}"):
        measure(list(range(MAX_ITEMS)))


def test_other_containers_are_walked_as_what_they_encode_to() -> None:
    class Point(msgspec.Struct):
        xs: list[int]

    assert measure({"p": Point([1, 2]), "t": (1, (2,)), "s": {3}}) == 15
    with pytest.raises(ShapeError):
        measure((_nested(MAX_DEPTH),))
    assert measure({"x": object()}) == 3  # left to the encoder, which refuses it


def test_an_object_of_scalars_counts_as_the_walk_counts_it_up_to_the_limits() -> None:
    """The usual args and results (one object of scalars) skip the walk's lists: the count,
    and both limits, are still the walk's."""
    flat = {str(i): i for i in range(10)}
    assert measure(flat) == reference(flat)[1]
    with pytest.raises(ShapeError, match="nested deeper than 0"):
        measure(flat, max_depth=0)
    measure({str(i): i for i in range(MAX_ITEMS // 2 - 1)})  # 1 + 2n items: within
    with pytest.raises(ShapeError, match=f"more than {MAX_ITEMS}"):
        measure({str(i): i for i in range(MAX_ITEMS // 2)})
