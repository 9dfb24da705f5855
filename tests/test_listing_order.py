"""GET /jobs newest first: the ``order`` parameter, checked like every other (a 422 naming
it), paged by the cursor in either order, and described by the OpenAPI document. The
engines' own pages in both orders are the contract suite's (test_store_listing)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from sqlq.common.errors import ValidationError
from sqlq.common.query import job_query
from sqlq.http.openapi import document
from tests.app_helpers import app_clients


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async for make in app_clients(workers=0):
        yield await make()


def test_order_is_asc_by_default_desc_on_request_and_nothing_else() -> None:
    assert job_query({}).descending is False
    assert job_query({"order": "asc"}).descending is False
    assert job_query({"order": "desc"}).descending is True
    for bad in ("DESC", "newest", "", "desc\x00"):
        with pytest.raises(ValidationError) as caught:
            job_query({"order": bad})
        assert caught.value.field == "order"


async def _ids(client: httpx.AsyncClient, limit: int, **params: str) -> list[str]:
    """Every id, paged ``limit`` at a time through ``next``."""
    got: list[str] = []
    query: dict[str, str | int] = {**params, "limit": limit}
    while True:
        r = await client.get("/jobs", params=query)
        assert r.status_code == 200, r.text
        body = r.json()
        got += [j["id"] for j in body["jobs"]]
        if body["next"] is None:
            return got
        query["after"] = body["next"]


async def test_pages_newest_first_through_the_cursor(client: httpx.AsyncClient) -> None:
    r = await client.post("/jobs/batch", json={"jobs": [{"kind": "sleep"}] * 7})
    ids = r.json()["ids"]
    oldest_first = await _ids(client, 3)
    assert oldest_first == sorted(ids)
    assert await _ids(client, 3, order="desc") == sorted(ids, reverse=True)
    assert await _ids(client, 7, order="desc") == sorted(ids, reverse=True)  # a full last page
    newest = (await client.get("/jobs", params={"order": "desc", "limit": 1})).json()
    assert newest["jobs"][0]["id"] == max(ids)


async def test_a_bad_order_is_a_422_naming_it(client: httpx.AsyncClient) -> None:
    r = await client.get("/jobs", params={"order": "newest"})
    assert r.status_code == 422
    assert r.json()["field"] == "order"


def test_the_document_describes_order() -> None:
    params = {p["name"]: p for p in document("test")["paths"]["/jobs"]["get"]["parameters"]}
    assert params["order"]["in"] == "query"
    assert params["order"]["schema"]["enum"] == ["asc", "desc"]
    assert "newest" in params["order"]["description"]
