"""No NUL in a name, on a real PostgreSQL through the HTTP app: what used to reach the
database and fail there (a 500 for a claim's kinds, a 422 naming only ``body`` for a
job's kind) is refused at decode, naming the field; JSON values (args, a result) and a
worker's own words (a failure's error) still go through, as PostgreSQL stores them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from sqlq.engines.postgres.store import PostgresStore
from sqlq.http.app import create_app
from tests.helpers import ServiceFactory

NUL = "\x00"


@pytest.fixture
async def client(services: ServiceFactory, pg_db: str) -> AsyncIterator[httpx.AsyncClient]:
    """The API over PostgreSQL, the queue ``mail`` served by remote workers."""
    rt = services(PostgresStore(pg_db), workers=0, remote_queues=frozenset({"mail"}))
    await rt.start()
    app = create_app(rt, start_runtime=False, ui=None)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
        yield c


def _refused(r: httpx.Response, field: str) -> None:
    assert (r.status_code, r.json()["error"], r.json()["field"]) == (422, "invalid", field), r.text


async def test_a_claims_kinds_with_a_nul_is_422_naming_it(client: httpx.AsyncClient) -> None:
    claim = {"queues": ["mail"], "worker": "box-1"}
    _refused(await client.post("/claims", json={**claim, "kinds": [NUL]}), "kinds[0]")
    _refused(await client.post("/claims", json={**claim, "kinds": ["a", f"b{NUL}"]}), "kinds[1]")
    r = await client.post("/claims", json={**claim, "kinds": ["a"]})
    assert (r.status_code, r.json()["claims"]) == (200, [])


async def test_a_jobs_names_with_a_nul_are_422_and_its_args_keep_theirs(
    client: httpx.AsyncClient,
) -> None:
    _refused(await client.post("/jobs", json={"kind": f"a{NUL}", "queue": "mail"}), "kind")
    _refused(await client.post("/jobs", json={"kind": "a", "queue": f"mail{NUL}"}), "queue")
    jobs = [{"kind": "a", "queue": "mail"}, {"kind": NUL, "queue": "mail"}]
    _refused(await client.post("/jobs/batch", json={"jobs": jobs}), "jobs[1].kind")
    _refused(await client.post("/jobs/retry", json={"kind": NUL}), "kind")
    _refused(await client.post("/jobs/cancel", json={"kind": NUL}), "kind")
    args: dict[str, Any] = {f"k{NUL}": [NUL, {NUL: f"v{NUL}"}]}
    r = await client.post("/jobs", json={"kind": "a", "queue": "mail", "args": args})
    assert r.status_code == 201, r.text
    stored = await client.get(f"/jobs/{r.json()['id']}")
    assert stored.json()["args"] == args  # as submitted: PostgreSQL holds args as JSON text


@pytest.mark.parametrize(
    "query", ["kind=a%00", "queue=mail%00", "schedule=s%00", "state=dead%00", "limit=1%00"]
)
async def test_a_query_parameter_with_a_nul_is_422_naming_it(
    client: httpx.AsyncClient, query: str
) -> None:
    _refused(await client.get(f"/jobs?{query}"), query.split("=")[0])


async def test_a_result_and_an_error_with_a_nul_are_stored(client: httpx.AsyncClient) -> None:
    for _ in range(2):
        r = await client.post("/jobs", json={"kind": "a", "queue": "mail"})
        assert r.status_code == 201, r.text
    r = await client.post("/claims", json={"queues": ["mail"], "worker": "box-1", "max": 2})
    done, failed = r.json()["claims"]
    boom = {"error": f"boom{NUL}", "retry": False}
    said = [{"token": done["token"], "complete": {"result": {NUL: NUL}}},
            {"token": failed["token"], "fail": boom}]  # fmt: skip
    r = await client.post("/claims/outcomes", json={"outcomes": said})
    assert [o.get("state") for o in r.json()["outcomes"]] == ["completed", "dead"], r.text
    assert (await client.get(f"/jobs/{done['job']['id']}")).json()["result"] == {NUL: NUL}
    dead = (await client.get(f"/jobs/{failed['job']['id']}")).json()
    assert dead["last_error"] == "boom\\x00"  # cleaned where stored (clean_error)
