"""``sqlq queues ...`` and the clients' policy calls against a real server (#37): the table,
--json, a policy and a key's override set and dropped, and errors as one-line messages
naming what was wrong, never a traceback."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from sqlq.bench.client.server import ServerProcess
from sqlq.client import Client
from sqlq.common.fair import KeyPolicy, Policy, Rate
from tests.helpers import run_cli, spawn_server


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    srv = spawn_server("--store", "memory", "--workers", "2",
                       "--queue-policy", 'api={"key_concurrency": 3}')  # fmt: skip
    srv.wait_ready()
    yield srv
    srv.stop()


run = run_cli  # (one home: tests/helpers.py)


def test_the_flags_policy_shows_and_the_cli_sets_one(server: ServerProcess) -> None:
    code, out = run(server, "queues", "list")
    assert code == 0
    assert '{"key_concurrency":3}' in out
    code, out = run(server, "queues", "policy", "mail", '{"rate": {"per_s": 10, "burst": 2}}',
                    "--json")  # fmt: skip
    assert code == 0, out
    assert json.loads(out)[0]["policy"] == {"rate": {"per_s": 10.0, "burst": 2}}
    code, out = run(server, "queues", "key", "mail", "big", '{"weight": 3}')
    assert (code, "big" in out) == (0, True)
    code, out = run(server, "queues", "key", "mail", "big", "--drop", "--json")
    assert "keys" not in json.loads(out)[0]["policy"]
    code, out = run(server, "queues", "policy", "mail", '{"rate": {"per_s": 0}}')
    assert code == 2
    assert "rate.per_s" in out
    code, out = run(server, "queues", "key", "mail", "big")
    assert code == 2
    code, out = run(server, "queues", "policy", "bad name", "{}")
    assert code == 1
    assert "(queue)" in out


def test_the_client_sets_a_policy_and_jobs_carry_their_keys(server: ServerProcess) -> None:
    with Client(server.url) as client:
        view = client.set_policy("reports", Policy(rate=Rate(per_s=5.0)))
        assert view.policy == Policy(rate=Rate(per_s=5.0))
        view = client.set_key_policy("reports", "t@1", KeyPolicy(key_concurrency=1))
        assert view.policy is not None
        assert view.policy.keys == {"t@1": KeyPolicy(key_concurrency=1)}
        assert client.set_key_policy("reports", "t@1", None).policy == Policy(rate=Rate(per_s=5.0))
        assert client.set_policy("reports", None).policy is None
        job = client.submit("sleep", {"work_ms": 1}, queue="api", key="tenant-9", weight=2)
        assert (job.key, job.weight) == ("tenant-9", 2)
