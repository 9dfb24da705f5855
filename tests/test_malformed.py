"""Malformed requests against one real ``sqlq serve``: every one a 4xx JSON answer.

The cases reach the application (protocol-level garbage is answered by uvicorn
itself, in plain text, before sqlq sees it). The last test checks the server is
still serving and logged no traceback. Error messages must name what was wrong
(``field``) and must not echo more than about 200 characters of the input.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sqlq.bench.client.server import ServerProcess
from tests.helpers import serve_tasks

J = {"content-type": "application/json"}
ECHO_TASKS = "from sqlq import task\n\n\n@task()\ndef echo(args):\n    return args\n"
YEAR_AND_A_MONTH = 400 * 86400


def raw(value: Any) -> bytes:
    return json.dumps(value).encode()


def nested(depth: int, open_: bytes = b"[", close: bytes = b"]") -> bytes:
    return b'{"kind":"sleep","args":{"a":' + open_ * depth + close * depth + b"}}"


def nested_objects(depth: int) -> bytes:
    return b'{"kind":"sleep","args":' + b'{"a":' * depth + b"1" + b"}" * depth + b"}"


def echo_nested(depth: int) -> bytes:
    """An ``echo`` job (any JSON is its args) whose args nest ``depth`` levels in all."""
    return b'{"kind":"echo","args":{"a":' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}}"


def echo_batch(*jobs: bytes) -> bytes:
    return b'{"jobs":[' + b",".join(jobs) + b"]}"


# Small containers: 1 MiB of them would be ~22 MB of objects.
MANY_LISTS = b'{"kind":"echo","args":{"a":[' + b",".join([b"[]"] * 300_000) + b"]}}"
SOME_LISTS = b'{"kind":"echo","args":{"a":[' + b",".join([b"[]"] * 40_000) + b"]}}"


# (id, method, path, headers, body, status, field or None)
# fmt: off
CASES: list[tuple[str, str, str, dict[str, str], bytes, int, str | None]] = [
    ("unknown-kind", "POST", "/jobs", J, raw({"kind": "nope"}), 422, "kind"),
    ("missing-kind", "POST", "/jobs", J, raw({"args": {}}), 422, "kind"),
    ("empty-kind", "POST", "/jobs", J, raw({"kind": ""}), 422, "kind"),
    ("long-kind", "POST", "/jobs", J, raw({"kind": "k" * 129}), 422, "kind"),
    ("long-unicode-kind", "POST", "/jobs", J, raw({"kind": "\U0001f600" * 200}), 422, "kind"),
    ("kind-int", "POST", "/jobs", J, raw({"kind": 5}), 422, "kind"),
    ("kind-null", "POST", "/jobs", J, raw({"kind": None}), 422, "kind"),
    ("kind-list", "POST", "/jobs", J, raw({"kind": ["sleep"]}), 422, "kind"),
    ("work-ms-negative", "POST", "/jobs", J, raw({"kind": "sleep", "args": {"work_ms": -1}}), 422, "args.work_ms"),
    ("work-ms-string", "POST", "/jobs", J, raw({"kind": "sleep", "args": {"work_ms": "20"}}), 422, "args.work_ms"),
    ("work-ms-huge", "POST", "/jobs", J, raw({"kind": "sleep", "args": {"work_ms": 10**9}}), 422, "args.work_ms"),
    ("work-ms-float", "POST", "/jobs", J, raw({"kind": "sleep", "args": {"work_ms": 1.5}}), 422, "args.work_ms"),
    ("work-ms-bigint", "POST", "/jobs", J, raw({"kind": "sleep", "args": {"work_ms": 10**30}}), 422, "args.work_ms"),
    ("fail-prob-off", "POST", "/jobs", J, raw({"kind": "sleep", "args": {"fail_prob": 0.5}}), 422, "args.fail_prob"),
    ("hang-prob-off", "POST", "/jobs", J, raw({"kind": "sleep", "args": {"hang_prob": 1}}), 422, "args.hang_prob"),
    ("fail-prob-range", "POST", "/jobs", J, raw({"kind": "sleep", "args": {"fail_prob": 1.5}}), 422, "args.fail_prob"),
    ("args-unknown-key", "POST", "/jobs", J, raw({"kind": "sleep", "args": {"bogus": 1}}), 422, "args"),
    ("args-list", "POST", "/jobs", J, raw({"kind": "sleep", "args": []}), 422, "args"),
    ("args-string", "POST", "/jobs", J, raw({"kind": "sleep", "args": "x"}), 422, "args"),
    ("args-null", "POST", "/jobs", J, raw({"kind": "sleep", "args": None}), 422, "args"),
    ("args-deep-legal", "POST", "/jobs", J, nested(100), 422, "args"),
    ("cpu-rounds-zero", "POST", "/jobs", J, raw({"kind": "cpu", "args": {"rounds": 0}}), 422, "args.rounds"),
    ("cpu-rounds-missing", "POST", "/jobs", J, raw({"kind": "cpu", "args": {}}), 422, "args.rounds"),
    ("cpu-rounds-string", "POST", "/jobs", J, raw({"kind": "cpu", "args": {"rounds": "many"}}), 422, "args.rounds"),
    ("cpu-rounds-huge", "POST", "/jobs", J, raw({"kind": "cpu", "args": {"rounds": 10**12}}), 422, "args.rounds"),
    ("cpu-seed-int", "POST", "/jobs", J, raw({"kind": "cpu", "args": {"rounds": 1, "seed": 5}}), 422, "args.seed"),
    ("max-attempts-zero", "POST", "/jobs", J, raw({"kind": "sleep", "max_attempts": 0}), 422, "max_attempts"),
    ("max-attempts-huge", "POST", "/jobs", J, raw({"kind": "sleep", "max_attempts": 1001}), 422, "max_attempts"),
    ("max-attempts-string", "POST", "/jobs", J, raw({"kind": "sleep", "max_attempts": "3"}), 422, "max_attempts"),
    ("delay-negative", "POST", "/jobs", J, raw({"kind": "sleep", "delay_ms": -5}), 422, "delay_ms"),
    ("delay-huge", "POST", "/jobs", J, raw({"kind": "sleep", "delay_ms": 10**13}), 422, "delay_ms"),
    ("delay-float", "POST", "/jobs", J, raw({"kind": "sleep", "delay_ms": 1.5}), 422, "delay_ms"),
    ("delay-and-run-at", "POST", "/jobs", J, raw({"kind": "sleep", "delay_ms": 5, "run_at": 1.0}), 422, "run_at"),
    ("run-at-negative", "POST", "/jobs", J, raw({"kind": "sleep", "run_at": -1}), 422, "run_at"),
    ("run-at-far", "POST", "/jobs", J, raw({"kind": "sleep", "run_at": 1e12}), 422, "run_at"),
    ("run-at-string", "POST", "/jobs", J, raw({"kind": "sleep", "run_at": "tomorrow"}), 422, "run_at"),
    ("run-at-next-year", "POST", "/jobs", J, raw({"kind": "sleep", "run_at": time.time() + YEAR_AND_A_MONTH}), 422, "run_at"),
    ("run-at-overflow", "POST", "/jobs", J, b'{"kind":"sleep","run_at":1e999}', 422, "run_at"),
    ("priority-huge", "POST", "/jobs", J, raw({"kind": "sleep", "priority": 10**7}), 422, "priority"),
    ("priority-string", "POST", "/jobs", J, raw({"kind": "sleep", "priority": "high"}), 422, "priority"),
    ("unknown-field", "POST", "/jobs", J, raw({"kind": "sleep", "surprise": True}), 422, "body"),
    ("body-list", "POST", "/jobs", J, raw([1, 2]), 422, "body"),
    ("body-string", "POST", "/jobs", J, raw("sleep"), 422, "body"),
    ("body-number", "POST", "/jobs", J, raw(42), 422, "body"),
    ("body-null", "POST", "/jobs", J, raw(None), 422, "body"),
    ("batch-empty", "POST", "/jobs/batch", J, raw({"jobs": []}), 422, "jobs"),
    ("batch-not-list", "POST", "/jobs/batch", J, raw({"jobs": "x"}), 422, "jobs"),
    ("batch-missing", "POST", "/jobs/batch", J, raw({}), 422, "jobs"),
    ("batch-bad-kind", "POST", "/jobs/batch", J, raw({"jobs": [{"kind": "nope"}]}), 422, "jobs[0].kind"),
    ("batch-second-bad", "POST", "/jobs/batch", J, raw({"jobs": [{"kind": "sleep"}, {"kind": "cpu", "args": {"rounds": 0}}]}), 422, "jobs[1].args.rounds"),
    ("batch-nested-arg", "POST", "/jobs/batch", J, raw({"jobs": [{"kind": "sleep", "args": {"work_ms": -1}}]}), 422, "jobs[0].args.work_ms"),
    ("batch-too-many", "POST", "/jobs/batch", J, raw({"jobs": [{"kind": "sleep"}] * 10_001}), 422, "jobs"),
    ("batch-item-int", "POST", "/jobs/batch", J, raw({"jobs": [1]}), 422, "jobs[0]"),
    ("batch-fault-off", "POST", "/jobs/batch", J, raw({"jobs": [{"kind": "sleep", "args": {"hang_prob": 0.1}}]}), 422, "jobs[0].args.hang_prob"),
    ("not-json", "POST", "/jobs", J, b"{not json", 400, "body"),
    ("empty-body", "POST", "/jobs", J, b"", 400, "body"),
    ("truncated", "POST", "/jobs", J, b'{"kind": "sleep"', 400, "body"),
    ("trailing-garbage", "POST", "/jobs", J, b'{"kind":"sleep"}garbage', 400, "body"),
    ("invalid-utf8", "POST", "/jobs", J, b'{"kind":"\xff\xfe"}', 400, "body"),
    ("nan-literal", "POST", "/jobs", J, b"NaN", 400, "body"),
    ("form-as-json", "POST", "/jobs", J, b"kind=sleep&args=1", 400, "body"),
    ("nested-5000-lists", "POST", "/jobs", J, nested(5000), 400, "body"),
    ("nested-100000-lists", "POST", "/jobs", J, nested(100_000), 400, "body"),
    ("nested-5000-objects", "POST", "/jobs", J, nested_objects(5000), 400, "body"),
    ("batch-nested", "POST", "/jobs/batch", J, b'{"jobs":' + b"[" * 5000 + b"]" * 5000 + b"}", 422, "jobs[0]"),
    ("lone-surrogate-escape", "POST", "/jobs", J, b'{"kind":"\\udcff"}', 400, "body"),
    ("too-large", "POST", "/jobs", J, b'{"kind":"sleep","args":{"x":"' + b"a" * (2 << 20) + b'"}}', 413, "body"),
    ("text-plain", "POST", "/jobs", {"content-type": "text/plain"}, raw({"kind": "sleep"}), 415, "content-type"),
    ("form-type", "POST", "/jobs", {"content-type": "application/x-www-form-urlencoded"}, b"kind=sleep", 415, "content-type"),
    ("multipart", "POST", "/jobs/batch", {"content-type": "multipart/form-data; boundary=x"}, b"--x--", 415, "content-type"),
    ("no-content-type", "POST", "/jobs", {}, raw({"kind": "sleep"}), 415, "content-type"),
    ("json-lookalike", "POST", "/jobs", {"content-type": "application/jsonx"}, raw({"kind": "sleep"}), 415, "content-type"),
    ("foreign-host", "POST", "/jobs", {**J, "host": "evil.example"}, raw({"kind": "sleep"}), 421, "host"),
    ("rebinding-host", "GET", "/stats", {"host": "127.0.0.1.evil.example:8080"}, b"", 421, "host"),
    ("cross-origin", "POST", "/jobs", {**J, "origin": "https://evil.example"}, raw({"kind": "sleep"}), 403, "origin"),
    ("null-origin", "DELETE", "/jobs/abc", {"origin": "null"}, b"", 403, "origin"),
    ("unknown-id", "GET", "/jobs/nope", {}, b"", 404, None),
    ("long-id", "GET", "/jobs/" + "a" * 5000, {}, b"", 404, None),
    ("cancel-unknown", "DELETE", "/jobs/nope", {}, b"", 404, None),
    ("unknown-route", "GET", "/nowhere", {}, b"", 404, None),
    ("put-jobs", "PUT", "/jobs", J, raw({"kind": "sleep"}), 405, None),
    ("patch-job", "PATCH", "/jobs/abc", J, raw({}), 405, None),
    ("get-batch", "GET", "/jobs/batch", {}, b"", 404, None),
    ("post-stats", "POST", "/stats", J, raw({}), 405, None),
    ("delete-healthz", "DELETE", "/healthz", {}, b"", 405, None),
    ("args-nested-972", "POST", "/jobs", J, echo_nested(972), 422, "args"),
    ("args-nested-65", "POST", "/jobs", J, echo_nested(65), 422, "args"),
    ("args-300k-lists", "POST", "/jobs", J, MANY_LISTS, 422, "args"),
    ("batch-args-nested", "POST", "/jobs/batch", J, echo_batch(*[echo_nested(2)] * 3, echo_nested(500)), 422, "jobs[3].args"),
    ("batch-args-nested-65", "POST", "/jobs/batch", J, echo_batch(echo_nested(65)), 422, "jobs[0].args"),
    ("batch-values-total", "POST", "/jobs/batch", J, echo_batch(*[SOME_LISTS] * 8), 422, "jobs"),
    ("batch-args-300k-lists", "POST", "/jobs/batch", J, echo_batch(MANY_LISTS), 422, "jobs[0].args"),
    ("batch-args-not-object", "POST", "/jobs/batch", J, raw({"jobs": [{"kind": "echo", "args": [1]}]}), 422, "jobs[0].args"),
    ("batch-args-null", "POST", "/jobs/batch", J, raw({"jobs": [{"kind": "echo", "args": None}]}), 422, "jobs[0].args"),
    ("header-40k", "GET", "/stats", {"x-filler": "a" * (40 << 10)}, b"", 431, "headers"),
    ("unknown-key-100k", "POST", "/jobs", J, raw({"kind": "sleep", "k" * 100_000: 1}), 422, "body"),
    ("unknown-param-100k", "GET", "/jobs?" + "p" * 20_000 + "=1", {}, b"", 422, None),
    ("unknown-kind-100k", "POST", "/jobs/batch", J, raw({"jobs": [{"kind": "k" * 100}, {"kind": "k" * 128}]}), 422, "jobs[0].kind"),
    ("limit-superscript", "GET", "/jobs?limit=%C2%B2", {}, b"", 422, "limit"),
    ("limit-5000-digits", "GET", "/jobs?limit=" + "1" * 5000, {}, b"", 422, "limit"),
    ("limit-arabic-digits", "GET", "/jobs?limit=%D9%A3", {}, b"", 422, "limit"),
    ("queue-newline", "POST", "/jobs", J, raw({"kind": "sleep", "queue": "default\n"}), 422, "queue"),
    ("queue-param-newline", "GET", "/jobs?queue=default%0A", {}, b"", 422, "queue"),
    ("pause-newline", "POST", "/queues/default%0A/pause", {}, b"", 422, "queue"),
    ("batch-key-newline", "POST", "/jobs/batch", J, raw({"jobs": [{"kind": "sleep", "idempotency_key": "k\n"}]}), 422, "jobs[0].idempotency_key"),
    ("retry-queue-newline", "POST", "/jobs/retry", J, raw({"queue": "default\n"}), 422, "queue"),
    ("cancel-force-yes", "DELETE", "/jobs/" + "a" * 32 + "?force=yes", {}, b"", 422, "force"),
    ("cancel-force-twice", "DELETE", "/jobs/" + "a" * 32 + "?force=1&force=1", {}, b"", 422, "force"),
    ("cancel-bulk-no-body", "POST", "/jobs/cancel", J, b"", 422, "body"),
    ("cancel-bulk-dead", "POST", "/jobs/cancel", J, raw({"state": "dead"}), 422, "state"),
    ("cancel-bulk-queue-newline", "POST", "/jobs/cancel", J, raw({"queue": "default\n"}), 422, "queue"),
    ("cancel-bulk-form", "POST", "/jobs/cancel", {"content-type": "application/x-www-form-urlencoded"}, b"state=running", 415, "content-type"),
    ("job-id-nul", "GET", "/jobs/%00", {}, b"", 404, None),
    ("job-id-31-hex", "GET", "/jobs/" + "a" * 31, {}, b"", 404, None),
    ("job-id-upper-hex", "DELETE", "/jobs/" + "A" * 32, {}, b"", 404, None),
    ("retry-id-not-hex", "POST", "/jobs/" + "z" * 32 + "/retry", {}, b"", 404, None),
    ("kind-filter-nul", "GET", "/jobs?kind=a%00b", {}, b"", 422, "kind"),
    ("cursor-newline", "GET", "/jobs?after=" + "YWFh" + "Cg", {}, b"", 422, "after"),
    ("batch-args-over-1mib", "POST", "/jobs/batch", J, echo_batch(b'{"kind":"echo","args":{"a":"' + b"x" * (3 << 19) + b'"}}'), 422, "jobs[0].args"),
]
# fmt: on


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = serve_tasks(tmp_path_factory, "echotasks", ECHO_TASKS)
    yield srv
    srv.stop()


def test_there_are_at_least_sixty_distinct_cases() -> None:
    assert len({c[0] for c in CASES}) == len(CASES) >= 60


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "status", "field"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_malformed_request_gets_a_4xx_json_answer(
    server: ServerProcess,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes,
    status: int,
    field: str | None,
) -> None:
    r = httpx.request(method, server.url + path, headers=headers, content=body, timeout=30)
    assert r.status_code == status, r.text[:500]
    assert r.headers["content-type"].startswith("application/json")
    answer = r.json()
    assert answer["error"]
    assert answer["message"]
    if field is not None:
        assert answer["field"] == field, answer
    assert len(r.content) < 1024, "an error must not echo the input back"


def test_a_content_length_that_lies_is_413_before_any_body_arrives(server: ServerProcess) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(
            b"POST /jobs HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
            b"content-length: 1000000000000\r\n\r\n{"
        )
        answer = b""
        while b'"}' not in answer:  # the JSON body ends the answer
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b'"field":"body"' in answer


def test_the_server_still_serves_after_every_case(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.url, timeout=10) as c:
        assert c.get("/readyz").status_code == 200
        assert c.get("/healthz").status_code == 200
        r = c.post("/jobs", json={"kind": "sleep", "args": {"work_ms": 1}})
        assert r.status_code == 201
        stats = c.get("/stats").json()
        assert stats["store"].get("failed") is None
        assert stats["submitted"] == 1  # none of the malformed requests made a job
    server.stop()
    assert "Traceback" not in server.output
    assert "internal error" not in server.output
