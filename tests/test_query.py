"""Query parameters as the kernel takes them: a plain ``Mapping[str, str]`` (a dict, or a
web framework's multi-dict), each checked like a body's field, a bad one a 422 naming it."""

from __future__ import annotations

import pytest

from sqlq.common import query
from sqlq.common.errors import ValidationError
from sqlq.common.models import State


def test_a_plain_dict_is_a_query() -> None:
    q = query.job_query({"state": "dead", "kind": "mail.send", "queue": "q1", "limit": "7"})
    assert (q.state, q.kind, q.queue, q.limit, q.after) == (State.DEAD, "mail.send", "q1", 7, None)
    assert query.job_query({}).limit == 100
    assert query.wait_seconds({"wait": "2.5"}) == 2.5
    assert query.wait_seconds({}) == 0.0


def test_a_cursor_goes_back_as_it_came() -> None:
    job_id = "01a240f0aeed63f910739af795ca4302"
    assert query.job_query({"after": query.cursor(job_id)}).after == job_id


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"colour": "red"}, "colour"),
        ({"state": "asleep"}, "state"),
        ({"limit": "0"}, "limit"),
        ({"limit": "²"}, "limit"),
        ({"queue": "a b"}, "queue"),
        ({"after": "not-a-cursor"}, "after"),
        ({"kind": "x" * 129}, "kind"),
    ],
)
def test_a_bad_parameter_is_refused_naming_it(given: dict[str, str], field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        query.job_query(given)
    assert refused.value.field == field
