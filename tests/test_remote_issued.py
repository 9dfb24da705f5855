"""``Issued``: the tokens a server signed, read back without their mac computed again. A
token found there says what ``verify`` would say of it; one not found (forgotten, signed
before a restart, another server's) is verified as ever; a forged one is never found."""

from __future__ import annotations

import pytest

from sqlq.common.clock import FakeClock
from sqlq.common.protocol import CompleteIn
from sqlq.common.tokens import KEY_BYTES, BadToken, sign, verify
from sqlq.runtime import remote as remote_module
from sqlq.runtime.remote import MAX_ISSUED, Issued
from tests.helpers import ServiceFactory, submit
from tests.remote_helpers import claim_one, remote_service, report

KEY = b"k" * KEY_BYTES


def test_a_token_signed_here_reads_back_as_verify_reads_it_and_a_forgery_never() -> None:
    issued = Issued()
    token = issued.sign(KEY, "0" * 32, 3, 12.345)
    assert token == sign(KEY, "0" * 32, 3, 12.345)
    assert issued.read(KEY, token) == verify(KEY, token)
    forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    with pytest.raises(BadToken):
        issued.read(KEY, forged)
    issued.forget(token)
    assert len(issued) == 0
    assert issued.read(KEY, token) == verify(KEY, token)  # forgotten: verified as ever
    with pytest.raises(BadToken):
        issued.read(b"x" * KEY_BYTES, sign(KEY, "0" * 32, 3, 1.0))  # another key's


def test_it_holds_at_most_max_issued_tokens() -> None:
    issued = Issued()
    for i in range(MAX_ISSUED + 5):
        issued.sign(KEY, f"{i:032x}", 1, 30.0)
    assert len(issued) <= MAX_ISSUED
    old = sign(KEY, f"{0:032x}", 1, 30.0)  # forgotten at the bound: still good
    assert issued.read(KEY, old).job_id == f"{0:032x}"


async def test_an_outcome_reads_its_token_without_verify_and_forgets_it(
    fake_clock: FakeClock, services: ServiceFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = await remote_service(services, fake_clock)
    await submit(rt, "resize", queue="r")
    g = await claim_one(rt)
    verified: list[str] = []

    def counted(key: bytes, token: str) -> object:
        verified.append(token)
        return verify(key, token)

    monkeypatch.setattr(remote_module, "verify", counted)
    assert (await report(rt, g.token, CompleteIn(result=1))).state == "completed"
    assert verified == []  # found among the tokens signed here
    again = await report(rt, g.token, CompleteIn(result=1))
    assert again.error == "fenced"  # the job's fence, as ever
    assert verified == [g.token]  # forgotten once its job ended: verified again
