"""A heartbeat names each token once: a second of the same is a 422 naming it, refused at
decode (``check_heartbeat``), before the runtime is asked for anything, so one request
can no longer make a thousand writes of one lease."""

from __future__ import annotations

import pytest

from sqlq.common.errors import ValidationError
from sqlq.common.protocol import MAX_ITEMS, BeatItem, HeartbeatRequest, check_heartbeat
from tests.remote_http_helpers import Make, auth, security, served

__all__ = ["served"]  # the fixture, by its name


async def test_a_token_named_twice_is_422_and_the_runtime_never_hears_of_it(
    served: Make,
) -> None:
    s = await served(security())
    items = [{"token": "a1"}, {"token": "b2"}, {"token": "a1", "progress": {"percent": 5}}]
    r = await s.client.post("/claims/heartbeat", json={"items": items}, headers=auth("w-mail"))
    assert r.status_code == 422, r.text
    assert (r.json()["error"], r.json()["field"]) == ("invalid", "items[2].token")
    assert "items[0]" in r.json()["message"]
    assert s.remote.calls == []
    one = [{"token": "a1"}] * MAX_ITEMS  # the finding: one token 1,000 times
    r = await s.client.post("/claims/heartbeat", json={"items": one}, headers=auth("w-mail"))
    assert (r.status_code, r.json()["field"]) == (422, "items[1].token")
    assert s.remote.calls == []
    distinct = [{"token": "a1"}, {"token": "b2"}]
    r = await s.client.post("/claims/heartbeat", json={"items": distinct}, headers=auth("w-mail"))
    assert r.status_code == 200, r.text
    [(what, req, _)] = s.remote.calls
    assert (what, [i.token for i in req.items]) == ("heartbeat", ["a1", "b2"])


def test_the_rule_names_the_second_of_a_token() -> None:
    beats = [BeatItem(token="t"), BeatItem(token="u"), BeatItem(token="t")]
    with pytest.raises(ValidationError) as refused:
        check_heartbeat(HeartbeatRequest(items=beats))
    assert refused.value.field == "items[2].token"
    once = HeartbeatRequest(items=beats[:2])
    assert check_heartbeat(once) is once
