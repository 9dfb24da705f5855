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


def test_show_lists_up_to_limit_jobs_page_after_page(server: ServerProcess) -> None:
    with Client(server.url) as client:
        sent = client.submit_workflow(
            [{"kind": "sleep", "ref": "root", "args": {"work_ms": 60_000}}]
            + [{"kind": "sleep", "depends_on": ["root"]} for _ in range(2_199)]
        )
        workflow_id = sent.workflow_id
        assert workflow_id is not None
        page = client.workflow(workflow_id, limit=3)
        assert [m.id for m in page.jobs] == sent.ids[:3]
        after = client.workflow(workflow_id, after=page.next, limit=3)
        assert [m.id for m in after.jobs] == sent.ids[3:6]
        code, out = run(server, "workflows", "show", workflow_id, "--limit", "1500", "--json")
        assert code == 0, out
        view = json.loads(out)
        assert [m["id"] for m in view["jobs"]] == sent.ids[:1_500]  # two pages: 1,000 + 500
        assert sum(view["counts"].values()) == 2_200
        assert view["next"] is not None
        code, out = run(server, "workflows", "show", workflow_id)
        assert code == 0, out
        lines = out.splitlines()
        assert len(lines) == 1 + 1 + 1_000 + 1  # its line, the header, 1,000 jobs, the note
        assert lines[-1] == "(the first 1,000 of 2,200 jobs: --limit shows more)"
        code, out = run(server, "workflows", "show", workflow_id, "--limit", "0")
        assert code == 2
        assert "--limit" in out
        client.cancel_workflow(workflow_id)
