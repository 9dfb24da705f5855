"""``sqlq workflows ...`` against a real server: the table, --json, cancel and retry, and
errors as one-line messages naming what was wrong, never a traceback."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from sqlq.bench.client.server import ServerProcess
from sqlq.client import Client
from tests.helpers import run_cli, spawn_server


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    srv = spawn_server("--store", "memory", "--workers", "2", "--fault-injection")
    srv.wait_ready()
    yield srv
    srv.stop()


run = run_cli  # (one home: tests/helpers.py)


def test_show_cancel_and_retry(server: ServerProcess) -> None:
    with Client(server.url) as client:
        sent = client.submit_workflow([
            {"kind": "sleep", "ref": "a", "args": {"fail_prob": 1}, "max_attempts": 1},
            {"kind": "sleep", "ref": "b", "depends_on": ["a"]},
        ])  # fmt: skip
        workflow_id = sent.workflow_id
        assert workflow_id is not None
        client.wait(sent.ids[0], 30)
        client.wait(sent.ids[1], 30)
        more = client.submit_workflow(
            [{"kind": "sleep", "depends_on": [sent.ids[0]], "on_parent_failure": "run"}],
            workflow=workflow_id,
        )
        assert more.workflow_id == workflow_id  # (added: it runs after a, dead or not)
        assert client.wait(more.ids[0], 30).state.value == "completed"
    code, out = run(server, "workflows", "show", workflow_id)
    assert code == 0, out
    first, header, a, b, _ = out.splitlines()
    assert first.startswith(f"workflow {workflow_id}: failed (1 cancelled, 1 completed, 1 dead)")
    assert header.split() == ["ref", "id", "kind", "state", "waits_for", "cancel_reason"]
    assert a.split()[0::3] == ["a", "dead"]
    assert b.split()[3:] == ["cancelled", "upstream_dead"]
    code, out = run(server, "workflows", "show", workflow_id, "--json")
    assert (code, json.loads(out)["state"]) == (0, "failed")
    code, out = run(server, "workflows", "retry", workflow_id, "--json")
    assert (code, json.loads(out)) == (0, {"retried": 1})
    code, out = run(server, "workflows", "cancel", workflow_id)
    assert code == 0, out
    assert out.startswith("cancelled ")
    code, out = run(server, "workflows", "show", "0" * 32)
    assert code == 1
    assert "0" * 32 in out
    code, out = run(server, "workflows", "show", "nope")
    assert code == 2
    assert "WORKFLOW_ID" in out
