"""The API against its own OpenAPI document, with schemathesis: no 5xx, and every
response matches the schema (status, content type, body), against a real server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis

# Imported here, at collection, not lazily inside the test: CPython 3.11 compiles a module
# with "AST constructor recursion depth mismatch" after another test in this process hit a
# RecursionError (the depth-limit tests make them on purpose), and schemathesis loads
# these modules on first use.
import schemathesis.specs.openapi.schemas
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.result import Err

from sqlq.bench.client.server import ServerProcess
from sqlq.http.openapi import OPS, document
from tests.helpers import spawn_server

# Requests per operation: the fast tier, and the slow one; hypothesis shrinks any failure
# to a minimal request.
FAST_EXAMPLES = 12
SLOW_EXAMPLES = 60
# No 5xx; every status, content type, header and body as documented; and what the
# schema forbids is refused. Not "everything the schema allows is accepted": a job's
# kind and its arguments are checked against the server's registry, not the document.
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    srv = spawn_server("--store", "memory", "--workers", "2")
    srv.wait_ready()
    yield srv
    srv.stop()


def test_the_document_is_openapi_3_1_from_the_validating_types(server: ServerProcess) -> None:
    doc = httpx.get(server.url + "/openapi.json").json()
    assert doc["openapi"] == "3.1.0"
    job_spec = doc["components"]["schemas"]["JobSpec"]
    assert job_spec["properties"]["kind"]["maxLength"] == 128  # the decoder's own bound
    assert set(doc["paths"]) >= {"/jobs", "/jobs/{job_id}", "/queues", "/metrics"}


def test_the_document_shows_a_running_jobs_fields_and_the_cancels() -> None:
    from sqlq.http.app import FORCE

    doc = document("x")
    schemas = doc["components"]["schemas"]
    job = schemas["JobView"]["properties"]
    assert {"attempts_total", "cancel_requested", "cancel_requested_at", "progress",
            "checkpoint", "snoozes", "errors", "schedule", "tick"} <= set(job)  # fmt: skip
    assert "request_hash" not in job
    assert set(schemas["Progress"]["properties"]) == {"percent", "message", "at"}
    assert set(schemas["AttemptError"]["properties"]) == {"attempt", "error", "at", "traceback"}
    delete = doc["paths"]["/jobs/{job_id}"]["delete"]
    assert {"200", "202", "404", "409", "422"} <= set(delete["responses"])
    [force] = [p for p in delete["parameters"] if p["name"] == "force"]
    assert set(force["schema"]["enum"]) == set(FORCE)  # exactly what the route takes
    bulk = doc["paths"]["/jobs/cancel"]["post"]
    assert bulk["requestBody"]["required"] is True
    assert set(schemas["CancelCounts"]["properties"]) == {"cancelled", "requested"}
    assert schemas["CancelSpec"]["properties"]["state"]


def test_every_operation_answers_as_documented(server: ServerProcess) -> None:
    check_every_operation(server, FAST_EXAMPLES)


@pytest.mark.slow
def test_every_operation_answers_as_documented_at_length(server: ServerProcess) -> None:
    check_every_operation(server, SLOW_EXAMPLES)


def check_every_operation(server: ServerProcess, examples: int) -> None:
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    checked = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):  # the document has an operation schemathesis can't read
            raise result.err()
        operation = result.ok()

        @settings(
            max_examples=examples,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        @given(case=operation.as_strategy())
        def check(case: schemathesis.Case[Any]) -> None:
            case.call_and_validate(checks=CHECKS)

        check()
        checked.append(f"{operation.method.upper()} {operation.path}")
    # schemathesis leaves out the path the document itself is served from
    documented = {f"{op.method.upper()} {op.path}" for op in OPS} - {"GET /openapi.json"}
    assert set(checked) == documented, documented - set(checked)
    assert httpx.get(server.url + "/readyz").status_code == 200  # still serving


def test_the_protocols_answers_match_the_document_when_jobs_flow() -> None:
    """The fuzzing above meets /claims' refusals (its queues are never remote); here a
    real claim, heartbeat, outcome, stale outcome, /workers and /queues of a remote
    queue each answer as documented, body and status."""
    srv = spawn_server("--store", "memory", "--remote-queue", "mail")
    try:
        srv.wait_ready()
        schema = schemathesis.openapi.from_url(srv.url + "/openapi.json")

        def call(method: str, path: str, body: Any = None) -> httpx.Response:
            operation = schema[path][method]
            case = operation.Case(body=body) if body is not None else operation.Case()
            response = case.call()
            case.validate_response(response, checks=CHECKS)
            return httpx.Response(response.status_code, content=response.content)

        assert call("POST", "/jobs", {"kind": "any.kind", "queue": "mail"}).status_code == 201
        assert call("GET", "/queues").json()["queues"][0]["remote"] is True
        [granted] = call("POST", "/claims", {"queues": ["mail"], "worker": "w"}).json()["claims"]
        token = granted["token"]
        beat = call("POST", "/claims/heartbeat", {"items": [{"token": token}, {"token": "x"}]})
        assert [b.get("error") for b in beat.json()["items"]] == [None, "invalid"]
        assert call("POST", "/claims/checkpoint", {"token": token, "data": [1]}).status_code == 200
        assert call("GET", "/workers").json()["workers"][0]["held"] == 1
        assert call("POST", "/claims/complete", {"token": token, "result": 1}).status_code == 200
        assert call("POST", "/claims/release", {"token": token}).status_code == 409
        assert call("POST", "/claims/fail", {"token": "x"}).status_code == 422
        batch = call("POST", "/claims/outcomes", {"outcomes": [{"token": token, "release": {}}]})
        assert batch.json()["outcomes"][0]["error"] == "fenced"
        assert call("POST", "/claims", {"queues": ["mail"], "worker": "w", "wait_s": 0.1}
                    ).json() == {"claims": []}  # fmt: skip
    finally:
        srv.stop()
