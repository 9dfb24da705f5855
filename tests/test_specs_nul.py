"""No NUL in a name (``sqlq.common.specs``): every string field of every body is held to
it at ``decode``, naming the field, while JSON values and the free text a worker reports
keep theirs; query parameters are held to the same rule (``sqlq.common.query``)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from sqlq.common import query
from sqlq.common.errors import ValidationError
from sqlq.common.protocol import ClaimRequest, HeartbeatRequest, OutcomesRequest
from sqlq.common.schedule import decode_schedule
from sqlq.common.specs import CancelSpec, RetrySpec, decode, decode_batch, decode_job

NUL = "\x00"


def _refused(field: str, decoding: Any) -> None:
    with pytest.raises(ValidationError) as refused:
        decoding()
    assert (refused.value.field, refused.value.message) == (field, "must not contain NUL (\\u0000)")


_body = msgspec.json.encode  # (which spells a NUL ``\\u0000``, as JSON must)


@pytest.mark.parametrize(
    ("spec", "value", "field"),
    [
        (ClaimRequest, {"queues": ["q"], "worker": "w", "kinds": ["a", NUL]}, "kinds[1]"),
        (RetrySpec, {"kind": f"a{NUL}"}, "kind"),
        (CancelSpec, {"kind": NUL}, "kind"),
        (HeartbeatRequest, {"items": [{"token": "t"}, {"token": f"t{NUL}"}]}, "items[1].token"),
        (OutcomesRequest, {"outcomes": [{"token": f"{NUL}", "complete": {}}]}, "outcomes[0].token"),
        (
            ClaimRequest,
            {"queues": ["q"], "worker": "w", "outcomes": [{"token": f"t{NUL}", "release": {}}]},
            "outcomes[0].token",
        ),
    ],
)
def test_a_name_with_a_nul_is_refused_naming_its_field(
    spec: type[Any], value: dict[str, Any], field: str
) -> None:
    _refused(field, lambda: decode(_body(value), spec))


def test_a_job_and_a_batch_name_the_field_and_the_job() -> None:
    _refused("kind", lambda: decode_job(_body({"kind": f"a{NUL}"})))
    jobs = [{"kind": "a", "args": {"x": NUL}}, {"kind": "b", "idempotency_key": None},
            {"kind": f"c{NUL}"}]  # fmt: skip
    _refused("jobs[2].kind", lambda: decode_batch(_body({"jobs": jobs})))


def test_a_schedules_kind_cron_and_zone_are_names() -> None:
    base = {"every_s": 60, "kind": "a"}
    _refused("kind", lambda: decode_schedule(_body({**base, "kind": f"a{NUL}"})))
    _refused("tz", lambda: decode_schedule(_body({**base, "tz": f"UTC{NUL}"})))


def test_json_values_and_a_workers_own_words_keep_their_nul() -> None:
    args = {f"k{NUL}": [NUL, {NUL: NUL}]}
    assert decode_job(_body({"kind": "a", "args": args})).args == args
    [job] = decode_batch(_body({"jobs": [{"kind": "a", "args": args}]})).jobs
    assert job.args == args
    said = [{"token": "t1", "complete": {"result": NUL}},
            {"token": "t2", "checkpoint": {"data": {NUL: NUL}}},
            {"token": "t3", "fail": {"error": f"boom{NUL}"}}]  # fmt: skip
    got = decode(_body({"outcomes": said}), OutcomesRequest)
    assert [o.what() for o in got.outcomes][2].error == f"boom{NUL}"  # cleaned where stored
    beat = decode(_body({"items": [{"token": "t", "progress": {"message": NUL}}]}),
                  HeartbeatRequest)  # fmt: skip
    progress = beat.items[0].progress
    assert progress is not None
    assert progress.message == NUL


def test_an_escaped_backslash_before_u0000_is_no_nul() -> None:
    assert decode_job(b'{"kind": "a\\\\u0000"}').kind == "a\\u0000"


@pytest.mark.parametrize("name", ["state", "kind", "queue", "schedule", "after", "limit"])
def test_a_query_parameter_with_a_nul_is_refused_naming_it(name: str) -> None:
    _refused(name, lambda: query.job_query({name: f"a{NUL}"}))


def test_wait_with_a_nul_is_refused_naming_it() -> None:
    _refused("wait", lambda: query.wait_seconds({"wait": f"1{NUL}"}))
