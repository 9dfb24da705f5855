"""The dashboard's gate under attack: guessing from one address, crafted cookies."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette

from sqlq.common.engine.memory import MemoryStore
from sqlq.http.app import create_app
from sqlq.http.guard import Security
from sqlq.runtime.config import RuntimeConfig
from sqlq.runtime.service import Service
from sqlq.ui.session import COOKIE, MAX_FAILURES, Sessions

TOKEN = "t0ken-for-the-ui-gate"


@pytest.fixture
async def app() -> AsyncIterator[Starlette]:
    rt = Service(MemoryStore(), RuntimeConfig(workers=1))
    await rt.start()
    yield create_app(rt, start_runtime=False, security=Security(token=TOKEN))
    await rt.stop(0)


def _client(app: Starlette, address: str) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=(address, 4711), raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://localhost")


async def _login(c: httpx.AsyncClient, token: str) -> int:
    page = (await c.get("/ui/login")).text
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found
    r = await c.post("/ui/login", data={"token": token, "csrf": found.group(1)})
    return r.status_code


async def test_one_address_guessing_does_not_lock_out_the_others(app: Starlette) -> None:
    async with _client(app, "192.0.2.1") as guesser, _client(app, "192.0.2.2") as owner:
        codes = [await _login(guesser, f"guess-{i}") for i in range(MAX_FAILURES + 1)]
        assert codes == [401] * MAX_FAILURES + [429]
        assert await _login(guesser, TOKEN) == 429  # that address waits out the minute
        assert await _login(owner, TOKEN) == 303  # the right token from elsewhere still works


@pytest.mark.parametrize(
    "cookie",
    [
        "²." + "0" * 64,  # isdigit() says yes, int() says no
        "9" * 5000 + "." + "0" * 64,  # past int()'s 4,300 digits
        "1" * 13 + "." + "0" * 64,
        "¹²³." + "0" * 64,
        "99999999999." + "ÿ" * 64,
        "1.2.3",
        ".",
        "x" * 4000,
    ],
)
async def test_a_crafted_cookie_is_no_session_and_no_500(app: Starlette, cookie: str) -> None:
    async with _client(app, "192.0.2.3") as c:
        # As a client may send it: raw bytes, which the server reads as latin-1.
        r = await c.get("/ui/", headers=[(b"cookie", f"{COOKIE}={cookie}".encode("latin-1"))])
        assert r.status_code == 303, r.text[:300]
        assert r.headers["location"].startswith("/ui/login")
    assert not Sessions(TOKEN).valid(cookie)
